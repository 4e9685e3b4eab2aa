-- The time span of the capture's CPU-side records: every recorded CUDA runtime/driver call ({runtime}) and every
-- closed NVTX push/pop or start/end range ({nvtx}); each part is skipped (NULL) when its table is absent.
SELECT min(s), max(e) FROM (
  {runtime}
  UNION ALL
  {nvtx}
)

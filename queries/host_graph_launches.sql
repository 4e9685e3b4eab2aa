-- Every CUDA-graph launch call, for a capture without NVTX ranges (no enclosing range: -1).
SELECT r.globalTid, r.start, r."end", -1
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
JOIN StringIds AS s ON s.id = r.nameId
WHERE s.value LIKE 'cudaGraphLaunch%' OR s.value LIKE 'cuGraphLaunch%'
ORDER BY r.globalTid, r.start

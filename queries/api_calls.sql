-- CUDA runtime/driver calls that put work on a GPU or wait for it, with their kind: 0 graph launch, 1 kernel launch,
-- 2 memory copy/set, 3 synchronization (any version suffix); other calls are left out. In table order;
-- {row_range} bounds the rowids read (trace/reader.py blocks_by_rows: ranges fetched at once).
WITH kinds AS (
  SELECT id,
         CASE
           WHEN value LIKE 'cudaGraphLaunch%' OR value LIKE 'cuGraphLaunch%' THEN 0
           WHEN value LIKE 'cudaLaunch%Kernel%' OR value LIKE 'cuLaunch%Kernel%' THEN 1
           WHEN value LIKE 'cudaMemcpy%' OR value LIKE 'cudaMemset%'
                OR value LIKE 'cuMemcpy%' OR value LIKE 'cuMemset%' THEN 2
           WHEN value LIKE 'cuda%Synchronize%' OR value LIKE 'cu%Synchronize%' THEN 3
         END AS kind
  FROM StringIds
)
SELECT r.globalTid, r.start, r."end", k.kind
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
JOIN kinds AS k ON k.id = r.nameId
WHERE k.kind IS NOT NULL AND {row_range}
ORDER BY r.rowid

-- CUDA runtime/driver calls recorded, and how many of them launched a CUDA graph (any version suffix).
SELECT COUNT(*) AS calls,
       COALESCE(SUM(CASE WHEN r.nameId IN (SELECT id FROM StringIds
                                          WHERE value LIKE 'cudaGraphLaunch%' OR value LIKE 'cuGraphLaunch%')
                         THEN 1 ELSE 0 END), 0) AS graph_launches
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r

-- Every CUDA-graph launch call with the start of the innermost NVTX push/pop or start/end range on its thread that
-- encloses it (its step's host range in SGLang: step[DECODE ...]); -1 where no range encloses it.
SELECT r.globalTid, r.start, r."end",
       COALESCE((SELECT max(n.start) FROM NVTX_EVENTS AS n
                 WHERE n.globalTid = r.globalTid AND n.eventType IN (59, 60) AND n.start <= r.start
                   AND n."end" >= r."end"), -1)
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
JOIN StringIds AS s ON s.id = r.nameId
WHERE s.value LIKE 'cudaGraphLaunch%' OR s.value LIKE 'cuGraphLaunch%'
ORDER BY r.globalTid, r.start

-- Each cudaGraphLaunch / cuGraphLaunch call with the start of the first GPU work it launched and that work's
-- device: its replayed kernels under per-node graph tracing, its CUPTI_ACTIVITY_KIND_GRAPH_TRACE row under
-- graph-level tracing ({graph_trace}); -1 for both when the export holds neither. In call order. GPU work belongs
-- to a launch by correlationId within the launch's process (globalPid >> 24 = globalTid >> 24): each process
-- numbers its calls from 1, so two ranks' calls share ids.
WITH launch AS (
  SELECT r.start, r."end", r.globalTid, r.correlationId, r.globalTid >> 24 AS process
  FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
  WHERE r.nameId IN (SELECT id FROM StringIds WHERE value LIKE 'cudaGraphLaunch%' OR value LIKE 'cuGraphLaunch%')
), gpu AS (
  SELECT k.correlationId, k.globalPid >> 24 AS process, k.start, k.deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
  WHERE k.correlationId IN (SELECT correlationId FROM launch)
  {graph_trace}
), first AS (
  SELECT correlationId, process, MIN(start) AS start, MIN(deviceId) AS deviceId FROM gpu
  GROUP BY correlationId, process
)
SELECT l.start, l."end", COALESCE(l.globalTid, 0), COALESCE(f.start, -1), COALESCE(f.deviceId, -1)
FROM launch AS l LEFT JOIN first AS f ON f.correlationId = l.correlationId AND f.process = l.process
ORDER BY l.start

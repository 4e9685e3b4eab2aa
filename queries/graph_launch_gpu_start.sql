-- Each cudaGraphLaunch / cuGraphLaunch call with the start of the first GPU work it launched and that work's
-- device: its replayed kernels under per-node graph tracing, its CUPTI_ACTIVITY_KIND_GRAPH_TRACE row under
-- graph-level tracing ({graph_trace}); -1 for both when the export holds neither. In call order.
WITH launch AS (
  SELECT r.start, r."end", r.globalTid, r.correlationId
  FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
  WHERE r.nameId IN (SELECT id FROM StringIds WHERE value LIKE 'cudaGraphLaunch%' OR value LIKE 'cuGraphLaunch%')
), gpu AS (
  SELECT k.correlationId, k.start, k.deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
  WHERE k.correlationId IN (SELECT correlationId FROM launch)
  {graph_trace}
), first AS (
  SELECT correlationId, MIN(start) AS start, MIN(deviceId) AS deviceId FROM gpu GROUP BY correlationId
)
SELECT l.start, l."end", COALESCE(l.globalTid, 0), COALESCE(f.start, -1), COALESCE(f.deviceId, -1)
FROM launch AS l LEFT JOIN first AS f ON f.correlationId = l.correlationId
ORDER BY l.start

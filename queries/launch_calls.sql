-- The CUDA runtime/driver calls that put work on a GPU: only calls whose correlationId occurs in a GPU activity
-- table ({gpu_correlations} is a UNION of those tables' correlationId columns). A graph launch appears once,
-- and all nodes it replays carry its correlationId.
SELECT r.correlationId,
       r.globalTid,
       r.start,
       r."end",
       r.nameId
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
WHERE r.correlationId IN ({gpu_correlations})

-- The CUDA runtime/driver calls that put work on a GPU: only calls whose correlationId occurs in a GPU activity
-- table ({gpu_correlations} is a UNION of those tables' correlationId columns). launch_key as in gpu_kernels.sql.
-- A graph launch appears once; all the nodes it replays carry its correlationId.
SELECT (((r.globalTid >> 24) & 4294967295) << 32) | (r.correlationId & 4294967295),
       r.globalTid,
       r.start
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
WHERE r.correlationId IN ({gpu_correlations})

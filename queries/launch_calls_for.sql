-- Launch calls with the given correlationIds (?1: a JSON array), for ops that launch_calls_by_name.sql missed.
-- launch_key as in gpu_kernels.sql.
SELECT (((r.globalTid >> 24) & 4294967295) << 32) | (r.correlationId & 4294967295),
       r.globalTid,
       r.start
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
WHERE r.correlationId IN (SELECT value FROM json_each(?1))

-- Launch calls with the given correlationIds (?1: a JSON array), for ops that launch_calls_by_name.sql missed.
-- launch_key as in gpu_kernels.sql.
SELECT CASE WHEN r.correlationId BETWEEN 0 AND 4294967295  -- -1: a correlationId beyond 32 bits matches no op
            THEN (((r.globalTid >> 24) & 4294967295) << 32) | r.correlationId ELSE -1 END,
       r.globalTid,
       r.start
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
WHERE r.correlationId IN (SELECT value FROM json_each(?1))

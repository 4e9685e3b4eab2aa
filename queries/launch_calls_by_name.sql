-- Launch calls selected by API name ({name_ids}: launch_call_names.sql); launch_key and {row_range} as in
-- gpu_kernels.sql.
SELECT CASE WHEN r.correlationId BETWEEN 0 AND 4294967295  -- -1: a correlationId beyond 32 bits matches no op
            THEN (((r.globalTid >> 24) & 4294967295) << 32) | r.correlationId ELSE -1 END,
       r.globalTid,
       r.start
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
WHERE r.nameId IN ({name_ids})
  AND {row_range}

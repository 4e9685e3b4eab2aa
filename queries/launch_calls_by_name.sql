-- Launch calls selected by API name ({name_ids}: launch_call_names.sql); launch_key as in gpu_kernels.sql.
SELECT (((r.globalTid >> 24) & 4294967295) << 32) | (r.correlationId & 4294967295),
       r.globalTid,
       r.start
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
WHERE r.nameId IN ({name_ids})

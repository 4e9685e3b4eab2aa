-- Every memcpy, as in gpu_kernels.sql, with copyKind (ENUM_CUDA_MEMCPY_OPER: 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP) in
-- place of the name id (no launch shape: grid and block -1).
SELECT m.start,
       m."end",
       CASE WHEN m.deviceId BETWEEN 0 AND 2147483647 THEN m.deviceId ELSE -1 END,
       CASE WHEN ({stream_id}) BETWEEN 0 AND 2147483647 AND COALESCE(m.copyKind, 0) BETWEEN 0 AND 2147483647
            THEN (({stream_id}) << 32) | COALESCE(m.copyKind, 0) ELSE -1 END,
       CASE WHEN m.correlationId BETWEEN 0 AND 4294967295
            THEN (((m.globalPid >> 24) & 4294967295) << 32) | m.correlationId ELSE -1 END,
       {graph_node_id},
       -1,
       -1
       {name_pair}
FROM CUPTI_ACTIVITY_KIND_MEMCPY AS m
WHERE {row_range}

-- Every memcpy, as in gpu_kernels.sql, with copyKind (ENUM_CUDA_MEMCPY_OPER: 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP) in
-- place of the name id.
SELECT m.start,
       m."end",
       m.deviceId,
       ((({stream_id}) & 2147483647) << 32) | (COALESCE(m.copyKind, 0) & 4294967295),
       (((m.globalPid >> 24) & 4294967295) << 32) | (m.correlationId & 4294967295),
       {graph_node_id}
FROM CUPTI_ACTIVITY_KIND_MEMCPY AS m

-- Every memset, as in gpu_kernels.sql (no name id).
SELECT m.start,
       m."end",
       m.deviceId,
       (({stream_id}) & 2147483647) << 32,
       (((m.globalPid >> 24) & 4294967295) << 32) | (m.correlationId & 4294967295),
       {graph_node_id}
FROM CUPTI_ACTIVITY_KIND_MEMSET AS m

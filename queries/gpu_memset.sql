-- Every memset on the GPU timeline.
SELECT m.start,
       m."end",
       m.deviceId,
       m.correlationId,
       m.globalPid,
       COALESCE(m.bytes, 0),
       {graph_node_id},
       {stream_id}
FROM CUPTI_ACTIVITY_KIND_MEMSET AS m

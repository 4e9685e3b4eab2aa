-- Every kernel execution: when and where it ran, the launch it belongs to (correlationId within its process),
-- and its names (StringIds ids). Optional columns are filled in by the reader: {graph_node_id}, {stream_id}.
SELECT k.start,
       k."end",
       k.deviceId,
       k.correlationId,
       k.globalPid,
       k.shortName,
       COALESCE(k.demangledName, k.shortName),
       {graph_node_id},
       {stream_id}
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k

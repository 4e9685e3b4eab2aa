-- Every memcpy on the GPU timeline; copyKind is ENUM_CUDA_MEMCPY_OPER (1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP, ...).
SELECT m.start,
       m."end",
       m.deviceId,
       m.correlationId,
       m.globalPid,
       COALESCE(m.copyKind, 0),
       COALESCE(m.bytes, 0),
       {graph_node_id},
       {stream_id}
FROM CUPTI_ACTIVITY_KIND_MEMCPY AS m

-- The graph of each replayed kernel recorded without a correlationId (newer nsys: graphs built before the capture
-- started), where the kernel table has graphId: process bits of globalPid, start, graph node and graph id, to be
-- matched to the reader's ops by (process, start, node) (trace/graph_replays.py).
SELECT (k.globalPid >> 24) & 4294967295,
       k.start,
       k.graphNodeId,
       k.graphId
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
WHERE k.correlationId = 0 AND k.graphNodeId IS NOT NULL AND k.graphId IS NOT NULL

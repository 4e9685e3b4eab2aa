-- CUDA graph node creation events ({table}: CUDA_GRAPH_EVENTS in nsys up to 2024.x, CUDA_GRAPH_NODE_EVENTS later).
-- A node created by stream capture carries the time and thread of the capturing launch; an instantiated (cloned)
-- exec node points back to it through originalGraphNodeId.
SELECT e.graphNodeId,
       COALESCE(e.originalGraphNodeId, -1),
       e.start,
       e.globalTid
FROM {table} AS e
WHERE e.graphNodeId IS NOT NULL

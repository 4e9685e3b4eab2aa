-- Per GPU: how many kernels ran, from how many processes, how many were replayed graph nodes, and the time they
-- cover (first start, last end, summed duration in ns). {graph_node_id} is k.graphNodeId, or NULL where the
-- export lacks the column.
SELECT k.deviceId,
       COUNT(DISTINCT k.globalPid) AS processes,
       COUNT(*) AS kernels,
       SUM(CASE WHEN {graph_node_id} IS NULL THEN 0 ELSE 1 END) AS graph_node_kernels,
       MIN(k.start) AS first_start_ns,
       MAX(k."end") AS last_end_ns,
       SUM(k."end" - k.start) AS kernel_ns
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
GROUP BY k.deviceId
ORDER BY k.deviceId

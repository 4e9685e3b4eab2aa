-- NVTX rows per event type (59 push/pop range, 60 start/end range, 34 mark, 75/76 domain create/destroy).
SELECT n.eventType,
       COUNT(*) AS events
FROM NVTX_EVENTS AS n
GROUP BY n.eventType
ORDER BY n.eventType

-- Closed NVTX push/pop (59) and start/end (60) ranges with their text resolved (registered strings live in
-- StringIds via textId). Ranges ended on another thread are dropped, as nsys's own GPU projection does.
SELECT n.start,
       n."end",
       n.globalTid,
       COALESCE(s.value, n.text, '') AS text,
       COALESCE(n.domainId, 0) AS domainId
FROM NVTX_EVENTS AS n
LEFT JOIN StringIds AS s ON s.id = {text_id}
WHERE n.eventType IN (59, 60)
  AND n."end" IS NOT NULL
  AND {same_thread}
ORDER BY n.globalTid, n.start

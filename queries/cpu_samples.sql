-- CPU samples (nsys --sample=process-tree): sample id, thread, time, and its leaf frame (stackDepth 0: symbol and
-- module, StringIds ids; -1 where the sample has no frame). Samples without a thread are left out.
SELECT e.id, e.globalTid, e.start, COALESCE(c.symbol, -1), COALESCE(c.module, -1)
FROM COMPOSITE_EVENTS AS e
LEFT JOIN SAMPLING_CALLCHAINS AS c ON c.id = e.id AND c.stackDepth = 0
WHERE e.globalTid IS NOT NULL
ORDER BY e.id

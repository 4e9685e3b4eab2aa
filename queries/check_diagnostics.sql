-- nsys's own diagnostics of the capture at or above a severity (?1; ENUM_DIAGNOSTIC_SEVERITY_LEVEL: 1 info,
-- 2 warning, 3 error), in time order, distinct texts, at most 20.
SELECT max(d.severity), d.text
FROM DIAGNOSTIC_EVENT AS d
WHERE d.severity >= ?1 AND d.text IS NOT NULL
GROUP BY d.text
ORDER BY min(d.timestamp)
LIMIT 20

-- cudaGraphLaunch / cuGraphLaunch calls (any version suffix), in time order.
SELECT r.start,
       r."end",
       r.globalTid,
       r.correlationId
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
WHERE r.nameId IN (SELECT id FROM StringIds
                   WHERE value LIKE 'cudaGraphLaunch%' OR value LIKE 'cuGraphLaunch%')
ORDER BY r.globalTid, r.start

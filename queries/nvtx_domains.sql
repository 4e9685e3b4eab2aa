-- NVTX domain names (eventType 75 = NvtxDomainCreate), per process: domainId values are per process.
SELECT n.domainId,
       n.globalTid & -16777216 AS globalPid,
       n.text
FROM NVTX_EVENTS AS n
WHERE n.eventType = 75

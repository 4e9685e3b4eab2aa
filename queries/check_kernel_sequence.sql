-- Every kernel as (device, name id, launch configuration, start ns, duration ns), ordered so that each
-- (device, name, grid, block) group runs in time order: its first row is the first call of that kernel with that
-- launch configuration inside the window (a prefill-shaped call of a kernel is not the first call of its decode
-- shape).
SELECT k.deviceId,
       COALESCE(k.demangledName, k.shortName),
       k.gridX, k.gridY, k.gridZ,
       k.blockX, k.blockY, k.blockZ,
       k.start,
       k."end" - k.start AS duration_ns
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
ORDER BY k.deviceId, k.demangledName, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ, k.start

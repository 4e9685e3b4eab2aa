-- One row per GPU in the capture, with the fields that override a hardware preset.
-- memoryBandwidth is in bytes/s, clockRate in Hz, totalMemory in bytes (nsys export schema, TARGET_INFO_GPU);
-- id is the device id that CUPTI_ACTIVITY_KIND_KERNEL.deviceId refers to.
SELECT
    id AS device,
    name,
    memoryBandwidth AS memory_bandwidth_bytes_per_s,
    smCount AS sm_count,
    clockRate AS clock_hz,
    totalMemory AS memory_bytes
FROM TARGET_INFO_GPU
ORDER BY id;

-- The CPU sampling period nsys was set to, and what triggered the samples ('Software': the CPU clock, period in ns).
SELECT max(CASE WHEN name = 'LINUX_PERF_OPTIONS:SAMPLING_PERIOD' THEN value END),
       max(CASE WHEN name = 'LINUX_PERF_OPTIONS:CPU_IP_TRIGGER_TYPE' THEN value END)
FROM META_DATA_CAPTURE

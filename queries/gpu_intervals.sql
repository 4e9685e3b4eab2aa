-- Every GPU activity's interval and device: kernels, memory copies and sets{graph_trace_note}.
SELECT start, "end", deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL
{memcpy}
{memset}
{graph_trace}

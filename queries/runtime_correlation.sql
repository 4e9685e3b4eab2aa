-- Every recorded CUDA runtime/driver call as its key (VM and process bits of the thread << 32 | correlationId):
-- CUPTI numbers the calls of a process in order, so the ids that never appear are calls nsys did not keep.
-- {row_range} bounds the rowids read (trace/reader.py blocks_by_rows).
SELECT (((r.globalTid >> 24) & 4294967295) << 32) | (r.correlationId & 4294967295)
FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
WHERE {row_range}

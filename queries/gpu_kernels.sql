-- (SQLite gives << >> & | one precedence, left to right: every group is parenthesised.)
-- Every kernel execution, in few integers (fetching is the cost that matters on big exports):
--   deviceId   as recorded (no width limit)
--   packed     = (streamId & 0x7FFFFFFF) << 32 | demangled name id (StringIds)
--   launch_key = (vm + process bits of globalPid) << 32 | correlationId   -- the key of its launch call
-- {stream_id} and {graph_node_id} are filled in by the reader (optional columns).
SELECT k.start,
       k."end",
       k.deviceId,
       ((({stream_id}) & 2147483647) << 32) | (COALESCE(k.demangledName, k.shortName) & 4294967295),
       (((k.globalPid >> 24) & 4294967295) << 32) | (k.correlationId & 4294967295),
       {graph_node_id}
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k

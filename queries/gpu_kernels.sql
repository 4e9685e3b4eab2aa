-- (SQLite gives << >> & | one precedence, left to right: every group is parenthesised.)
-- Every kernel execution, in few integers (fetching is the cost that matters on big exports):
--   deviceId   as recorded (no width limit; -1 when it does not fit the 31 bits of Ops.device)
--   packed     = streamId << 32 | demangled name id (StringIds)
--   launch_key = (vm + process bits of globalPid) << 32 | correlationId   -- the key of its launch call
-- A value that does not fit its field (deviceId, streamId or name id beyond 31 bits, correlationId beyond 32) makes
-- the field -1 instead of wrapping into another id; the reader drops such rows and counts them (trace/validate.py).
--   grid       = gridX << 32 | gridY << 16 | gridZ                       (trace/ops.py pack_grid)
--   block      = blockX << 48 | blockY << 32 | blockZ << 16 | registersPerThread   (pack_block)
--                (-1 when a value is missing or does not fit its bits: a shape is never wrapped into another)
-- {stream_id}, {graph_node_id}, {grid_x} ... {registers} are filled in by the reader (optional columns); {row_range}
-- is 1 (every row) or a rowid range, so that ranges of rows can be fetched at once on several connections
-- (trace/fetch.py ordered_blocks): rows come in rowid order either way. The name_pair fragment is empty or, for the op store's
-- build, one more column (kernel_name_pair.sql).
SELECT k.start,
       k."end",
       CASE WHEN k.deviceId BETWEEN 0 AND 2147483647 THEN k.deviceId ELSE -1 END,
       CASE WHEN ({stream_id}) BETWEEN 0 AND 2147483647
                 AND COALESCE(k.demangledName, k.shortName) BETWEEN 0 AND 2147483647
            THEN (({stream_id}) << 32) | COALESCE(k.demangledName, k.shortName) ELSE -1 END,
       CASE WHEN k.correlationId BETWEEN 0 AND 4294967295
            THEN (((k.globalPid >> 24) & 4294967295) << 32) | k.correlationId ELSE -1 END,
       {graph_node_id},
       CASE WHEN ({grid_x}) BETWEEN 0 AND 2147483647 AND ({grid_y}) BETWEEN 0 AND 65535
                 AND ({grid_z}) BETWEEN 0 AND 65535
            THEN (({grid_x}) << 32) | (({grid_y}) << 16) | ({grid_z}) ELSE -1 END,
       CASE WHEN ({block_x}) BETWEEN 0 AND 32767 AND ({block_y}) BETWEEN 0 AND 32767
                 AND ({block_z}) BETWEEN 0 AND 32767 AND ({registers}) BETWEEN 0 AND 32767
            THEN (({block_x}) << 48) | (({block_y}) << 32) | (({block_z}) << 16) | ({registers}) ELSE -1 END
       {name_pair}
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
WHERE {row_range}

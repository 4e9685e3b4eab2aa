-- CUDA API calls per decode step, by kind: CUDA-graph launches, kernel launches, memory copies/sets, and
-- synchronizations (with the CPU time spent in them). :steps is a JSON array of [thread, start_ns, end_ns], one
-- per step, sorted by thread then start; a step's index is its position. :any_thread = 1 makes every thread's
-- calls belong to the steps of thread -1 (the whole capture as one step).
-- A call belongs to the step that started most recently on its thread, if it starts before that step ends
-- (a sort over calls and step starts per thread, not a join of every call with every step).
-- Returns one row per step that holds at least one call: step, graph_launches, kernel_launches, memory_calls,
-- sync_calls, sync_ns.
WITH steps AS (
  SELECT CAST(key AS INTEGER) AS step,
         CAST(json_extract(value, '$[0]') AS INTEGER) AS tid,
         CAST(json_extract(value, '$[1]') AS INTEGER) AS s,
         CAST(json_extract(value, '$[2]') AS INTEGER) AS e
  FROM json_each(:steps)
),
kinds AS (
  SELECT id,
         CASE
           WHEN value LIKE 'cudaGraphLaunch%' OR value LIKE 'cuGraphLaunch%' THEN 'graph'
           WHEN value LIKE 'cudaLaunch%Kernel%' OR value LIKE 'cuLaunch%Kernel%' THEN 'kernel'
           WHEN value LIKE 'cudaMemcpy%' OR value LIKE 'cudaMemset%'
                OR value LIKE 'cuMemcpy%' OR value LIKE 'cuMemset%' THEN 'memory'
           WHEN value LIKE 'cuda%Synchronize%' OR value LIKE 'cu%Synchronize%' THEN 'sync'
         END AS kind
  FROM StringIds
),
calls AS (
  SELECT CASE WHEN :any_thread THEN -1 ELSE r.globalTid END AS tid,
         r.start AS ts,
         r."end" - r.start AS dur,
         k.kind
  FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r
  JOIN kinds AS k ON k.id = r.nameId
  WHERE k.kind IS NOT NULL
),
events AS (
  SELECT tid, s AS ts, step, NULL AS kind, 0 AS dur FROM steps
  UNION ALL
  SELECT tid, ts, NULL, kind, dur FROM calls WHERE tid IN (SELECT tid FROM steps)
),
placed AS (
  -- step indices grow with start time on a thread, so the running max is the most recently started step
  SELECT ts, kind, dur,
         max(step) OVER (PARTITION BY tid ORDER BY ts, step IS NULL ROWS UNBOUNDED PRECEDING) AS step
  FROM events
)
SELECT p.step,
       sum(p.kind = 'graph'),
       sum(p.kind = 'kernel'),
       sum(p.kind = 'memory'),
       sum(p.kind = 'sync'),
       sum(CASE WHEN p.kind = 'sync' THEN p.dur ELSE 0 END)
FROM placed AS p
JOIN steps AS st ON st.step = p.step
WHERE p.kind IS NOT NULL AND p.ts <= st.e
GROUP BY p.step
ORDER BY p.step

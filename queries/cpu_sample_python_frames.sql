-- The innermost Python frame of each sampled call chain that has one: a frame whose symbol is a perf-map name
-- ('py::function:file', CPython 3.12+ with -X perf, where a sampler resolves it) or whose module is a Python source
-- file (ending in .py). Columns: sample id, symbol, module (StringIds ids), its depth (0 = leaf).
WITH py AS (SELECT id FROM StringIds WHERE value LIKE 'py::%' OR value LIKE '%.py')
SELECT c.id, c.symbol, c.module, min(c.stackDepth)
FROM SAMPLING_CALLCHAINS AS c
WHERE c.symbol IN (SELECT id FROM py) OR c.module IN (SELECT id FROM py)
GROUP BY c.id

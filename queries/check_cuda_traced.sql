-- Whether nsys was told to trace CUDA, per launched process ('true'/'false'), from the capture settings.
SELECT m.value
FROM META_DATA_CAPTURE AS m
WHERE m.name LIKE 'PROCESS_%:COLLECT_CUDA_TRACE'

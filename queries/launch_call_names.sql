-- Ids of the CUDA runtime/driver API names that can put work on a GPU (kernel and graph launches, memcpy, memset;
-- any version suffix). Filtering launch calls by these few ids is far cheaper than by correlationId.
SELECT id
FROM StringIds
WHERE value LIKE '%Launch%' OR value LIKE '%emcpy%' OR value LIKE '%emset%'

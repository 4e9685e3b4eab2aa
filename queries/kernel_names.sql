-- Each demangled kernel name id with its short name id (the short name is what nsys shows as the kernel name).
SELECT COALESCE(k.demangledName, k.shortName) AS demangled,
       -- a short name id beyond 31 bits is no id (NULL, ignored by MIN; all of them NULL: a damaged value)
       MIN(CASE WHEN k.shortName BETWEEN 0 AND 2147483647 THEN k.shortName END) AS short
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
GROUP BY 1

-- Each demangled kernel name id with its short name id (the short name is what nsys shows as the kernel name).
SELECT COALESCE(k.demangledName, k.shortName) AS demangled,
       MIN(k.shortName) AS short
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
GROUP BY 1

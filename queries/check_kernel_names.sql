-- Distinct kernels: demangled and short name, executions, summed duration (ns). Used to fingerprint the MoE backend.
SELECT COALESCE(d.value, s.value) AS demangled,
       s.value AS name,
       COUNT(*) AS executions,
       SUM(k."end" - k.start) AS kernel_ns
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
LEFT JOIN StringIds AS d ON d.id = k.demangledName
LEFT JOIN StringIds AS s ON s.id = k.shortName
GROUP BY k.demangledName, k.shortName
ORDER BY kernel_ns DESC

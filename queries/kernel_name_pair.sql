-- One more column of gpu_kernels.sql for the op store's build (trace/store_build.py), so that the (demangled name,
-- short name) pairs of kernel_names.sql come from the same scan of the kernel table instead of a second one:
--   demangled << 32 | short, with demangled = COALESCE(demangledName, shortName) as kernel_names.sql groups them and
--   short = 4294967295 where the short name is no id (NULL or beyond 31 bits: MIN ignores it there);
--   -1 where the demangled id does not fit 31 bits (no op carries it); -2 where both names are NULL.
, CASE WHEN COALESCE(k.demangledName, k.shortName) BETWEEN 0 AND 2147483647
       THEN (COALESCE(k.demangledName, k.shortName) << 32)
            | (CASE WHEN k.shortName BETWEEN 0 AND 2147483647 THEN k.shortName ELSE 4294967295 END)
       WHEN COALESCE(k.demangledName, k.shortName) IS NULL THEN -2
       ELSE -1 END

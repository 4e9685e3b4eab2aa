-- The first and last rowid of {table} (both NULL when it is empty): the ranges trace/store_build.py fetches at once.
-- (Two subqueries: SQLite finds min and max each at one end of the table's tree, but scans it for both in one.)
SELECT (SELECT min(rowid) FROM {table}), (SELECT max(rowid) FROM {table})

-- name: list_partitions
-- The partitions of one partitioned table with their bounds as text ("DEFAULT" partition:
-- NULL bounds), oldest first by lower bound.
SELECT c.relname,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''?([^'')]+)''?\)'),
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''?([^'')]+)''?\)')
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = %(table)s::regclass
ORDER BY 2 NULLS FIRST, 1;

-- name: create_partition
-- A partition is made as a table of its own, then attached: ATTACH takes a lighter lock on
-- the parent than CREATE TABLE ... PARTITION OF (reads and writes of the parent go on), and
-- creates the parent's indexes and row triggers on it.
CREATE TABLE {partition} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE {table} ATTACH PARTITION {partition} FOR VALUES FROM ({lower}) TO ({upper});

-- name: drop_partition
-- Drops one partition with its rows (an ACCESS EXCLUSIVE lock on the parent, for an instant).
DROP TABLE {partition};

-- name: lock_timeout
-- Maintenance waits this long for a lock, then gives up until its next pass instead of making
-- every query of the table queue behind it.
SET LOCAL lock_timeout = '2s';

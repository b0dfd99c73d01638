-- name: ranges
-- The event store's range partitions, oldest first: oid, name, bounds (as text, as
-- core/partitions.sql reads them), and the name of the seal (pgmsg_sealed_below_<id>) when
-- the partition has one. The default partition is left out (it has no range).
SELECT c.oid::bigint, c.relname,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''?([^'')]+)''?\)'),
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''?([^'')]+)''?\)'),
       (SELECT s.conname FROM pg_constraint AS s
        WHERE s.conrelid = c.oid AND s.contype = 'c' AND s.conname LIKE 'pgmsg\_sealed\_below\_%'
        ORDER BY s.conname LIMIT 1)
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'pgmsg_event'::regclass AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT';

-- name: oldest_transaction
-- When the oldest open transaction of this database began (NULL: none is open), and whether
-- every session's transaction start is visible to this role (pg_stat_activity hides it for
-- other roles' sessions unless this one is a member of pg_read_all_stats).
SELECT min(a.xact_start),
       coalesce(bool_and(pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
                         OR a.usesysid IS NULL
                         OR pg_has_role(current_user, a.usesysid, 'USAGE')), true)
FROM pg_stat_activity AS a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid();

-- name: lock_timeout
-- Sealing waits this long for a partition's writers, then leaves it for the next pass.
SET LOCAL lock_timeout = '2s';

-- name: lock_for_seal
-- A format template (the partition's name, from the catalog). Waits for the transactions
-- that are writing the partition to end, and keeps new writers out until the seal is on.
LOCK TABLE {partition} IN SHARE ROW EXCLUSIVE MODE;

-- name: seal_bound
-- A format template. One above the highest read-order transaction id in the partition (the
-- read-order index gives it), or this transaction's own id for an empty partition: every row
-- the partition holds is below it.
SELECT coalesce(
    (SELECT transaction_id::text::bigint + 1 FROM {partition}
     ORDER BY transaction_id DESC LIMIT 1),
    pg_current_xact_id()::text::bigint);

-- name: seal
-- A format template (identifiers and the bound built by events/partitions.py). The constraint
-- is PostgreSQL's guarantee that no row at or above the bound ever enters the partition (an
-- insert that would fails): subscription reads rely on it to skip the partition (NOT VALID:
-- the rows there were checked under the lock above, no scan needed).
ALTER TABLE {partition} ADD CONSTRAINT {name} CHECK (transaction_id < {bound}::xid8) NOT VALID;

-- name: never_analyzed
-- Partitions of the event store (the default one too) that hold rows and were never analyzed.
SELECT c.relname
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
JOIN pg_stat_user_tables AS t ON t.relid = c.oid
WHERE i.inhparent = 'pgmsg_event'::regclass
  AND t.last_analyze IS NULL AND t.last_autoanalyze IS NULL
  AND t.n_tup_ins > 0
ORDER BY c.relname;

-- name: table_exists
-- Whether a registered table has been created (its capability's migration has run).
SELECT to_regclass(%(table)s) IS NOT NULL;

-- name: table_columns
-- A table's columns in order, with their PostgreSQL type as SQL spells it.
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = to_regclass(%(table)s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum;

-- name: key_range
-- Rows and key range of a whole (snapshot) table. {table} and {key} are identifiers composed by
-- the caller from the registry.
SELECT count(*), min({key})::bigint, max({key})::bigint FROM {table};

-- name: key_range_between
-- Rows and key range of the rows written by transactions in [lower, upper).
SELECT count(*), min({key})::bigint, max({key})::bigint FROM {table}
WHERE {transaction} >= %(lower)s::text::xid8 AND {transaction} < %(upper)s::text::xid8;

-- name: try_lock
-- One export per database at a time: a session advisory lock.
SELECT pg_try_advisory_lock(hashtext(%(name)s));

-- name: unlock
SELECT pg_advisory_unlock(hashtext(%(name)s));

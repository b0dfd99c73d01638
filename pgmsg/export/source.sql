-- These statements run on Spark's executors, over connections of their own. {columns}, {table},
-- {key} and {transaction} are identifiers (and column expressions) composed with psycopg.sql
-- from the read plan; bounds are always parameters.

-- name: copy_range
-- One read partition of a batch export: an inclusive key range, as CSV.
COPY (SELECT {columns} FROM {table} WHERE {key} >= %(lo)s AND {key} <= %(hi)s ORDER BY {key})
TO STDOUT WITH (FORMAT csv);

-- name: copy_range_between
-- One read partition of an incremental export: a key range of the rows written by transactions
-- in [tx_lo, tx_hi).
COPY (SELECT {columns} FROM {table}
      WHERE {key} >= %(lo)s AND {key} <= %(hi)s
        AND {transaction} >= %(tx_lo)s::text::xid8 AND {transaction} < %(tx_hi)s::text::xid8
      ORDER BY {key})
TO STDOUT WITH (FORMAT csv);

-- name: copy_after
-- One read partition of a streaming micro-batch: the rows after checkpoint (start_tx, start_key)
-- up to and including (end_tx, end_key) in (transaction id, key) order, within a key range.
COPY (SELECT {columns} FROM {table}
      WHERE ({transaction}, {key}) > (%(start_tx)s::text::xid8, %(start_key)s::bigint)
        AND ({transaction}, {key}) <= (%(end_tx)s::text::xid8, %(end_key)s::bigint)
        AND {key} >= %(lo)s AND {key} <= %(hi)s
      ORDER BY {transaction}, {key})
TO STDOUT WITH (FORMAT csv);

-- name: head
-- The stream's head: the greatest (transaction id, key) of the rows of ended transactions
-- (below the read horizon %(horizon)s, taken in an earlier statement: see
-- pgmsg/core/horizon.sql), after the checkpoint (start_tx, start_key), taking at most
-- %(limit)s rows (NULL: all). Also the rows it spans and their key range, to plan partitions.
WITH settled AS (
    SELECT {transaction} AS tx, {key} AS k FROM {table}
    WHERE ({transaction}, {key}) > (%(start_tx)s::text::xid8, %(start_key)s::bigint)
      AND {transaction} < %(horizon)s::text::xid8
    ORDER BY {transaction}, {key}
    LIMIT %(limit)s
)
SELECT (SELECT tx::text::bigint FROM settled ORDER BY tx DESC, k DESC LIMIT 1),
       (SELECT k FROM settled ORDER BY tx DESC, k DESC LIMIT 1),
       count(*), min(k)::bigint, max(k)::bigint
FROM settled;

-- name: span
-- Rows and key range between two checkpoints, to plan a micro-batch's read partitions.
SELECT count(*), min({key})::bigint, max({key})::bigint FROM {table}
WHERE ({transaction}, {key}) > (%(start_tx)s::text::xid8, %(start_key)s::bigint)
  AND ({transaction}, {key}) <= (%(end_tx)s::text::xid8, %(end_key)s::bigint);

-- name: lag
-- How far the stream is behind the database: rows after the checkpoint, and the age in seconds
-- of the oldest of them ({timestamp} is the table's timestamp column).
SELECT count(*), extract(epoch FROM now() - min({timestamp}))::float8 FROM {table}
WHERE ({transaction}, {key}) > (%(end_tx)s::text::xid8, %(end_key)s::bigint);

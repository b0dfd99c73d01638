-- name: forget
-- A suspect is settled (handled, failed, dead or put back with its crashes counted): its id
-- leaves the claims of the batches that died with it; claims left empty go.
WITH trimmed AS (
    UPDATE pgmsg_claim SET ids = array_remove(ids, %(id)s::bigint)
    WHERE kind = %(kind)s AND %(id)s::bigint = ANY(ids)
      AND pg_xact_status(transaction_id::text::xid8) = 'aborted'
    RETURNING id, ids
)
DELETE FROM pgmsg_claim WHERE id IN (SELECT id FROM trimmed WHERE ids = '{}');

-- name: record_and_count
-- Before a batch's handlers run, on the worker's autocommit connection: the ids the batch
-- transaction claimed, and that transaction's id. Each worker keeps one row for its records
-- (%(row)s: the row of its last record, NULL before the first): a record replaces the last
-- one where that one's batch committed (then it is garbage), so that the table stays a few
-- rows on a few pages (an UPDATE that changes no indexed column is a heap-only update, which
-- the page's pruning reclaims as it goes). A new row is added where there is none, or where
-- the last batch died (its row is the record of a crash, kept). An INSERT and a DELETE per
-- batch instead left a dead row per batch: every record's scan of the table read them all
-- until vacuum came, and without autovacuum for good.
-- A worker's first record (no row yet) also deletes the records of batches that committed:
-- the rows of stopped workers (a running worker whose row goes adds a new one next time).
-- Returns the record's row, with each recorded id that claims of batches that died held (a
-- suspect) and its crashes: how many of those held it alone (a death in a batch of several
-- rows is nobody's fault yet); one row of NULLs beside the record's row when none did.
WITH garbage AS (
    DELETE FROM pgmsg_claim
    WHERE %(row)s::bigint IS NULL
      AND coalesce(pg_xact_status(transaction_id::text::xid8), 'committed') = 'committed'
), reused AS (
    UPDATE pgmsg_claim
    SET kind = %(kind)s, ids = %(ids)b::bigint[], transaction_id = %(xid)s, pid = %(pid)s,
        claimed_at = now(), alone = cardinality(%(ids)b::bigint[]) = 1
    WHERE id = %(row)s
      AND coalesce(pg_xact_status(transaction_id::text::xid8), 'committed') = 'committed'
    RETURNING id
), added AS (
    INSERT INTO pgmsg_claim (kind, ids, transaction_id, pid, alone)
    SELECT %(kind)s, %(ids)b::bigint[], %(xid)s, %(pid)s, cardinality(%(ids)b::bigint[]) = 1
    WHERE NOT EXISTS (SELECT FROM reused)
    RETURNING id
)
SELECT (SELECT id FROM reused UNION ALL SELECT id FROM added), crashed.id, crashed.crashes
FROM (SELECT) AS one LEFT JOIN (
    SELECT c.id, (count(*) FILTER (WHERE k.alone))::int AS crashes
    FROM pgmsg_claim AS k CROSS JOIN LATERAL unnest(k.ids) AS c(id)
    WHERE k.kind = %(kind)s AND c.id = ANY(%(ids)b::bigint[])
      AND pg_xact_status(k.transaction_id::text::xid8) = 'aborted'
    GROUP BY c.id
) AS crashed ON true;

-- name: narrow
-- The batch runs fewer rows than recorded (a suspect alone): only those count if it dies, and
-- a death is charged to a row that ran alone.
UPDATE pgmsg_claim SET ids = %(ids)b::bigint[], alone = cardinality(%(ids)b::bigint[]) = 1
WHERE kind = %(kind)s AND transaction_id = %(xid)s AND pid = %(pid)s;

-- name: withdraw
-- The batch was rolled back on purpose (run_batch's fast path saw a handler fail and the
-- worker claims again with savepoints): its claim is no crash.
DELETE FROM pgmsg_claim WHERE transaction_id = %(xid)s AND pid = %(pid)s;

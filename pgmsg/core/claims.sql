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
-- transaction claimed, and that transaction's id; returns, for the ids recorded, how many
-- claims of batches that died held each (ids without crashes absent). Claims of committed
-- (or forgotten) batches are deleted on the way: the table holds about one row per running
-- worker, plus the claims of batches that died.
WITH garbage AS (
    DELETE FROM pgmsg_claim
    WHERE coalesce(pg_xact_status(transaction_id::text::xid8), 'committed') = 'committed'
), recorded AS (
    INSERT INTO pgmsg_claim (kind, ids, transaction_id, pid)
    VALUES (%(kind)s, %(ids)b::bigint[], %(xid)s, %(pid)s)
)
SELECT c.id, count(*)::int
FROM pgmsg_claim AS k CROSS JOIN LATERAL unnest(k.ids) AS c(id)
WHERE k.kind = %(kind)s AND c.id = ANY(%(ids)b::bigint[])
  AND pg_xact_status(k.transaction_id::text::xid8) = 'aborted'
GROUP BY c.id;

-- name: narrow
-- The batch runs fewer rows than recorded (a suspect alone): only those count if it dies.
UPDATE pgmsg_claim SET ids = %(ids)b::bigint[]
WHERE kind = %(kind)s AND transaction_id = %(xid)s AND pid = %(pid)s;

-- name: withdraw
-- The batch was rolled back on purpose (run_batch's fast path saw a handler fail and the
-- worker claims again with savepoints): its claim is no crash.
DELETE FROM pgmsg_claim WHERE transaction_id = %(xid)s AND pid = %(pid)s;

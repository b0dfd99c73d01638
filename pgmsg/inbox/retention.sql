-- name: expired_counts
-- Rows of one partition that retention may remove, by kind, and the rows it must keep:
-- processed longer ago than %(processed_seconds)s, dead or discarded with no change for
-- %(dead_seconds)s (except a dead head that holds an ordered aggregate back); every other row
-- is kept. Only the total is a scan (a plain count); the rows to keep are found by index
-- probes: pending rows (pgmsg_inbox_pending), processed rows not yet expired
-- (pgmsg_inbox_processed, one range per inbox, the inboxes found by a skip scan of that index)
-- and the few dead and discarded rows (pgmsg_inbox_failed). Read without a lock first for
-- recent partitions (to skip those not worth rewriting), and under the lock before a rewrite.
WITH RECURSIVE inboxes AS (
    (SELECT d.inbox FROM {partition} AS d WHERE d.status = 'processed'
     ORDER BY d.inbox LIMIT 1)
    UNION ALL
    SELECT (SELECT d.inbox FROM {partition} AS d
            WHERE d.status = 'processed' AND d.inbox > i.inbox ORDER BY d.inbox LIMIT 1)
    FROM inboxes AS i WHERE i.inbox IS NOT NULL
), failed AS (
    SELECT NOT (greatest(d.received_at, d.last_failed_at, d.discarded_at)
                    < now() - make_interval(secs => %(dead_seconds)s)
                AND NOT (d.status = 'dead' AND d.inbox = ANY(%(ordered)s::text[])
                         AND d.aggregate_id IS NOT NULL
                         AND EXISTS (SELECT FROM pgmsg_inbox_message AS b
                                     WHERE b.inbox = d.inbox
                                       AND b.aggregate_id = d.aggregate_id
                                       AND (b.transaction_id, b.id)
                                           > (d.transaction_id, d.id)
                                       AND b.status = 'pending'))) AS kept
    FROM {partition} AS d
    WHERE d.status IN ('dead', 'discarded')
)
SELECT (SELECT count(*) FROM {partition}) AS total,
       (SELECT count(*) FROM {partition} AS d WHERE d.status = 'pending') AS pending,
       (SELECT count(*) FROM inboxes AS i
        CROSS JOIN LATERAL (SELECT FROM {partition} AS d
                            WHERE d.status = 'processed' AND d.inbox = i.inbox
                              AND d.processed_at >= now() - make_interval(
                                  secs => %(processed_seconds)s)) AS young)
       + (SELECT count(*) FROM {partition} AS d
          WHERE d.status = 'processed' AND d.processed_at IS NULL) AS young,
       (SELECT count(*) FROM failed WHERE NOT failed.kept) AS failed_gone,
       (SELECT count(*) FROM failed WHERE failed.kept) AS failed_kept;

-- name: lock_partition
-- While a partition is rewritten nobody reads or writes it; other partitions are not locked.
LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE;

-- name: keep_rows
-- Under the lock: a copy of the rows to keep (expired_counts said how many: at most
-- %(limit)s), found by the same index probes.
CREATE TEMPORARY TABLE pgmsg_inbox_kept ON COMMIT DROP AS
WITH RECURSIVE inboxes AS (
    (SELECT d.inbox FROM {partition} AS d WHERE d.status = 'processed'
     ORDER BY d.inbox LIMIT 1)
    UNION ALL
    SELECT (SELECT d.inbox FROM {partition} AS d
            WHERE d.status = 'processed' AND d.inbox > i.inbox ORDER BY d.inbox LIMIT 1)
    FROM inboxes AS i WHERE i.inbox IS NOT NULL
)
SELECT d.* FROM {partition} AS d WHERE d.status = 'pending'
UNION ALL
SELECT young.* FROM inboxes AS i
CROSS JOIN LATERAL (SELECT d.* FROM {partition} AS d
                    WHERE d.status = 'processed' AND d.inbox = i.inbox
                      AND d.processed_at >= now() - make_interval(
                          secs => %(processed_seconds)s)) AS young
UNION ALL
SELECT d.* FROM {partition} AS d WHERE d.status = 'processed' AND d.processed_at IS NULL
UNION ALL
SELECT d.* FROM {partition} AS d
WHERE d.status IN ('dead', 'discarded')
  AND NOT (greatest(d.received_at, d.last_failed_at, d.discarded_at)
               < now() - make_interval(secs => %(dead_seconds)s)
           AND NOT (d.status = 'dead' AND d.inbox = ANY(%(ordered)s::text[])
                    AND d.aggregate_id IS NOT NULL
                    AND EXISTS (SELECT FROM pgmsg_inbox_message AS b
                                WHERE b.inbox = d.inbox AND b.aggregate_id = d.aggregate_id
                                  AND (b.transaction_id, b.id) > (d.transaction_id, d.id)
                                  AND b.status = 'pending')))
LIMIT %(limit)s;

-- name: empty_partition
-- Empties a partition at once (a new empty file: no dead rows, nothing for VACUUM).
TRUNCATE {partition};

-- name: restore_kept
INSERT INTO {partition} SELECT * FROM pgmsg_inbox_kept;

-- name: lock_stale_keys
-- Up to %(limit)s keys of pgmsg_inbox_key whose message is no longer in pgmsg_inbox_message
-- (retention removed it), locked. A key a receipt holds (it is storing that id again) is
-- skipped, so the trim never waits for a producer, nor a producer for long on the trim.
SELECT k.inbox, k.message_id FROM pgmsg_inbox_key AS k
WHERE NOT EXISTS (SELECT FROM pgmsg_inbox_message AS m
                  WHERE m.inbox = k.inbox AND m.message_id = k.message_id)
LIMIT %(limit)s
FOR UPDATE OF k SKIP LOCKED;

-- name: delete_stale_keys
-- The keys lock_stale_keys locked, those still without a message: checked again in this
-- statement, which sees every receipt that committed before the locks were taken (one that
-- stored the id again while the first statement ran keeps its key). After the lock, a receipt
-- of such an id waits for this transaction, then inserts the key again.
DELETE FROM pgmsg_inbox_key AS k
USING unnest(%(inboxes)s::text[], %(message_ids)s::text[]) AS s(inbox, message_id)
WHERE k.inbox = s.inbox AND k.message_id = s.message_id
  AND NOT EXISTS (SELECT FROM pgmsg_inbox_message AS m
                  WHERE m.inbox = k.inbox AND m.message_id = k.message_id);

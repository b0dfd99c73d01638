-- name: expired_counts
-- Rows of one partition that retention may remove, by kind, and the rows it must keep:
-- processed longer ago than %(processed_seconds)s, dead or discarded with no change for
-- %(dead_seconds)s (except a dead head that holds an ordered aggregate back); every other row
-- is kept. Read without a lock first for recent partitions (to skip those not worth
-- rewriting), and under the lock before a rewrite.
SELECT count(*) FILTER (WHERE NOT r.kept AND r.status = 'processed'),
       count(*) FILTER (WHERE NOT r.kept AND r.status <> 'processed'),
       count(*) FILTER (WHERE r.kept)
FROM (
    SELECT d.status,
           NOT ((d.status = 'processed'
                 AND d.processed_at < now() - make_interval(secs => %(processed_seconds)s))
                OR (d.status IN ('dead', 'discarded')
                    AND greatest(d.received_at, d.last_failed_at, d.discarded_at)
                        < now() - make_interval(secs => %(dead_seconds)s)
                    AND NOT (d.status = 'dead' AND d.inbox = ANY(%(ordered)s::text[])
                             AND d.aggregate_id IS NOT NULL
                             AND EXISTS (SELECT FROM pgmsg_inbox_message AS b
                                         WHERE b.inbox = d.inbox
                                           AND b.aggregate_id = d.aggregate_id
                                           AND (b.transaction_id, b.id)
                                               > (d.transaction_id, d.id)
                                           AND b.status = 'pending')))) AS kept
    FROM {partition} AS d
) AS r;

-- name: lock_partition
-- While a partition is rewritten nobody reads or writes it; other partitions are not locked.
LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE;

-- name: keep_rows
-- Under the lock: a copy of the rows to keep (expired_counts said how many: at most
-- %(limit)s).
CREATE TEMPORARY TABLE pgmsg_inbox_kept ON COMMIT DROP AS
SELECT d.* FROM {partition} AS d
WHERE NOT ((d.status = 'processed'
            AND d.processed_at < now() - make_interval(secs => %(processed_seconds)s))
           OR (d.status IN ('dead', 'discarded')
               AND greatest(d.received_at, d.last_failed_at, d.discarded_at)
                   < now() - make_interval(secs => %(dead_seconds)s)
               AND NOT (d.status = 'dead' AND d.inbox = ANY(%(ordered)s::text[])
                        AND d.aggregate_id IS NOT NULL
                        AND EXISTS (SELECT FROM pgmsg_inbox_message AS b
                                    WHERE b.inbox = d.inbox AND b.aggregate_id = d.aggregate_id
                                      AND (b.transaction_id, b.id) > (d.transaction_id, d.id)
                                      AND b.status = 'pending'))))
LIMIT %(limit)s;

-- name: empty_partition
-- Empties a partition at once (a new empty file: no dead rows, nothing for VACUUM).
TRUNCATE {partition};

-- name: restore_kept
INSERT INTO {partition} SELECT * FROM pgmsg_inbox_kept;

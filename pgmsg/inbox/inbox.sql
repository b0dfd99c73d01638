-- name: receive
-- Store one message unless its (inbox, message_id) is known, in whichever partition the first
-- copy is: pgmsg_receive (functions.sql) returns the new row's id, or
-- NULL for a duplicate. A concurrent receipt of the same id waits for the first to commit,
-- then gets NULL. The parameters go in this order (sql.numbered: receive() sends it through
-- libpq).
SELECT pgmsg_receive(%(inbox)s, %(message_id)s, %(type)s, %(payload)s, %(source)s,
                     %(aggregate_id)s, %(trace_id)s);

-- name: receive_many
-- Store many messages in one statement; duplicates (stored before, or twice in this batch)
-- are skipped. Returns the message ids that were stored, with their row ids, which follow
-- the batch's order. pgmsg_receive_many (functions.sql) takes the batch's keys in one INSERT,
-- in message id order: two batches that share ids wait for each other instead of
-- deadlocking, and distinct ids never wait. The arrays are binary parameters (bound on the
-- server, wire.rows): quoted on the client they cost a tenth of a bridge's drain.
SELECT stored_key, stored_id
FROM pgmsg_receive_many(%(inbox)s, %(message_ids)b::text[], %(types)b::text[],
                        %(payloads)b::text[], %(sources)b::text[], %(aggregate_ids)b::text[],
                        %(trace_ids)b::text[]);

-- name: claim_types
-- The claims return received_at as microseconds since the epoch: Django's loader of the
-- timestamp was a third of the worker's Python per message in cProfile (source.py turns the
-- number into a datetime with fromtimestamp; the worker's CPU per message fell by 3 to 4 us).
-- One priority level of an inbox's map: lock up to %(limit)s due pending messages of the
-- types %(types)s (with this transaction's id, for the batch's claim record), in arrival order.
-- Each type is one range of the pgmsg_inbox_pending_type index, read in id order and no
-- further than the limit; the worker asks level by level, lowest number first, while the
-- batch has room. (One statement that sorted every due pending message by its type's
-- priority took 58 to 125 ms a claim with 100,000 pending, sorting on disk; a level's claim
-- takes about 0.4 ms.) A level of several types locks up to the limit of each and returns
-- the lowest ids: the others stay locked, unused, until the batch ends. Rows locked by
-- another worker are skipped. %(parts)s/%(part)s select a static share by a stable hash of
-- the aggregate id (the message id when there is none). %(null_aggregate_only)s: ordered
-- inboxes handle messages without an aggregate here.
SELECT c.* FROM unnest(%(types)s::text[]) AS t(type)
CROSS JOIN LATERAL (
    SELECT m.id, m.message_id, m.type, m.source, m.aggregate_id, m.payload::text, m.trace_id,
           m.attempts, (extract(epoch FROM m.received_at) * 1000000)::bigint,
           pg_current_xact_id()::text::bigint
    FROM pgmsg_inbox_message AS m
    WHERE m.inbox = %(inbox)s AND m.status = 'pending' AND m.type = t.type
      AND m.available_at <= now()
      AND (NOT %(null_aggregate_only)s OR m.aggregate_id IS NULL)
      AND (%(parts)s = 1
           OR mod(hashtext(coalesce(m.aggregate_id, m.message_id))::bigint & 2147483647,
                  %(parts)s) = %(part)s)
    ORDER BY m.id
    LIMIT %(limit)s
    FOR UPDATE OF m SKIP LOCKED
) AS c
ORDER BY c.id
LIMIT %(limit)s;

-- name: claim_unordered_fifo
-- claim_types for the types of no priority level (%(mapped)s: the map's types, empty for an
-- inbox without a map), after every level: arrival order straight off the
-- pgmsg_inbox_pending index, from id %(from_id)s on (0: from the start). Acknowledged
-- messages leave their entries at the index's head until vacuum comes, and a claim from the
-- start walks them: read from the start after every batch, a 200,000 backlog drained at 0.15
-- of a 10,000 one's rate (docs/inbox.md). The worker starts past its last batch while
-- batches come back full (source.py says when it reads from the start). The bound is a
-- sub-select so that the planner does not read the index's head to estimate it
-- (claim_notifications in pgmsg/channels/notifications.sql).
SELECT m.id, m.message_id, m.type, m.source, m.aggregate_id, m.payload::text, m.trace_id,
       m.attempts, (extract(epoch FROM m.received_at) * 1000000)::bigint, pg_current_xact_id()::text::bigint
FROM pgmsg_inbox_message AS m
WHERE m.inbox = %(inbox)s AND m.status = 'pending' AND m.available_at <= now()
  AND m.id >= (SELECT %(from_id)s::bigint) AND m.type <> ALL(%(mapped)s::text[])
  AND (NOT %(null_aggregate_only)s OR m.aggregate_id IS NULL)
  AND (%(parts)s = 1
       OR mod(hashtext(coalesce(m.aggregate_id, m.message_id))::bigint & 2147483647,
              %(parts)s) = %(part)s)
ORDER BY m.id
LIMIT %(limit)s
FOR UPDATE OF m SKIP LOCKED;

-- name: ordered_heads
-- Aggregates of an ordered inbox whose head (first pending-or-dead message in receipt order,
-- (transaction_id, id)) is pending, due, and below the read horizon %(horizon)s (its receiving
-- transaction, and every one that could still add an earlier message, has ended), by the
-- head's priority then arrival. With %(below)s false: the heads held back by the horizon
-- alone (the worker looks again shortly: the end of the transaction that holds the horizon
-- wakes nobody). A dead or backing-off head holds its aggregate back.
-- The recursive part walks the distinct open aggregates through the pgmsg_inbox_open_aggregate
-- index (a skip scan: one probe per aggregate, not a read of every open message).
WITH RECURSIVE aggregates AS (
    (SELECT aggregate_id FROM pgmsg_inbox_message
     WHERE inbox = %(inbox)s AND status IN ('pending', 'dead') AND aggregate_id IS NOT NULL
     ORDER BY aggregate_id LIMIT 1)
    UNION ALL
    SELECT (SELECT m.aggregate_id FROM pgmsg_inbox_message AS m
            WHERE m.inbox = %(inbox)s AND m.status IN ('pending', 'dead')
              AND m.aggregate_id > a.aggregate_id
            ORDER BY m.aggregate_id LIMIT 1)
    FROM aggregates AS a WHERE a.aggregate_id IS NOT NULL
)
SELECT a.aggregate_id
FROM aggregates AS a
CROSS JOIN LATERAL (
    SELECT id, type, status, available_at, transaction_id FROM pgmsg_inbox_message
    WHERE inbox = %(inbox)s AND status IN ('pending', 'dead') AND aggregate_id = a.aggregate_id
    ORDER BY transaction_id, id LIMIT 1
) AS h
LEFT JOIN unnest(%(types)s::text[], %(priorities)s::int[]) AS p(type, priority)
       ON p.type = h.type
WHERE a.aggregate_id IS NOT NULL AND h.status = 'pending' AND h.available_at <= now()
  AND (h.transaction_id < %(horizon)s::text::xid8) = %(below)s
  AND (%(parts)s = 1
       OR mod(hashtext(a.aggregate_id)::bigint & 2147483647, %(parts)s) = %(part)s)
ORDER BY coalesce(p.priority, 2147483647), h.id
LIMIT %(limit)s;

-- name: lock_aggregates
-- Take the transaction-level advisory lock of up to %(limit)s aggregates that no other worker
-- holds, in the given order. The scan stops at the limit (no sort, so no lock is taken for a
-- row that is not returned). A hash collision only serialises two aggregates; it never lets
-- two workers share one. The locks go at commit or when the session dies.
SELECT a FROM unnest(%(aggregates)s::text[]) AS a
WHERE pg_try_advisory_xact_lock(hashtext(%(lock_space)s || %(inbox)s), hashtext(a))
LIMIT %(limit)s;

-- name: claim_ordered
-- The first %(per_aggregate)s open messages of each locked aggregate, in receipt order
-- (transaction_id, id); the caller stops an aggregate at its first dead, not-yet-due, failing
-- or not-yet-settled message (transaction_id at or above the horizon: its transaction, or
-- one that may still add an earlier message, was open when the horizon was read). Read after
-- the advisory locks were taken, so a previous holder's commit is visible, and after the
-- horizon, so every message below it is visible.
SELECT m.id, m.message_id, m.type, m.source, m.aggregate_id, m.payload::text, m.trace_id,
       m.attempts, (extract(epoch FROM m.received_at) * 1000000)::bigint, m.status,
       m.available_at <= now() AND m.transaction_id < %(horizon)s::text::xid8,
       pg_current_xact_id()::text::bigint
FROM unnest(%(aggregates)s::text[]) AS a(aggregate_id)
CROSS JOIN LATERAL (
    SELECT id, transaction_id FROM pgmsg_inbox_message
    WHERE inbox = %(inbox)s AND status IN ('pending', 'dead') AND aggregate_id = a.aggregate_id
    ORDER BY transaction_id, id LIMIT %(per_aggregate)s
) AS r
JOIN pgmsg_inbox_message AS m ON m.id = r.id
WHERE m.status IN ('pending', 'dead')
ORDER BY m.aggregate_id, m.transaction_id, m.id
FOR UPDATE OF m;

-- name: ack
-- Processed: marked in the transaction that ran the handlers, which stamps the rows' version
-- itself (what the row trigger pgmsg_inbox_version does for other updates, whose WHEN then
-- skips these rows before comparing them column by column: the trigger call and the
-- comparison took about a third of the server's time per message; docs/inbox.md).
-- %(oldest)s and %(newest)s: the receipt times of the batch's rows (the partition key, as
-- literals): the server plans and scans only the weeks between them, not every partition of
-- the table (id alone names no partition).
UPDATE pgmsg_inbox_message
SET status = 'processed', processed_at = now(), transaction_id = pg_current_xact_id()
WHERE id = ANY(%(ids)s) AND received_at BETWEEN %(oldest)s AND %(newest)s;

-- name: fail
-- Failed: count the attempt, keep the error, and either schedule the retry or make it dead.
UPDATE pgmsg_inbox_message AS m
SET attempts = m.attempts + 1,
    last_error = f.error,
    last_failed_at = now(),
    status = CASE WHEN f.dead THEN 'dead' ELSE 'pending' END,
    available_at = now() + make_interval(secs => f.delay)
FROM unnest(%(ids)s::bigint[], %(errors)s::text[], %(delays)s::float8[], %(dead)s::bool[])
     AS f(id, error, delay, dead)
WHERE m.id = f.id;

-- name: seconds_until_due
-- How long until the next backed-off message of this inbox is due (NULL when none waits).
-- Rows already due are not counted: they are either being handled or held behind a dead
-- head, and waiting for them would spin.
SELECT EXTRACT(EPOCH FROM min(available_at) - now())::float8
FROM pgmsg_inbox_message
WHERE inbox = %(inbox)s AND status = 'pending' AND available_at > now();

-- name: replay
-- Make dead (or retrying) messages due now with fresh attempts, and wake the workers.
WITH replayed AS (
    UPDATE pgmsg_inbox_message
    SET status = 'pending', attempts = 0, available_at = now()
    WHERE inbox = %(inbox)s
      AND (id = ANY(%(ids)s::bigint[]) OR type = %(type)s)
      AND (status = 'dead' OR (status = 'pending' AND attempts > 0))
    RETURNING id
), woken AS (
    SELECT pg_notify('pgmsg', 'inbox:' || %(inbox)s) WHERE EXISTS (SELECT FROM replayed)
)
SELECT (SELECT count(*) FROM replayed), (SELECT count(*) FROM woken);

-- name: discard
-- Settle dead or pending messages without handling them, keeping why; an ordered aggregate
-- held back by a discarded head moves on, so the workers are woken.
WITH discarded AS (
    UPDATE pgmsg_inbox_message
    SET status = 'discarded', discarded_at = now(), discard_reason = %(reason)s
    WHERE inbox = %(inbox)s
      AND (id = ANY(%(ids)s::bigint[]) OR type = %(type)s)
      AND status IN ('dead', 'pending')
    RETURNING id
), woken AS (
    SELECT pg_notify('pgmsg', 'inbox:' || %(inbox)s) WHERE EXISTS (SELECT FROM discarded)
)
SELECT (SELECT count(*) FROM discarded), (SELECT count(*) FROM woken);

-- name: purge_dead
-- Retention: delete up to %(limit)s dead or discarded messages whose last change is older than
-- %(seconds)s. A dead head of an ordered inbox that still holds messages back is kept: deleting
-- it would silently let its aggregate move on.
DELETE FROM pgmsg_inbox_message
WHERE id IN (
    SELECT d.id FROM pgmsg_inbox_message AS d
    WHERE d.inbox = ANY(%(inboxes)s::text[]) AND d.status IN ('dead', 'discarded')
      AND greatest(d.received_at, d.last_failed_at, d.discarded_at)
          < now() - make_interval(secs => %(seconds)s)
      AND NOT (d.status = 'dead' AND d.inbox = ANY(%(ordered)s::text[])
               AND d.aggregate_id IS NOT NULL
               AND EXISTS (SELECT FROM pgmsg_inbox_message AS b
                           WHERE b.inbox = d.inbox AND b.aggregate_id = d.aggregate_id
                             AND (b.transaction_id, b.id) > (d.transaction_id, d.id)
                             AND b.status = 'pending'))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
);

-- name: health
-- Per inbox: pending, dead, age of the oldest pending message, processed in the last minute.
-- One indexed subquery each, so the processed rows kept for retention are not read.
SELECT i.inbox,
       (SELECT count(*) FROM pgmsg_inbox_message
        WHERE inbox = i.inbox AND status = 'pending'),
       (SELECT count(*) FROM pgmsg_inbox_message
        WHERE inbox = i.inbox AND status = 'dead'),
       coalesce(EXTRACT(EPOCH FROM now() - (SELECT min(received_at) FROM pgmsg_inbox_message
                                            WHERE inbox = i.inbox AND status = 'pending')),
                0)::float8,
       (SELECT count(*) FROM pgmsg_inbox_message
        WHERE inbox = i.inbox AND status = 'processed'
          AND processed_at >= now() - interval '1 minute')
FROM unnest(%(inboxes)s::text[]) AS i(inbox);

-- name: stored_names
-- The inboxes with pending or dead messages, declared or not: one index probe per name (a
-- loose scan of pgmsg_inbox_open_aggregate), not a read of every held message.
WITH RECURSIVE found(inbox) AS (
    (SELECT inbox FROM pgmsg_inbox_message
     WHERE status IN ('pending', 'dead') ORDER BY inbox LIMIT 1)
    UNION ALL
    SELECT (SELECT m.inbox FROM pgmsg_inbox_message AS m
            WHERE m.status IN ('pending', 'dead') AND m.inbox > found.inbox
            ORDER BY m.inbox LIMIT 1)
    FROM found WHERE found.inbox IS NOT NULL
)
SELECT inbox FROM found WHERE inbox IS NOT NULL;

-- name: stats
-- Per message type of one inbox: messages held (received and not yet purged), and by status.
SELECT type,
       count(*),
       count(*) FILTER (WHERE status = 'processed'),
       count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'dead'),
       count(*) FILTER (WHERE status = 'discarded')
FROM pgmsg_inbox_message
WHERE inbox = %(inbox)s
GROUP BY type
ORDER BY type;

-- name: gaps
-- Ordered inboxes: aggregates whose head failed (dead, or pending after failures), with how
-- many messages wait behind it.
SELECT h.aggregate_id, h.id, h.message_id, h.type, h.status, h.attempts, h.last_error,
       (SELECT count(*) FROM pgmsg_inbox_message AS b
        WHERE b.inbox = %(inbox)s AND b.aggregate_id = h.aggregate_id
          AND (b.transaction_id, b.id) > (h.transaction_id, h.id) AND b.status = 'pending')
FROM (
    SELECT DISTINCT ON (aggregate_id) aggregate_id, id, message_id, type, status, attempts,
           last_error, transaction_id
    FROM pgmsg_inbox_message
    WHERE inbox = %(inbox)s AND status IN ('pending', 'dead') AND aggregate_id IS NOT NULL
    ORDER BY aggregate_id, transaction_id, id
) AS h
WHERE h.status = 'dead' OR h.attempts > 0
ORDER BY h.id;

-- name: create_partitions
-- One row per partition, created once, at the checkpoint (%(xid)s, 0): 0 for a subscription
-- that starts at the beginning, the readers' horizon for one that starts "now" (events of
-- transactions that have ended are passed over).
INSERT INTO pgmsg_subscription_partition
    (subscription, partition, checkpoint_transaction, checkpoint_position, status, attempts,
     last_error, handled)
SELECT %(subscription)s, p, %(xid)s, 0, 'active', 0, '', 0
FROM generate_series(0, %(count)s - 1) AS p
ON CONFLICT (subscription, partition) DO NOTHING;

-- name: partition_count
SELECT count(*), max(partition) FROM pgmsg_subscription_partition
WHERE subscription = %(subscription)s;

-- name: partition_index_exists
SELECT to_regclass(%(name)s) IS NOT NULL;

-- name: lock_partition_indexes
-- One creator of partition indexes at a time (two workers starting together would otherwise
-- race to create the same index name).
SELECT pg_advisory_xact_lock(1885826371, 0);

-- name: create_partition_index
-- A format template (names and literals filled in by subscriptions.partition_index, never from
-- a parameter): the partition's bucket as read_ordered computes it, after the category when
-- the subscription has one, then the read order. With it, a partition's read is one range of
-- this index holding only its own events; the planner matches the expression because the
-- bucket count and key reach the server as literals (Django binds on the client).
CREATE INDEX IF NOT EXISTS {name} ON pgmsg_event
    ({leading}abs(mod(hashtextextended({key}, 0), {partitions})), transaction_id, position);

-- name: analyze_events
-- Statistics of every month's events, with the expressions of the partition indexes.
ANALYZE pgmsg_event;

-- name: due_partitions
-- Partitions worth a look, with their checkpoints (no lock here: lock_partition decides), and
-- whether archived events lie after the checkpoint (pgmsg_archive --force): such a partition
-- is due even with nothing to read, to be stopped there.
SELECT p.partition, p.checkpoint_transaction, p.checkpoint_position,
       EXISTS (SELECT FROM pgmsg_archive AS a
               WHERE a.status = 'archived' AND a.end_transaction_id IS NOT NULL
                 AND (a.end_transaction_id, a.end_position)
                     > (p.checkpoint_transaction, p.checkpoint_position))
FROM pgmsg_subscription_partition AS p
WHERE p.subscription = %(subscription)s AND p.partition = ANY(%(partitions)s::int[])
  AND p.status = 'active' AND p.next_attempt_at <= now()
ORDER BY p.partition;

-- name: read_horizon_here
-- The read horizon (pgmsg/core/horizon.sql), kept for the rest of this transaction as
-- pgmsg.read_horizon: sent with lock_and_read in one query string, whose next statement reads
-- below it with a snapshot taken after this one ended.
SELECT set_config('pgmsg.read_horizon', pgmsg_read_horizon()::text, true);

-- name: lock_and_read
-- Hold one partition for this transaction and read its next events, in one statement (one
-- round trip). SKIP LOCKED: no row when another worker holds it, or it is stopped or backing
-- off. FOR UPDATE returns the row's latest committed checkpoint; locking gives this transaction
-- its id, returned for the batch's claim record (pgmsg/core/claims.py). Then up to
-- %(limit)s of its events after the checkpoint the lock returns (the latest committed one),
-- below the horizon %(xmin)s read by an earlier statement. The event columns are those of
-- read_ordered, NULL when nothing is to be read; the filters are read_ordered's, written the
-- same way so that the partition's index (create_partition_index) serves the read. Sixth
-- column: the first archive (pgmsg_archive --force) holding events after the checkpoint, as
-- "partition (archived to path)", NULL when none: such a partition must stop there rather
-- than pass over them. It is looked up in "held", once: in the outer select list it ran once
-- per event returned (1.6 ms of a 5.4 ms read of 1,000 events).
-- %(xmin)s NULL: the horizon is this transaction's pgmsg.read_horizon setting, which
-- read_horizon_here set in the previous statement of the same query string (one round trip
-- for both after a wake-up).
-- %(floor)s (NULL: none): read only months from this recorded_at on, which PostgreSQL prunes
-- at planning (the value is a literal: Django binds on the client), skipping sealed months
-- wholly below the checkpoint (events/partitions.py). Seventh column: whether the floor holds
-- for the checkpoint the lock returned: that checkpoint is at or above the transaction id the
-- floor was computed for (a reset may have moved it back), the seals it relies on still stand
-- (same partitions, same bounds), and no event lies below the oldest of them (the default
-- partition). When it does not, the caller reads again without a floor.
WITH held AS (
    SELECT p.id, p.checkpoint_transaction, p.checkpoint_position, p.attempts,
           pg_current_xact_id()::text::bigint AS xid,
           (SELECT a.partition || ' (archived to ' || a.path || ')' FROM pgmsg_archive AS a
            WHERE a.status = 'archived' AND a.end_transaction_id IS NOT NULL
              AND (a.end_transaction_id, a.end_position)
                  > (p.checkpoint_transaction, p.checkpoint_position)
            ORDER BY a.lower
            LIMIT 1) AS archived,
           (%(floor)s::timestamptz IS NULL
            OR (p.checkpoint_transaction >= %(floor_xid)s::bigint
                AND (SELECT count(*) FROM pg_constraint AS c
                     JOIN unnest(%(floor_oids)s::bigint[], %(floor_seals)s::text[])
                          AS s(relation, name)
                       ON c.conrelid = s.relation::oid AND c.conname = s.name
                     WHERE c.contype = 'c') = cardinality(%(floor_oids)s::bigint[])
                AND NOT EXISTS (SELECT FROM pgmsg_event AS below
                                WHERE below.recorded_at < %(floor_lowest)s::timestamptz)))
           AS floor_ok
    FROM pgmsg_subscription_partition AS p
    WHERE p.subscription = %(subscription)s AND p.partition = %(partition)s
      AND p.status = 'active' AND p.next_attempt_at <= now()
    FOR UPDATE SKIP LOCKED
)
SELECT held.id, held.checkpoint_transaction, held.checkpoint_position, held.attempts, held.xid,
       held.archived, held.floor_ok,
       e.*
FROM held LEFT JOIN LATERAL (
    SELECT position, transaction_id::text AS xid, stream_name, version, type, data::text,
           metadata::text, message_id,
           (extract(epoch FROM recorded_at) * 1000000)::bigint AS recorded_at_us
    FROM pgmsg_event
    WHERE (transaction_id, position)
          > (held.checkpoint_transaction::text::xid8, held.checkpoint_position)
      AND transaction_id < coalesce(%(xmin)s::text, current_setting('pgmsg.read_horizon'))::xid8
      AND (%(floor)s::timestamptz IS NULL OR recorded_at >= %(floor)s::timestamptz)
      AND (%(category)s::text IS NULL OR category = %(category)s::text)
      AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
      AND (%(partitions)s::int = 1 OR abs(mod(hashtextextended(
            CASE %(key_source)s::text
                WHEN 'stream' THEN stream_name
                WHEN 'data' THEN coalesce(data ->> %(key)s::text, '')
                ELSE coalesce(metadata ->> %(key)s::text, '')
            END, 0), %(partitions)s::int)) = %(partition)s::int)
    ORDER BY transaction_id, position
    LIMIT %(limit)s
) AS e ON true
ORDER BY e.xid::xid8, e.position;

-- name: read_partition
-- lock_and_read for a subscription of one partition, through pgmsg_read_partition (migrations
-- 0019 and 0020): the same columns, a plan kept for the session instead of a parse and plan per
-- call. The partition's columns come once, in the first row (its event columns NULL), instead
-- of on every event's row: the caller takes the partition from the first row and the events
-- from the rows with an event position, which reads lock_and_read's rows the same way. With
-- %(xmin)s NULL, the function reads the horizon itself, before it locks and reads, and returns
-- it in the partition's row, in a last column of its own (no read_horizon_here before it).
SELECT * FROM pgmsg_read_partition(
    %(subscription)s, %(partition)s, %(xmin)s::text, %(category)s::text, %(types)s::text[],
    %(limit)s, %(floor)s::timestamptz, %(floor_xid)s::bigint, %(floor_oids)s::bigint[],
    %(floor_seals)s::text[], %(floor_lowest)s::timestamptz);

-- name: archive_end
-- The read-order key of the last archived event (reset --to archive moves past it).
SELECT end_transaction_id, end_position FROM pgmsg_archive
WHERE status = 'archived' AND end_transaction_id IS NOT NULL
ORDER BY end_transaction_id DESC, end_position DESC
LIMIT 1;

-- name: advance_idle
-- Nothing to handle between the lowest checkpoint and the horizon: move the idle partitions
-- (not held by a worker, not failing, not reset below that checkpoint meanwhile) to the
-- horizon, so that later reads start there. Never past archived events (they were not read:
-- they are gone), which lock_partition stops at instead.
UPDATE pgmsg_subscription_partition
SET checkpoint_transaction = %(xid)s, checkpoint_position = 0
WHERE id IN (
    SELECT p.id FROM pgmsg_subscription_partition AS p
    WHERE p.subscription = %(subscription)s AND p.partition = ANY(%(partitions)s::int[])
      AND p.status = 'active' AND p.attempts = 0
      AND (p.checkpoint_transaction, p.checkpoint_position) < (%(xid)s::bigint, 0)
      AND (p.checkpoint_transaction, p.checkpoint_position)
          >= (%(low_xid)s::bigint, %(low_position)s::bigint)
      AND NOT EXISTS (SELECT FROM pgmsg_archive AS a
                      WHERE a.status = 'archived' AND a.end_transaction_id IS NOT NULL
                        AND (a.end_transaction_id, a.end_position)
                            > (p.checkpoint_transaction, p.checkpoint_position))
    FOR UPDATE OF p SKIP LOCKED
);

-- name: advance
-- Move the checkpoint, in the transaction that ran the handlers; never backwards.
UPDATE pgmsg_subscription_partition
SET (checkpoint_transaction, checkpoint_position) = (
        SELECT CASE WHEN (%(xid)s::bigint, %(position)s::bigint)
                         > (checkpoint_transaction, checkpoint_position)
                    THEN %(xid)s::bigint ELSE checkpoint_transaction END,
               CASE WHEN (%(xid)s::bigint, %(position)s::bigint)
                         > (checkpoint_transaction, checkpoint_position)
                    THEN %(position)s::bigint ELSE checkpoint_position END),
    attempts = 0, last_error = '', failed_position = NULL,
    handled = handled + %(handled)s, updated_at = now()
WHERE id = %(id)s;

-- name: fail
-- A handler failed: keep what the batch got done, count the attempt, keep the error, and
-- either back off or stop the partition.
UPDATE pgmsg_subscription_partition
SET checkpoint_transaction = %(xid)s, checkpoint_position = %(position)s,
    handled = handled + %(handled)s,
    attempts = CASE WHEN %(handled)s > 0 THEN 1 ELSE attempts + 1 END,
    last_error = %(error)s, failed_position = %(failed_position)s,
    status = CASE WHEN %(stop)s THEN 'stopped' ELSE 'active' END,
    next_attempt_at = now() + make_interval(secs => %(delay)s),
    updated_at = now()
WHERE id = %(id)s;

-- name: seconds_until_due
-- How long until the next backed-off partition is due (NULL when none waits). Partitions
-- due already are left out: another worker holds them, and counting them would spin.
SELECT EXTRACT(EPOCH FROM min(next_attempt_at) - now())::float8
FROM pgmsg_subscription_partition
WHERE subscription = %(subscription)s AND partition = ANY(%(partitions)s::int[])
  AND status = 'active' AND attempts > 0 AND next_attempt_at > now();

-- name: reset
-- Move partitions to a checkpoint and make them active. The UPDATE waits for a worker that
-- holds a partition to commit its batch.
UPDATE pgmsg_subscription_partition
SET checkpoint_transaction = %(xid)s, checkpoint_position = %(position)s,
    status = 'active', attempts = 0, last_error = '', failed_position = NULL,
    next_attempt_at = now(), updated_at = now()
WHERE subscription = %(subscription)s AND partition = ANY(%(partitions)s::int[]);

-- name: retry
UPDATE pgmsg_subscription_partition
SET status = 'active', attempts = 0, next_attempt_at = now(), updated_at = now()
WHERE subscription = %(subscription)s AND partition = ANY(%(partitions)s::int[])
  AND (status = 'stopped' OR attempts > 0);

-- name: skip
-- Pass over the failed event: the checkpoint moves to it (it counts as done).
UPDATE pgmsg_subscription_partition AS p
SET checkpoint_transaction = e.transaction_id::text::bigint, checkpoint_position = e.position,
    status = 'active', attempts = 0, last_error = '', failed_position = NULL,
    next_attempt_at = now(), updated_at = now()
FROM pgmsg_event AS e
WHERE p.subscription = %(subscription)s AND p.partition = ANY(%(partitions)s::int[])
  AND (p.status = 'stopped' OR p.attempts > 0) AND e.position = p.failed_position;

-- name: wake
SELECT pg_notify('pgmsg', %(payload)s);

-- name: partition_behind
-- How far a partition is behind the head: its events stored after the checkpoint (at most
-- %(cap)s are counted) and the oldest of their recording times. The filters are those of
-- read_ordered in events.sql (category, types, the partition's hash bucket).
SELECT count(*), min(recorded_at) FROM (
    SELECT recorded_at FROM pgmsg_event
    WHERE (transaction_id, position) > (%(xid)s::text::xid8, %(position)s::bigint)
      AND (%(category)s::text IS NULL OR category = %(category)s::text)
      AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
      AND (%(partitions)s::int = 1 OR abs(mod(hashtextextended(
            CASE %(key_source)s::text
                WHEN 'stream' THEN stream_name
                WHEN 'data' THEN coalesce(data ->> %(key)s::text, '')
                ELSE coalesce(metadata ->> %(key)s::text, '')
            END, 0), %(partitions)s::int)) = %(partition)s::int)
    ORDER BY transaction_id, position
    LIMIT %(cap)s
) AS behind;

-- name: last_handled
-- The partition's last event at or before its checkpoint (the last one handled or skipped).
SELECT position, recorded_at FROM pgmsg_event
WHERE (transaction_id, position) <= (%(xid)s::text::xid8, %(position)s::bigint)
  AND (%(category)s::text IS NULL OR category = %(category)s::text)
  AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(partitions)s::int = 1 OR abs(mod(hashtextextended(
        CASE %(key_source)s::text
            WHEN 'stream' THEN stream_name
            WHEN 'data' THEN coalesce(data ->> %(key)s::text, '')
            ELSE coalesce(metadata ->> %(key)s::text, '')
        END, 0), %(partitions)s::int)) = %(partition)s::int)
ORDER BY transaction_id DESC, position DESC
LIMIT 1;

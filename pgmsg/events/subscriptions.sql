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

-- name: partition_reads_exist
-- Whether the partition index and the partition read function named are there.
SELECT to_regclass(%(index)s) IS NOT NULL, to_regproc(%(function)s) IS NOT NULL;

-- name: lock_partition_indexes
-- One creator of partition indexes and read functions at a time (two workers starting
-- together would otherwise race to create the same index, or to replace the same function).
SELECT pg_advisory_xact_lock(%(lock_class)s, 0);

-- name: create_partition_index
-- A format template (names and literals filled in by subscriptions.partition_index, never from
-- a parameter): the partition's bucket as read_ordered computes it, after the category when
-- the subscription has one, then the read order. With it, a partition's read is one range of
-- this index holding only its own events; the planner matches the expression because the
-- bucket count and key reach the server as literals (Django binds on the client).
CREATE INDEX IF NOT EXISTS {name} ON pgmsg_event
    ({leading}abs(mod(hashtextextended({key}, 0), {partitions})), transaction_id, position);

-- name: partition_read_events
-- A format template (filled in by subscriptions.partition_read, names and literals never from
-- a parameter): how the function through which a subscription of more than one partition
-- holds a partition reads its events. The function is pgmsg_read_partition's text
-- (functions.sql) up to its read of the events, then this: its read with the partition's
-- bucket as one more condition, written as the partition index (create_partition_index) has
-- it, so that the plan the session keeps reads one range of that index: as a parameter the
-- bucket count and key would not match the index's literals, and a statement with them as
-- literals is parsed and planned on every read (0.6 to 1 ms). Subscriptions that share an
-- index share its function; its name changes with its text.
    -- Its events after the checkpoint, below the horizon, in read order (the partition's
    -- columns NULL). The floor (since) prunes months when the executor starts.
    RETURN QUERY
    SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::int, NULL::bigint, NULL::text,
           NULL::boolean,
           ev.position, ev.transaction_id::text, ev.stream_name, ev.version, ev.type,
           ev.data::text, ev.metadata::text, ev.message_id,
           (extract(epoch FROM ev.recorded_at) * 1000000)::bigint, NULL::bigint, NULL::boolean
    FROM pgmsg_event AS ev
    WHERE {category}abs(mod(hashtextextended({key}, 0), {partitions})) = partition_number
      AND (ev.transaction_id, ev.position) > (after_xid, after_position)
      AND ev.transaction_id < below
      AND ev.recorded_at >= since
      AND (type_names IS NULL OR ev.type = ANY(type_names))
    ORDER BY ev.transaction_id, ev.position
    LIMIT batch_limit;
END $$;

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

-- name: read_partition
-- Hold one partition for this transaction and read its next events, in one statement (one
-- round trip) through the partition's read function: pgmsg_read_partition
-- (functions.sql) for a subscription of one partition, the one subscriptions.partition_read
-- made for more (subscriptions.read_function names it; {function} is filled in with that name). A
-- function keeps its statements' plans for the session: no parse and plan per read. The
-- partition's columns come once, in the first row (its event columns NULL), then the events
-- (the partition's columns NULL). With %(xmin)s NULL, the function reads the read horizon
-- (pgmsg/core/horizon.sql) itself, before it locks and reads, and returns it in the
-- partition's row, in a column of its own; the last says whether a crash is on record.
SELECT * FROM {function}(
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

-- name: commit_without_flush
-- A batch that read no event: its COMMIT need not wait for the WAL flush. Holding the
-- partition gave the transaction an id, so its commit would otherwise wait for one, on every
-- look of a lingering or sweeping worker (0.3 to 0.8 ms each on the 2-core machine). Losing
-- it in a server crash loses only a checkpoint moved over nothing to handle, and a reset
-- attempt count; the next read finds the same nothing again.
SET LOCAL synchronous_commit = off;

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

-- name: send
-- Store one message of an exactly-once channel and wake idle workers of its channel
-- (pgmsg_send, functions.sql: a function, so that the server keeps the insert's plan).
SELECT pgmsg_send(%(channel)s, %(payload)s);

-- name: send_prepared
-- notify()'s statement where it is prepared on the connection (PGMSG["PREPARE_STATEMENTS"]):
-- pgmsg_send's steps written out, since calling any PL/pgSQL function costs its first call in
-- each transaction some 10 us of server time (a fifth of the whole prepared insert's; measured
-- in docs/decisions.md). The CASE runs its steps in order: unless this transaction already woke
-- the channel, hold the producing key shared until the transaction ends and mark the channel
-- woken (the lock's void shows as ''), then probe the idle key (taken, so no worker is idle:
-- release it) and NOTIFY where a worker holds it. The CTE runs once, before the insert reads
-- its one row. Unprepared, this text costs more to parse and plan than pgmsg_send() saves.
WITH woken AS (
    SELECT CASE
        WHEN current_setting('pgmsg.woken', true) IS NOT DISTINCT FROM %(channel)s::text
            THEN true
        WHEN (pg_advisory_xact_lock_shared(1885826370, hashtext(%(channel)s))::text
              || set_config('pgmsg.woken', %(channel)s, true)) IS NULL
            THEN NULL
        WHEN pg_try_advisory_lock(1885826377, hashtext(%(channel)s))
            THEN pg_advisory_unlock(1885826377, hashtext(%(channel)s))
        ELSE pg_notify('pgmsg', %(channel)s)::text = ''
    END
)
INSERT INTO pgmsg_notification (channel, payload, created_at)
SELECT %(channel)s, %(payload)s::jsonb, statement_timestamp() FROM woken
RETURNING id;

-- name: send_many
-- Store many messages in one statement (one wake-up per channel).
SELECT pgmsg_send_many(%(channels)s::text[], %(payloads)s::text[]);

-- name: broadcast
-- Plain NOTIFY of a broadcast channel; delivered at commit to every listening session.
SELECT pg_notify(%(notify_channel)s, %(payload)s);

-- name: claim_notifications
-- Take up to %(limit)s due notifications of the given channels, oldest first (the primary key,
-- the table's one full index, read in order), by deleting them inside the worker's
-- transaction: rows locked by another worker are skipped, so
-- concurrent workers never claim the same row, and a crash (rollback) puts them back.
-- Deleting at claim time writes each row once; a select-then-delete claim writes it twice
-- (the row lock, then the delete) and was a third slower in bench/notifications.py.
-- Each row comes with this transaction's id (to record the claim, which also counts the rows'
-- crashes: see pgmsg/core/claims.py), and whether any claim of notifications whose batch died
-- is on record (a sub-select run once): when none is, no row claimed can be a suspect, and the
-- handlers need not wait for the record's answer. A batch that died holding rows had ended
-- before this statement could lock them; its record had committed before its handlers ran
-- unless it ran them without waiting and died within moments (docs/channels.md).
-- %(from_id)s: where the index read starts. While a backlog lasts, the worker starts past the
-- rows it claimed last (see NotificationSource), so that each batch does not walk the index
-- entries of the rows already deleted, which lie at the head of the key until vacuum takes
-- them; 0 reads from the start.
-- The planner must not look at the ids' actual range: it does so by reading the index from
-- its lowest entry, over those same deleted rows' entries, when it costs a join on id (the
-- form "id IN (SELECT ...)") or a literal bound near the lowest id. Planning then took 0.3 ms
-- at the start of a 1,000,000 backlog and 1 ms at 70 % of it. So the ids are an array (the
-- DELETE finds each by the primary key, no join) and the bound a sub-select (a value the
-- planner does not know).
DELETE FROM pgmsg_notification
WHERE id = ANY(ARRAY(
    SELECT id FROM pgmsg_notification
    WHERE available_at <= now() AND channel = ANY(%(channels)s)
      AND id >= (SELECT %(from_id)s::bigint)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
))
-- Timestamps come back as text: they are only written back by restore_notifications, and
-- parsing them into datetimes for every row costs more than the rest of the decoding.
RETURNING id, channel, payload::text, attempts, available_at::text, created_at::text,
          last_error, last_failed_at::text, pg_current_xact_id()::text::bigint,
          (SELECT EXISTS (SELECT FROM pgmsg_claim AS k
                          WHERE k.kind = 'notification'
                            AND pg_xact_status(k.transaction_id::text::xid8) = 'aborted'));

-- name: restore_notifications
-- Put back, in the same transaction, the claimed rows that were not handled: failures with
-- their attempt counted, error kept and retry scheduled, and rows left unhandled by a stopping
-- worker as they were (delay NULL); a failure that gives up goes to the dead letters instead.
-- Then wake the idle workers of the channels of the rows put back (pgmsg_wake, as pgmsg_send
-- does; created_at is written, so its default does not wake).
WITH failed AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(channels)s::text[], %(payloads)s::text[],
                         %(attempts)s::int[], %(available_at)s::text[]::timestamptz[],
                         %(created_at)s::text[]::timestamptz[], %(errors)s::text[],
                         %(failed_at)s::text[]::timestamptz[], %(delays)s::float8[],
                         %(dead)s::bool[])
         AS r(id, channel, payload, attempts, available_at, created_at, last_error,
              last_failed_at, delay, dead)
), died AS (
    INSERT INTO pgmsg_notification_dead
        (id, channel, payload, attempts, created_at, last_error, last_failed_at)
    SELECT id, channel, payload::jsonb,
           attempts + CASE WHEN delay IS NULL THEN 0 ELSE 1 END,
           created_at, last_error,
           CASE WHEN delay IS NULL THEN last_failed_at ELSE now() END
    FROM failed WHERE dead
), restored AS (
    INSERT INTO pgmsg_notification
        (id, channel, payload, attempts, available_at, created_at, last_error, last_failed_at)
    SELECT id, channel, payload::jsonb,
           attempts + CASE WHEN delay IS NULL THEN 0 ELSE 1 END,
           CASE WHEN delay IS NULL THEN available_at ELSE now() + make_interval(secs => delay) END,
           created_at, last_error,
           CASE WHEN delay IS NULL THEN last_failed_at ELSE now() END
    FROM failed WHERE NOT dead
    RETURNING channel
)
SELECT count(*) FROM (SELECT DISTINCT channel FROM restored) AS c, LATERAL pgmsg_wake(c.channel);

-- name: seconds_until_due
-- How long until the next delayed retry of these channels is due (NULL when none waits).
-- Rows already due are left out: the worker just claimed what it could, so they are held by
-- another worker's batch, and counting them would make an idle worker spin (a batch that
-- rolls back is found again by the sweep). A row not yet due is a retry or one an SQL
-- producer delayed, both in the pgmsg_notification_retrying index, whose condition this
-- repeats so that the planner uses it.
SELECT EXTRACT(EPOCH FROM min(available_at) - now())::float8
FROM pgmsg_notification
WHERE channel = ANY(%(channels)s) AND available_at > now()
  AND (available_at > created_at OR attempts > 0);

-- name: undeclared_channels
-- Pending rows of channels that no declaration of this project names, counted by channel.
-- It reads the whole table (no index has every row's channel: see pgmsg/models), once every
-- UNDECLARED_CHECK_INTERVAL (5 minutes) a worker.
SELECT channel, count(*) FROM pgmsg_notification
WHERE channel <> ALL(%(declared)s::text[])
GROUP BY channel ORDER BY channel;

-- name: replay_notifications
-- Make dead letters (moved back, with their ids) and retrying notifications due now with
-- fresh attempts, and wake the workers. The UPDATE reads the table as the statement began, so
-- it does not see the rows moved back.
WITH revived AS (
    DELETE FROM pgmsg_notification_dead WHERE id = ANY(%(ids)s)
    RETURNING id, channel, payload, created_at, last_error, last_failed_at
), moved AS (
    INSERT INTO pgmsg_notification
        (id, channel, payload, attempts, available_at, created_at, last_error, last_failed_at)
    SELECT id, channel, payload, 0, now(), created_at, last_error, last_failed_at FROM revived
    RETURNING channel
), retried AS (
    UPDATE pgmsg_notification SET attempts = 0, available_at = now()
    WHERE id = ANY(%(ids)s) AND attempts > 0
    RETURNING channel
), woken AS (
    SELECT pg_notify('pgmsg', channel)
    FROM (SELECT channel FROM moved UNION SELECT channel FROM retried) AS c
)
SELECT (SELECT count(*) FROM moved) + (SELECT count(*) FROM retried), (SELECT count(*) FROM woken);

-- name: discard_notifications
-- Delete dead notifications for good.
DELETE FROM pgmsg_notification_dead WHERE id = ANY(%(ids)s);

-- name: analyze_lock
-- One worker at a time analyzes (the others go on claiming).
SELECT pg_try_advisory_xact_lock(%(lock_class)s, 0);

-- name: analyze
ANALYZE pgmsg_notification;

-- The SQL of migration 0001_squashed_0030, frozen: never edit it (a database that ran it
-- keeps what it ran). Each block is one RunSQL of the migration, by name. The functions
-- are those of pgmsg/*/functions.sql when the migrations were squashed.

-- name: functions
-- function: pgmsg_wake
CREATE OR REPLACE FUNCTION pgmsg_wake(payload text, scope text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- Held until this transaction ends: a worker declaring itself idle waits for it before
    -- its last look at its tables, so this producer's rows are seen then or it NOTIFYs.
    PERFORM pg_advisory_xact_lock_shared(1885826370, hashtext(payload));
    IF scope IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared(1885826370, hashtext(scope));
    END IF;
    -- Someone idle holds the idle key shared, so the exclusive try fails; otherwise it is
    -- released at once. NOTIFY only then: a busy system commits without it.
    IF (CASE WHEN pg_try_advisory_lock(1885826377, hashtext(payload))
             THEN NOT pg_advisory_unlock(1885826377, hashtext(payload)) ELSE true END)
       OR (scope IS NOT NULL
           AND CASE WHEN pg_try_advisory_lock(1885826377, hashtext(scope))
                    THEN NOT pg_advisory_unlock(1885826377, hashtext(scope)) ELSE true END)
    THEN
        PERFORM pg_notify('pgmsg', payload);
    END IF;
END $$;

-- function: pgmsg_wake_idle
CREATE OR REPLACE FUNCTION pgmsg_wake_idle(
    missing text[], settle text[], OUT declared text[], OUT settled boolean
) LANGUAGE plpgsql AS $$
BEGIN
    -- Declare: hold the idle key of each payload (shared: many workers may be idle).
    SELECT coalesce(array_agg(p), '{}') INTO declared FROM unnest(missing) AS p
    WHERE pg_try_advisory_lock_shared(1885826377, hashtext(p));
    -- Barrier: no producer of these payloads is between its wake check and its end.
    SELECT coalesce(bool_and(CASE WHEN pg_try_advisory_lock(1885826370, hashtext(p))
                                  THEN pg_advisory_unlock(1885826370, hashtext(p))
                                  ELSE false END), true)
    INTO settled FROM unnest(settle) AS p;
END $$;

-- function: pgmsg_wake_busy
CREATE OR REPLACE FUNCTION pgmsg_wake_busy(payloads text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- Withdraw: release every idle key this session holds for these payloads.
    PERFORM pg_advisory_unlock_shared(1885826377, hashtext(p)) FROM unnest(payloads) AS p;
END $$;

-- function: pgmsg_read_horizon
CREATE OR REPLACE FUNCTION pgmsg_read_horizon() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    -- A simple expression: in a volatile function it gets a snapshot of its own, as the
    -- query below does.
    snap pg_snapshot := pg_current_snapshot();
BEGIN
    -- No transaction in progress on the server (prepared ones included: they are in the
    -- snapshot): every id below xmax has ended.
    IF pg_snapshot_xmin(snap) = pg_snapshot_xmax(snap) THEN
        RETURN pg_snapshot_xmax(snap)::text::bigint;
    END IF;
    -- Else migration 0018's query, which says how the horizon is read.
    RETURN (
        WITH snap AS (
            SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax,
                   pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS cluster_xmin
        ), sessions AS (
            SELECT s.xid, s.visible
            FROM (SELECT pg_stat_clear_snapshot()::text AS cleared) AS c
            CROSS JOIN LATERAL (
                SELECT a.backend_xid::text::bigint AS xid,
                       (pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
                        OR pg_has_role(current_user, a.usesysid, 'USAGE')) AS visible
                FROM pg_stat_activity AS a
                WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                  AND c.cleared IS NOT DISTINCT FROM c.cleared
                UNION ALL
                SELECT p.transaction::text::bigint, true
                FROM pg_prepared_xacts AS p WHERE p.database = current_database()
            ) AS s
        )
        SELECT CASE WHEN bool_and(sessions.visible) IS FALSE THEN snap.cluster_xmin
                    ELSE least(snap.xmax, min(snap.xmax - (mod(mod(snap.xmax, 4294967296) - sessions.xid
                                                               + 6442450944, 4294967296) - 2147483648)))
               END
        FROM snap LEFT JOIN sessions ON true
        GROUP BY snap.xmax, snap.cluster_xmin
    );
END $$;

-- function: pgmsg_notification_created
CREATE OR REPLACE FUNCTION pgmsg_notification_created() RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    done text;  -- takes the value of calls made for their effect (the fast path: no PERFORM)
BEGIN
    -- A row inserted without pgmsg_send(): wake the workers of every stored channel (the
    -- default cannot see the row's channel), unless this transaction's last wake was this one.
    IF current_setting('pgmsg.woken', true) IS DISTINCT FROM 'channels:*' THEN
        PERFORM pgmsg_wake('channels:*');
        done := set_config('pgmsg.woken', 'channels:*', true);
    END IF;
    RETURN statement_timestamp();
END $$;

-- function: pgmsg_send
CREATE OR REPLACE FUNCTION pgmsg_send(channel_name text, payload_text text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    sent bigint;
    done text;  -- takes the value of calls made for their effect (the fast path: no PERFORM)
BEGIN
    -- notify(): unless this transaction already woke for the channel, pgmsg_wake's check:
    -- hold the producing key shared until the transaction ends (the idle worker's barrier
    -- waits for it), NOTIFY when a worker holds the channel's idle key, and mark the channel
    -- woken (transaction-local, undone with a rolled-back savepoint, as the lock is). Then
    -- insert, with created_at written here so that its waking default does not run;
    -- PL/pgSQL keeps the insert's plan for the session.
    IF current_setting('pgmsg.woken', true) IS DISTINCT FROM channel_name THEN
        done := pg_advisory_xact_lock_shared(1885826370, hashtext(channel_name))::text;
        IF (CASE WHEN pg_try_advisory_lock(1885826377, hashtext(channel_name))
                 THEN NOT pg_advisory_unlock(1885826377, hashtext(channel_name))
                 ELSE true END) THEN
            done := pg_notify('pgmsg', channel_name)::text;
        END IF;
        done := set_config('pgmsg.woken', channel_name, true);
    END IF;
    INSERT INTO pgmsg_notification (channel, payload, created_at)
    VALUES (channel_name, payload_text::jsonb, statement_timestamp()) RETURNING id INTO sent;
    RETURN sent;
END $$;

-- function: pgmsg_send_many
CREATE OR REPLACE FUNCTION pgmsg_send_many(channel_names text[], payload_texts text[])
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    sent bigint;
BEGIN
    -- notify_many(): one wake per distinct channel, then the insert (created_at written, so
    -- its waking default does not run).
    PERFORM pgmsg_wake(c), set_config('pgmsg.woken', c, true)
    FROM (SELECT DISTINCT c FROM unnest(channel_names) AS c) AS d;
    INSERT INTO pgmsg_notification (channel, payload, created_at)
    SELECT c, p::jsonb, statement_timestamp() FROM unnest(channel_names, payload_texts) AS m(c, p);
    GET DIAGNOSTICS sent = ROW_COUNT;
    RETURN sent;
END $$;

-- function: pgmsg_append
CREATE OR REPLACE FUNCTION pgmsg_append(
    stream text, category text, event_types text[], event_data text[], event_metadata text[],
    message_ids uuid[], expected_version int DEFAULT NULL
) RETURNS int
LANGUAGE plpgsql AS $$
-- As in 0018 (the version check under the stream's row lock, transaction ids), and then what
-- the triggers on pgmsg_event did for other inserts: message ids into pgmsg_event_key, a
-- unique violation for an id that comes twice or that another event holds, and the wake-up of
-- 'events:<category>' (scope 'events') with pgmsg_wake's locks and check, once per
-- transaction and category (the woken mark, as pgmsg_send).
DECLARE
    added int := cardinality(event_types);
    txid xid8;
    version_after int;
    keyed int;
    taken uuid;
    payload text := 'events:' || category;
    done text;  -- takes the value of calls made for their effect (PL/pgSQL's fast path)
BEGIN
    IF coalesce(expected_version, 0) = 0 THEN
        INSERT INTO pgmsg_stream AS s (name, version, transaction_id)
        VALUES (stream, added, pg_current_xact_id())
        ON CONFLICT (name) DO UPDATE
            SET version = s.version + added,
                transaction_id = greatest(s.transaction_id, pg_current_xact_id())
            WHERE expected_version IS NULL OR s.version = expected_version
        RETURNING s.version, s.transaction_id INTO version_after, txid;
    ELSE
        UPDATE pgmsg_stream AS s
        SET version = s.version + added,
            transaction_id = greatest(s.transaction_id, pg_current_xact_id())
        WHERE s.name = stream AND s.version = expected_version
        RETURNING s.version, s.transaction_id INTO version_after, txid;
    END IF;
    IF version_after IS NULL THEN
        RETURN NULL;
    END IF;
    -- The mark is undone with the transaction or savepoint if the INSERT fails.
    done := set_config('pgmsg.appending', 'on', true);
    INSERT INTO pgmsg_event
        (stream_name, category, version, type, data, metadata, message_id, transaction_id)
    SELECT stream, category, version_after - added + e.n, e.type, e.data::jsonb,
           e.metadata::jsonb, e.message_id, txid
    FROM unnest(event_types, event_data, event_metadata, message_ids)
         WITH ORDINALITY AS e(type, data, metadata, message_id, n)
    ORDER BY e.n;
    done := set_config('pgmsg.appending', '', true);
    -- A concurrent append of the same id waits here for the other transaction to end.
    INSERT INTO pgmsg_event_key (message_id)
    SELECT unnest(message_ids) ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS keyed = ROW_COUNT;
    IF keyed < added THEN
        -- An id twice in the call, or a key there already: refuse it if another event holds
        -- it (this call's events are the stream's last `added` versions). A key without its
        -- event lets the event in. pgmsg_event is read only here: planning that read locks
        -- every month's table until the transaction ends, which would hold up archiving.
        SELECT k INTO taken FROM unnest(message_ids) AS k GROUP BY k HAVING count(*) > 1 LIMIT 1;
        IF taken IS NULL THEN
            SELECT k INTO taken FROM unnest(message_ids) AS k
            WHERE EXISTS (SELECT FROM pgmsg_event AS e
                          WHERE e.message_id = k
                            AND NOT (e.stream_name = stream
                                     AND e.version > version_after - added))
            LIMIT 1;
        END IF;
        IF taken IS NOT NULL THEN
            RAISE unique_violation USING MESSAGE = format('message id %s is stored already', taken);
        END IF;
    END IF;
    IF current_setting('pgmsg.woken', true) IS DISTINCT FROM payload THEN
        done := pg_advisory_xact_lock_shared(1885826370, hashtext(payload))::text;
        done := pg_advisory_xact_lock_shared(1885826370, hashtext('events'))::text;
        IF (CASE WHEN pg_try_advisory_lock(1885826377, hashtext(payload))
                 THEN NOT pg_advisory_unlock(1885826377, hashtext(payload))
                 ELSE true END)
           OR (CASE WHEN pg_try_advisory_lock(1885826377, hashtext('events'))
                    THEN NOT pg_advisory_unlock(1885826377, hashtext('events'))
                    ELSE true END) THEN
            done := pg_notify('pgmsg', payload)::text;
        END IF;
        done := set_config('pgmsg.woken', payload, true);
    END IF;
    RETURN version_after;
END $$;

-- function: pgmsg_read_partition
CREATE OR REPLACE FUNCTION pgmsg_read_partition(
    subscription_name text, partition_number int, horizon text, category_name text,
    type_names text[], batch_limit int, floor_at timestamptz, floor_xid bigint,
    floor_oids bigint[], floor_seals text[], floor_lowest timestamptz
) RETURNS TABLE (
    id bigint, checkpoint_transaction bigint, checkpoint_position bigint, attempts int,
    xid bigint, archived text, floor_ok boolean, event_position bigint, event_xid text,
    stream_name text, version int, type text, data text, metadata text, message_id uuid,
    recorded_at_us bigint, horizon_used bigint, crash_on_record boolean
)
LANGUAGE plpgsql
-- One plan per statement and session (0019): the filters are written so that the generic plan
-- is the good one.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    -- NULL: read it now, in a statement (and snapshot) before the lock's and the read's.
    below xid8 := coalesce(horizon, pgmsg_read_horizon()::text)::xid8;
    since timestamptz := coalesce(floor_at, '-infinity');
    after_xid xid8;
    after_position bigint;
BEGIN
    -- Hold the partition: no row when another worker holds it, or it is stopped or backing
    -- off. crash_on_record: a claim of events whose batch died is on record (0029).
    SELECT p.id, p.checkpoint_transaction, p.checkpoint_position, p.attempts,
           pg_current_xact_id()::text::bigint,
           (SELECT a.partition || ' (archived to ' || a.path || ')'
            FROM pgmsg_archive AS a
            WHERE a.status = 'archived' AND a.end_transaction_id IS NOT NULL
              AND (a.end_transaction_id, a.end_position)
                  > (p.checkpoint_transaction, p.checkpoint_position)
            ORDER BY a.lower
            LIMIT 1),
           (floor_at IS NULL
            OR (p.checkpoint_transaction >= floor_xid
                AND (SELECT count(*) FROM pg_constraint AS c
                     JOIN unnest(floor_oids, floor_seals) AS s(relation, name)
                       ON c.conrelid = s.relation::oid AND c.conname = s.name
                     WHERE c.contype = 'c') = cardinality(floor_oids)
                AND NOT EXISTS (SELECT FROM pgmsg_event AS earlier
                                WHERE earlier.recorded_at < floor_lowest))),
           EXISTS (SELECT FROM pgmsg_claim AS k
                   WHERE k.kind = 'event'
                     AND pg_xact_status(k.transaction_id::text::xid8) = 'aborted')
    INTO id, checkpoint_transaction, checkpoint_position, attempts, xid, archived, floor_ok,
         crash_on_record
    FROM pgmsg_subscription_partition AS p
    WHERE p.subscription = subscription_name AND p.partition = partition_number
      AND p.status = 'active' AND p.next_attempt_at <= now()
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    horizon_used := below::text::bigint;
    RETURN NEXT;  -- the partition's row: its columns and the horizon, the event columns NULL
    after_xid := checkpoint_transaction::text::xid8;
    after_position := checkpoint_position;
    IF category_name IS NULL THEN
        RETURN QUERY
        SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::int, NULL::bigint, NULL::text,
               NULL::boolean,
               ev.position, ev.transaction_id::text, ev.stream_name, ev.version, ev.type,
               ev.data::text, ev.metadata::text, ev.message_id,
               (extract(epoch FROM ev.recorded_at) * 1000000)::bigint, NULL::bigint,
               NULL::boolean
        FROM pgmsg_event AS ev
        WHERE (ev.transaction_id, ev.position) > (after_xid, after_position)
          AND ev.transaction_id < below
          AND ev.recorded_at >= since
          AND (type_names IS NULL OR ev.type = ANY(type_names))
        ORDER BY ev.transaction_id, ev.position
        LIMIT batch_limit;
    ELSE
        RETURN QUERY
        SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::int, NULL::bigint, NULL::text,
               NULL::boolean,
               ev.position, ev.transaction_id::text, ev.stream_name, ev.version, ev.type,
               ev.data::text, ev.metadata::text, ev.message_id,
               (extract(epoch FROM ev.recorded_at) * 1000000)::bigint, NULL::bigint,
               NULL::boolean
        FROM pgmsg_event AS ev
        WHERE ev.category = category_name
          AND (ev.transaction_id, ev.position) > (after_xid, after_position)
          AND ev.transaction_id < below
          AND ev.recorded_at >= since
          AND (type_names IS NULL OR ev.type = ANY(type_names))
        ORDER BY ev.transaction_id, ev.position
        LIMIT batch_limit;
    END IF;
END $$;

-- function: pgmsg_receive
CREATE OR REPLACE FUNCTION pgmsg_receive(
    inbox_name text, message_key text, message_type text, payload_text text,
    source_name text DEFAULT '', aggregate_key text DEFAULT NULL, trace text DEFAULT ''
) RETURNS bigint
LANGUAGE plpgsql AS $$
-- Store one message in inbox_name unless its message id is stored there already (in
-- whichever partition): the new row's id, or NULL for a duplicate. A concurrent receipt of
-- the same id waits for the first one's transaction, then returns NULL. The checks and the
-- lock are those of the trigger pgmsg_inbox_first_receipt (pgmsg/models/inbox.py); the
-- wake-up is pgmsg_wake's, once per transaction and inbox (the woken mark, as pgmsg_send).
DECLARE
    stored bigint;
    wake_payload text := 'inbox:' || inbox_name;
    done text;  -- takes the value of calls made for their effect (PL/pgSQL's fast path)
BEGIN
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'pgmsg: inbox % message %: receive in a READ COMMITTED or '
            'SERIALIZABLE transaction (REPEATABLE READ cannot see a concurrent first copy)',
            inbox_name, message_key USING ERRCODE = 'feature_not_supported';
    END IF;
    done := pg_advisory_xact_lock(
        hashtext('pgmsg.inbox.key'), hashtext(inbox_name || ':' || message_key) & 1023)::text;
    IF EXISTS (SELECT FROM pgmsg_inbox_message AS m
               WHERE m.inbox = inbox_name AND m.message_id = message_key) THEN
        RETURN NULL;
    END IF;
    -- The mark is undone with the transaction or savepoint if the INSERT fails.
    done := set_config('pgmsg.receiving', 'on', true);
    INSERT INTO pgmsg_inbox_message
        (inbox, message_id, type, payload, source, aggregate_id, trace_id)
    VALUES (inbox_name, message_key, message_type, payload_text::jsonb, source_name,
            aggregate_key, trace)
    RETURNING id INTO stored;
    done := set_config('pgmsg.receiving', '', true);
    IF current_setting('pgmsg.woken', true) IS DISTINCT FROM wake_payload THEN
        done := pg_advisory_xact_lock_shared(1885826370, hashtext(wake_payload))::text;
        IF (CASE WHEN pg_try_advisory_lock(1885826377, hashtext(wake_payload))
                 THEN NOT pg_advisory_unlock(1885826377, hashtext(wake_payload))
                 ELSE true END) THEN
            done := pg_notify('pgmsg', wake_payload)::text;
        END IF;
        done := set_config('pgmsg.woken', wake_payload, true);
    END IF;
    RETURN stored;
END $$;

-- name: event_transaction_ids
ALTER TABLE pgmsg_event ADD COLUMN transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX pgmsg_event_read_order ON pgmsg_event (transaction_id, position);
CREATE INDEX pgmsg_event_category_order ON pgmsg_event (category, transaction_id, position);
ALTER TABLE pgmsg_stream ADD COLUMN transaction_id xid8;

-- name: inbox_transaction_ids
ALTER TABLE pgmsg_inbox_message ADD COLUMN transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id();

-- name: inbox_open_receipt
CREATE INDEX pgmsg_inbox_open_receipt ON pgmsg_inbox_message (inbox, aggregate_id, transaction_id, id) WHERE status IN ('pending', 'dead');

-- name: inbox_partitioned
CREATE SEQUENCE pgmsg_inbox_message_id_next;
SELECT setval('pgmsg_inbox_message_id_next',
              coalesce((SELECT max(id) FROM pgmsg_inbox_message), 0) + 1, false);
CREATE TABLE pgmsg_inbox_message_next
    (LIKE pgmsg_inbox_message INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (received_at);
ALTER TABLE pgmsg_inbox_message_next
    ALTER COLUMN id SET DEFAULT nextval('pgmsg_inbox_message_id_next');
CREATE TABLE pgmsg_inbox_message_default PARTITION OF pgmsg_inbox_message_next DEFAULT;
DO $$
DECLARE week timestamp;
BEGIN
    FOR week IN
        SELECT generate_series(
            date_trunc('week', coalesce(min(received_at), now()) AT TIME ZONE 'UTC'),
            date_trunc('week', now() AT TIME ZONE 'UTC') + interval '2 weeks',
            interval '1 week')
        FROM pgmsg_inbox_message
    LOOP
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF pgmsg_inbox_message_next FOR VALUES FROM (%L) TO (%L)',
            'pgmsg_inbox_message_p' || to_char(week, 'YYYYMMDD'),
            week AT TIME ZONE 'UTC', (week + interval '1 week') AT TIME ZONE 'UTC');
    END LOOP;
END $$;
INSERT INTO pgmsg_inbox_message_next SELECT * FROM pgmsg_inbox_message;
DROP TABLE pgmsg_inbox_message;
ALTER TABLE pgmsg_inbox_message_next RENAME TO pgmsg_inbox_message;
ALTER SEQUENCE pgmsg_inbox_message_id_next RENAME TO pgmsg_inbox_message_id_seq;
ALTER SEQUENCE pgmsg_inbox_message_id_seq OWNED BY pgmsg_inbox_message.id;
ALTER TABLE pgmsg_inbox_message
    ADD CONSTRAINT pgmsg_inbox_message_pkey PRIMARY KEY (id, received_at);
CREATE INDEX pgmsg_inbox_pending ON pgmsg_inbox_message (inbox, id) WHERE status = 'pending';
CREATE INDEX pgmsg_inbox_open_aggregate ON pgmsg_inbox_message (inbox, aggregate_id, id)
    WHERE status IN ('pending', 'dead');
CREATE INDEX pgmsg_inbox_processed ON pgmsg_inbox_message (inbox, processed_at)
    WHERE status = 'processed';
CREATE INDEX pgmsg_inbox_open_receipt ON pgmsg_inbox_message
    (inbox, aggregate_id, transaction_id, id) WHERE status IN ('pending', 'dead');

-- name: events_partitioned
CREATE SEQUENCE pgmsg_event_position_next;
SELECT setval('pgmsg_event_position_next',
              coalesce((SELECT max(position) FROM pgmsg_event), 0) + 1, false);
CREATE TABLE pgmsg_event_next
    (LIKE pgmsg_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (recorded_at);
ALTER TABLE pgmsg_event_next
    ALTER COLUMN position SET DEFAULT nextval('pgmsg_event_position_next');
CREATE TABLE pgmsg_event_default PARTITION OF pgmsg_event_next DEFAULT;
DO $$
DECLARE month timestamp;
BEGIN
    FOR month IN
        SELECT generate_series(
            date_trunc('month', coalesce(min(recorded_at), now()) AT TIME ZONE 'UTC'),
            date_trunc('month', now() AT TIME ZONE 'UTC') + interval '2 months',
            interval '1 month')
        FROM pgmsg_event
    LOOP
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF pgmsg_event_next FOR VALUES FROM (%L) TO (%L)',
            'pgmsg_event_p' || to_char(month, 'YYYYMM'),
            month AT TIME ZONE 'UTC', (month + interval '1 month') AT TIME ZONE 'UTC');
    END LOOP;
END $$;
INSERT INTO pgmsg_event_next SELECT * FROM pgmsg_event;
DROP TABLE pgmsg_event;
ALTER TABLE pgmsg_event_next RENAME TO pgmsg_event;
ALTER SEQUENCE pgmsg_event_position_next RENAME TO pgmsg_event_position_seq;
ALTER SEQUENCE pgmsg_event_position_seq OWNED BY pgmsg_event.position;
ALTER TABLE pgmsg_event ADD CONSTRAINT pgmsg_event_pkey PRIMARY KEY (position, recorded_at);
CREATE INDEX pgmsg_event_version ON pgmsg_event (stream_name, version);
CREATE INDEX pgmsg_event_message_id ON pgmsg_event (message_id);
CREATE INDEX pgmsg_event_read_order ON pgmsg_event (transaction_id, position);
CREATE INDEX pgmsg_event_category_order ON pgmsg_event (category, transaction_id, position);

-- name: outbox_partitioned
CREATE SEQUENCE pgmsg_outbox_message_id_next;
SELECT setval('pgmsg_outbox_message_id_next',
              greatest(coalesce((SELECT max(id) FROM pgmsg_outbox_message), 0),
                       (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
                        FROM pgmsg_outbox_message_id_seq)) + 1, false);
CREATE TABLE pgmsg_outbox_message_next
    (LIKE pgmsg_outbox_message INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (created_at);
ALTER TABLE pgmsg_outbox_message_next
    ALTER COLUMN id SET DEFAULT nextval('pgmsg_outbox_message_id_next');
CREATE TABLE pgmsg_outbox_message_default PARTITION OF pgmsg_outbox_message_next DEFAULT;
DO $$
DECLARE week timestamp;
BEGIN
    FOR week IN
        SELECT generate_series(
            date_trunc('week', coalesce(min(created_at), now()) AT TIME ZONE 'UTC'),
            date_trunc('week', now() AT TIME ZONE 'UTC') + interval '2 weeks',
            interval '1 week')
        FROM pgmsg_outbox_message
    LOOP
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF pgmsg_outbox_message_next FOR VALUES FROM (%L) TO (%L)',
            'pgmsg_outbox_message_p' || to_char(week, 'YYYYMMDD'),
            week AT TIME ZONE 'UTC', (week + interval '1 week') AT TIME ZONE 'UTC');
    END LOOP;
END $$;
INSERT INTO pgmsg_outbox_message_next SELECT * FROM pgmsg_outbox_message;
DROP TABLE pgmsg_outbox_message;
ALTER TABLE pgmsg_outbox_message_next RENAME TO pgmsg_outbox_message;
ALTER SEQUENCE pgmsg_outbox_message_id_next RENAME TO pgmsg_outbox_message_id_seq;
ALTER SEQUENCE pgmsg_outbox_message_id_seq OWNED BY pgmsg_outbox_message.id;
ALTER TABLE pgmsg_outbox_message
    ADD CONSTRAINT pgmsg_outbox_message_pkey PRIMARY KEY (id, created_at);
CREATE INDEX pgmsg_outbox_pending ON pgmsg_outbox_message (outbox, id) WHERE status = 'pending';
CREATE INDEX pgmsg_outbox_failed ON pgmsg_outbox_message (outbox, key, id)
    WHERE status = 'dead' OR attempts > 0;

-- name: claim_ids_storage
ALTER TABLE pgmsg_claim ALTER COLUMN ids SET STORAGE EXTERNAL;

-- name: notification_stored
CREATE VIEW pgmsg_notification_stored AS
SELECT id, channel, payload, 'pending'::varchar(8) AS status, attempts, available_at,
       created_at, last_error, last_failed_at
FROM pgmsg_notification
UNION ALL
SELECT id, channel, payload, 'dead'::varchar(8), attempts, NULL::timestamptz, created_at,
       last_error, last_failed_at
FROM pgmsg_notification_dead;

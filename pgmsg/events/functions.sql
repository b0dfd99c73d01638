-- The SQL functions of append() and of a subscription's read (pgmsg/events/events.sql,
-- subscriptions.sql), as a migrated database holds them.
-- Edit here, then freeze a copy into a new migration (pgmsg/migrations/README.md);
-- pgmsg_tests/core/test_schema_sql.py checks the database against this file.

-- function: pgmsg_append
-- append() (events/events.sql): the version check under the stream's row lock, then the
-- work of pgmsg_event's two statement triggers (message keys, wake-up), around an INSERT it
-- marks (pgmsg.appending) so that the triggers' WHEN skips it without a call.
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
-- A subscription of one partition holds the partition and reads its events in one call
-- (events/subscriptions.sql, read_partition; docs/events.md, "Reading a partition"): the
-- partition's row first (with the horizon read and whether a crash is on record), then the
-- events. A function, so that the session keeps one generic plan per statement.
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
-- The filters are written so that the generic plan is the good one: the category (when
-- given) an index condition, the floor a bound that prunes months when the executor starts.
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

-- The SQL function of receive() (pgmsg/inbox/inbox.sql), as a migrated database holds it.
-- Edit here, then freeze a copy into a new migration (pgmsg/migrations/README.md);
-- pgmsg_tests/core/test_schema_sql.py checks the database against this file.

-- function: pgmsg_receive
-- receive() (inbox/inbox.sql): the checks of the first-receipt trigger (its key in
-- pgmsg_inbox_key, migration 0033) and the wake-up, around an INSERT it marks
-- (pgmsg.receiving) so that the triggers' WHEN skips it.
CREATE OR REPLACE FUNCTION pgmsg_receive(
    inbox_name text, message_key text, message_type text, payload_text text,
    source_name text DEFAULT '', aggregate_key text DEFAULT NULL, trace text DEFAULT ''
) RETURNS bigint
LANGUAGE plpgsql AS $$
-- Store one message in inbox_name unless its message id is stored there already (in
-- whichever partition): the new row's id, or NULL for a duplicate. A concurrent receipt of
-- the same id waits for the first one's transaction, then returns NULL. The checks and the
-- key are those of the trigger pgmsg_inbox_first_receipt (pgmsg/models/inbox.py): a new key
-- in pgmsg_inbox_key means no copy anywhere; a key there already is locked, then the
-- partitions are looked up. The wake-up is pgmsg_wake's, once per transaction and inbox
-- (the woken mark, as pgmsg_send).
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
    LOOP
        INSERT INTO pgmsg_inbox_key (inbox, message_id) VALUES (inbox_name, message_key)
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
        PERFORM FROM pgmsg_inbox_key AS k
        WHERE k.inbox = inbox_name AND k.message_id = message_key FOR UPDATE;
        IF FOUND THEN
            IF EXISTS (SELECT FROM pgmsg_inbox_message AS m
                       WHERE m.inbox = inbox_name AND m.message_id = message_key) THEN
                RETURN NULL;
            END IF;
            EXIT;
        END IF;
    END LOOP;
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

-- function: pgmsg_receive_many
-- receive_many() (inbox/inbox.sql): pgmsg_receive for a batch, set-based. The batch's keys go
-- into pgmsg_inbox_key in one INSERT (in message id order); only the ids whose key was there
-- already take pgmsg_receive's per-id path (lock the key, look at the partitions). The rows
-- then go in with the pgmsg.receiving mark, so that the first-receipt trigger's 100 calls of
-- a 100-message batch (one key insert each) are not made.
CREATE OR REPLACE FUNCTION pgmsg_receive_many(
    inbox_name text, message_keys text[], message_types text[], payload_texts text[],
    source_names text[], aggregate_keys text[], traces text[]
) RETURNS TABLE (stored_key text, stored_id bigint)
LANGUAGE plpgsql AS $$
-- Store each message of the batch unless its message id is stored in inbox_name already (in
-- whichever partition) or earlier in the batch: the stored ones' message ids with their new
-- row ids, which follow the batch's order (an ordered inbox handles an aggregate's messages
-- in id order). A concurrent receipt of a batch's id waits for the first one's transaction,
-- then skips it. Keys are taken in message id order, so two batches that share ids wait for
-- each other instead of deadlocking; distinct ids never wait.
DECLARE
    fresh text[];
    known text[];
    accepted text[];
    message_key text;
    wake_payload text := 'inbox:' || inbox_name;
    done text;  -- takes the value of calls made for their effect (PL/pgSQL's fast path)
BEGIN
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'pgmsg: inbox %: receive in a READ COMMITTED or SERIALIZABLE '
            'transaction (REPEATABLE READ cannot see a concurrent first copy)',
            inbox_name USING ERRCODE = 'feature_not_supported';
    END IF;
    WITH taken AS (
        INSERT INTO pgmsg_inbox_key (inbox, message_id)
        SELECT DISTINCT inbox_name, k FROM unnest(message_keys) AS k ORDER BY 2
        ON CONFLICT DO NOTHING
        RETURNING message_id
    )
    SELECT coalesce(array_agg(message_id), '{}') INTO fresh FROM taken;
    SELECT coalesce(array_agg(DISTINCT k ORDER BY k), '{}') INTO known
    FROM unnest(message_keys) AS k WHERE k <> ALL(fresh);
    accepted := fresh;
    -- The ids whose key was there already: pgmsg_receive's loop, one id at a time.
    FOREACH message_key IN ARRAY known LOOP
        LOOP
            INSERT INTO pgmsg_inbox_key (inbox, message_id) VALUES (inbox_name, message_key)
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                accepted := accepted || message_key;
                EXIT;
            END IF;
            PERFORM FROM pgmsg_inbox_key AS k
            WHERE k.inbox = inbox_name AND k.message_id = message_key FOR UPDATE;
            IF FOUND THEN
                IF NOT EXISTS (SELECT FROM pgmsg_inbox_message AS m
                               WHERE m.inbox = inbox_name AND m.message_id = message_key) THEN
                    accepted := accepted || message_key;
                END IF;
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
    IF cardinality(accepted) = 0 THEN
        RETURN;
    END IF;
    -- The mark is undone with the transaction or savepoint if the INSERT fails.
    done := set_config('pgmsg.receiving', 'on', true);
    RETURN QUERY
    INSERT INTO pgmsg_inbox_message AS m
        (id, inbox, message_id, type, payload, source, aggregate_id, trace_id)
    SELECT b.id, inbox_name, b.message_id, b.type, b.payload::jsonb, b.source,
           b.aggregate_id, b.trace_id
    FROM (SELECT nextval('pgmsg_inbox_message_id_seq') AS id, f.*
          FROM (SELECT DISTINCT ON (u.message_id) u.*
                FROM unnest(message_keys, message_types, payload_texts, source_names,
                            aggregate_keys, traces)
                     WITH ORDINALITY AS u(message_id, type, payload, source, aggregate_id,
                                          trace_id, n)
                WHERE u.message_id = ANY(accepted)
                ORDER BY u.message_id, u.n) AS f
          ORDER BY f.n) AS b
    RETURNING m.message_id, m.id;
    done := set_config('pgmsg.receiving', '', true);
    -- Once per batch, so pgmsg_wake's call costs nothing worth inlining (pgmsg_receive does).
    IF current_setting('pgmsg.woken', true) IS DISTINCT FROM wake_payload THEN
        PERFORM pgmsg_wake(wake_payload);
        done := set_config('pgmsg.woken', wake_payload, true);
    END IF;
END $$;

-- The SQL of migration 0035_receive_many_function, frozen: never edit it.

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

-- The SQL functions of notify() and notify_many() (pgmsg/channels/notifications.sql), as a
-- migrated database holds them.
-- Edit here, then freeze a copy into a new migration (pgmsg/migrations/README.md);
-- pgmsg_tests/core/test_schema_sql.py checks the database against this file.

-- function: pgmsg_notification_created
-- created_at's default of pgmsg_notification: it wakes the workers of every stored channel
-- ('channels:*') for a row inserted without pgmsg_send() (SQL producers, trigger channels,
-- the ORM). No trigger on the table: PostgreSQL copies a table's trigger descriptions and
-- compiles each WHEN for every INSERT, which cost notify() 0.81 -> 0.87 of a plain INSERT.
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
-- notify() (channels/notifications.sql, send): pgmsg_wake's locks and check written inline,
-- as expressions PL/pgSQL evaluates on its fast path (no PERFORM, no nested call), and
-- created_at written so that its waking default does not run.
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
-- notify_many(): one wake per distinct channel, then one INSERT.
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

-- name: take_bridge
-- The session-level lock of one bridge: its holder alone consumes the bridge's queue, stream
-- or session, for as long as its connection lives; when it dies, another process's next try
-- takes it (takeover). Returns true when this session holds it.
SELECT pg_try_advisory_lock(hashtext(%(lock_space)s || %(bridge)s), 0);

-- name: store_rejected
-- Messages the bridge cannot map (no id, a body that is not JSON, too large) go straight in
-- as dead letters of the inbox, the reason in last_error and the raw body in the payload: the
-- broker is acked once this commits. The first-receipt trigger skips an id the inbox holds
-- (a redelivered reject); no aggregate id, so a reject never holds an ordered aggregate back.
INSERT INTO pgmsg_inbox_message
    (inbox, message_id, type, payload, source, status, last_error, last_failed_at)
SELECT %(inbox)s, r.message_id, r.type, r.payload::jsonb, %(source)s, 'dead', r.error, now()
FROM unnest(%(message_ids)s::text[], %(types)s::text[], %(payloads)s::text[],
            %(errors)s::text[]) AS r(message_id, type, payload, error)
ORDER BY r.message_id
RETURNING message_id;

-- name: report
-- A bridge's state, written by the process that runs it.
INSERT INTO pgmsg_inbox_bridge
    (name, inbox, broker, connected, error, last_message_at, lag, pid, updated_at)
VALUES (%(name)s, %(inbox)s, %(broker)s, %(connected)s, %(error)s, %(last_message_at)s,
        %(lag)s, %(pid)s, now())
ON CONFLICT (name) DO UPDATE
SET inbox = EXCLUDED.inbox, broker = EXCLUDED.broker, connected = EXCLUDED.connected,
    error = EXCLUDED.error,
    last_message_at = coalesce(EXCLUDED.last_message_at, pgmsg_inbox_bridge.last_message_at),
    lag = EXCLUDED.lag, pid = EXCLUDED.pid, updated_at = now();

-- name: states
-- The bridges' reported states, with the seconds since each was written.
SELECT name, inbox, broker, connected, error, last_message_at, lag,
       EXTRACT(EPOCH FROM now() - updated_at)::float8
FROM pgmsg_inbox_bridge
WHERE %(names)s::text[] IS NULL OR name = ANY(%(names)s::text[])
ORDER BY name;

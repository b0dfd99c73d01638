-- name: insert_notification
-- Store one message of an exactly-once channel; the statement trigger NOTIFYs the workers.
INSERT INTO pgmsg_notification (channel, payload) VALUES (%(channel)s, %(payload)s::jsonb)
RETURNING id;

-- name: insert_notifications
-- Store many messages in one statement (one NOTIFY per channel).
INSERT INTO pgmsg_notification (channel, payload)
SELECT c, p::jsonb FROM unnest(%(channels)s::text[], %(payloads)s::text[]) AS m(c, p);

-- name: broadcast
-- Plain NOTIFY of a broadcast channel; delivered at commit to every listening session.
SELECT pg_notify(%(notify_channel)s, %(payload)s);

-- name: claim_notifications
-- Lock up to %(limit)s due notifications of the given channels, oldest first. Rows locked by
-- another worker are skipped, so concurrent workers never claim the same row.
SELECT id, channel, payload::text, attempts
FROM pgmsg_notification
WHERE status = 'pending' AND available_at <= now() AND channel = ANY(%(channels)s)
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: ack_notifications
-- Handled: the rows go, in the transaction that ran their listeners.
DELETE FROM pgmsg_notification WHERE id = ANY(%(ids)s);

-- name: fail_notifications
-- Failed: count the attempt, keep the error, and either schedule the retry or make it dead.
UPDATE pgmsg_notification AS n
SET attempts = n.attempts + 1,
    last_error = f.error,
    last_failed_at = now(),
    status = CASE WHEN f.dead THEN 'dead' ELSE 'pending' END,
    available_at = now() + make_interval(secs => f.delay)
FROM unnest(%(ids)s::bigint[], %(errors)s::text[], %(delays)s::float8[], %(dead)s::bool[])
     AS f(id, error, delay, dead)
WHERE n.id = f.id;

-- name: seconds_until_due
-- How long until the next delayed retry of these channels is due (NULL when none waits).
SELECT EXTRACT(EPOCH FROM min(available_at) - now())::float8
FROM pgmsg_notification
WHERE status = 'pending' AND channel = ANY(%(channels)s);

-- name: replay_notifications
-- Make dead (or retrying) notifications due now with fresh attempts, and wake the workers.
WITH replayed AS (
    UPDATE pgmsg_notification
    SET status = 'pending', attempts = 0, available_at = now()
    WHERE id = ANY(%(ids)s) AND (status = 'dead' OR attempts > 0)
    RETURNING channel
), woken AS (
    SELECT pg_notify('pgmsg', channel) FROM (SELECT DISTINCT channel FROM replayed) AS c
)
SELECT (SELECT count(*) FROM replayed), (SELECT count(*) FROM woken);

-- name: discard_notifications
-- Delete dead notifications for good.
DELETE FROM pgmsg_notification WHERE id = ANY(%(ids)s) AND status = 'dead';

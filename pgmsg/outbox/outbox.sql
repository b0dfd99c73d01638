-- The transactional outbox: publish in the producer's transaction, claim and settle in the relay.
-- The advisory-lock class of an outbox is hashtext(%(lock_space)s || name), lock_space being
-- core/locks.py's OUTBOX.

-- name: publish
-- One message. A keyed message first takes the transaction-level lock of (outbox, key), so a
-- second transaction publishing to the same key waits for this one to end before its row gets
-- an id: one key's ids follow commit order. A message id the outbox still holds is skipped (no
-- row returned) by the trigger pgmsg_outbox_first_publish (models/outbox.py), whichever
-- partition holds it.
WITH locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtext(%(lock_space)s || %(outbox)s), hashtext(%(key)s))
    WHERE %(key)s::text IS NOT NULL
)
INSERT INTO pgmsg_outbox_message (outbox, message_id, destination, topic, type, key, payload,
                                  headers)
SELECT %(outbox)s, %(message_id)s, %(destination)s, %(topic)s, %(type)s, %(key)s,
       %(payload)s::jsonb, %(headers)s::jsonb
FROM (SELECT count(*) FROM locked) AS l
RETURNING id;

-- name: publish_many
-- Many messages of one outbox in one statement; the keys are locked first, in sorted order (two
-- such statements cannot deadlock on each other), then the rows get their ids in the given
-- order. Rows go in in message id order, each taking its key in pgmsg_outbox_key (the trigger
-- pgmsg_outbox_first_publish in models/outbox.py): two batches that share ids, inserted
-- concurrently in different orders, would each wait for a key the other holds (a deadlock);
-- in one order, one waits. Distinct ids never wait for each other. Known ids are skipped.
WITH locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtext(%(lock_space)s || %(outbox)s), hashtext(k))
    FROM (SELECT DISTINCT k FROM unnest(%(keys)s::text[]) AS k WHERE k IS NOT NULL
          ORDER BY k) AS s
), numbered AS MATERIALIZED (
    SELECT nextval('pgmsg_outbox_message_id_seq') AS id, u.*
    FROM unnest(%(message_ids)s::text[], %(topics)s::text[], %(types)s::text[],
                %(keys)s::text[], %(payloads)s::jsonb[], %(headers)s::jsonb[])
         WITH ORDINALITY AS u(message_id, topic, type, key, payload, headers, n),
         (SELECT count(*) FROM locked) AS l
    ORDER BY u.n
)
INSERT INTO pgmsg_outbox_message (id, outbox, message_id, destination, topic, type, key,
                                  payload, headers)
SELECT m.id, %(outbox)s, m.message_id, %(destination)s, m.topic, m.type, m.key, m.payload,
       m.headers
FROM numbered AS m
ORDER BY m.message_id, m.n
RETURNING message_id, id;

-- name: take_partitions
-- Session-level locks on the partitions this relay may serve and nobody holds: a relay holds
-- its partitions for as long as its connection lives; when it dies, another relay's next try
-- takes them (takeover).
SELECT p FROM unnest(%(partitions)s::int[]) AS p
WHERE pg_try_advisory_lock(hashtext(%(lock_space)s || %(outbox)s), p)
ORDER BY p;

-- name: claim
-- Due pending messages of the held partitions, in id order, but none of a key held back: a key
-- is held back from its first dead or backing-off message on (a failing message holds back its
-- key only). A key's messages are published one at a time, in order, and none after a failure,
-- so once a batch commits a failed row is its key's oldest: the failed rows are few, read once
-- through pgmsg_outbox_failed, and anti-joined.
WITH blocked AS MATERIALIZED (
    SELECT key, min(id) AS id FROM pgmsg_outbox_message
    WHERE outbox = %(outbox)s AND key IS NOT NULL
      AND (status = 'dead' OR (attempts > 0 AND available_at > now()))
    GROUP BY key
)
SELECT m.id, m.message_id, m.destination, m.topic, m.type, m.key, m.payload::text,
       m.headers::text, m.attempts, m.created_at
FROM pgmsg_outbox_message AS m
WHERE m.outbox = %(outbox)s AND m.status = 'pending' AND m.available_at <= now()
  AND (%(parts)s = 1
       OR mod(hashtext(coalesce(m.key, m.message_id))::bigint & 2147483647, %(parts)s)
          = ANY(%(partitions)s::int[]))
  AND NOT EXISTS (SELECT FROM blocked AS b WHERE b.key = m.key AND b.id < m.id)
ORDER BY m.id
LIMIT %(limit)s
FOR UPDATE OF m SKIP LOCKED;

-- name: ack
-- Sent: the broker confirmed these; deleted in the relay's claim transaction.
DELETE FROM pgmsg_outbox_message WHERE id = ANY(%(ids)s::bigint[]);

-- name: fail
-- Refused: count the attempt, keep the broker's error, and either back off or make it dead.
UPDATE pgmsg_outbox_message AS m
SET attempts = m.attempts + 1,
    last_error = f.error,
    last_failed_at = now(),
    status = CASE WHEN f.dead THEN 'dead' ELSE 'pending' END,
    available_at = now() + make_interval(secs => f.delay)
FROM unnest(%(ids)s::bigint[], %(errors)s::text[], %(delays)s::float8[], %(dead)s::bool[])
     AS f(id, error, delay, dead)
WHERE m.id = f.id;

-- name: seconds_until_due
-- How long until the next backed-off message of this outbox is due (NULL when none waits).
SELECT EXTRACT(EPOCH FROM min(available_at) - now())::float8
FROM pgmsg_outbox_message
WHERE outbox = %(outbox)s AND status = 'pending' AND available_at > now();

-- name: replay
-- Make dead (or retrying) messages due now with fresh attempts, and wake the relays.
WITH replayed AS (
    UPDATE pgmsg_outbox_message
    SET status = 'pending', attempts = 0, available_at = now()
    WHERE id = ANY(%(ids)s::bigint[])
      AND (status = 'dead' OR (status = 'pending' AND attempts > 0))
    RETURNING outbox
), woken AS (
    SELECT pg_notify('pgmsg', 'outbox:' || o.outbox)
    FROM (SELECT DISTINCT outbox FROM replayed) AS o
)
SELECT (SELECT count(*) FROM replayed), (SELECT count(*) FROM woken);

-- name: discard
-- Delete dead or pending messages for good, unpublished; a key held back by a discarded head
-- moves on, so the relays are woken.
WITH discarded AS (
    DELETE FROM pgmsg_outbox_message
    WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('dead', 'pending')
    RETURNING outbox
), woken AS (
    SELECT pg_notify('pgmsg', 'outbox:' || o.outbox)
    FROM (SELECT DISTINCT outbox FROM discarded) AS o
)
SELECT (SELECT count(*) FROM discarded), (SELECT count(*) FROM woken);

-- name: backlog
-- Per outbox with messages in the table: pending, dead, and the age of the oldest pending one.
-- The table holds only unrelayed messages (a relayed one is deleted), so this reads no
-- history.
SELECT outbox,
       count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'dead'),
       coalesce(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status = 'pending')),
                0)::float8
FROM pgmsg_outbox_message
GROUP BY outbox;

-- name: health
-- Per outbox: pending, dead, age of the oldest pending message, the partitions a relay
-- holds now, and the pending messages the broker refused %(failing)s times or more (how many,
-- and the latest error of one: a head that keeps failing) (session advisory locks in pg_locks; classid is the lock space as an oid). Only
-- this database's: pg_locks lists the whole server's, and a relay of an outbox of the same
-- name in another database holds nothing here (drop-slot's lock would be granted).
SELECT o.outbox,
       (SELECT count(*) FROM pgmsg_outbox_message WHERE outbox = o.outbox AND status = 'pending'),
       (SELECT count(*) FROM pgmsg_outbox_message WHERE outbox = o.outbox AND status = 'dead'),
       coalesce(EXTRACT(EPOCH FROM now() - (SELECT min(created_at) FROM pgmsg_outbox_message
                                            WHERE outbox = o.outbox AND status = 'pending')),
                0)::float8,
       ARRAY(SELECT l.objid::int FROM pg_locks AS l
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
               AND l.database = (SELECT oid FROM pg_database
                                 WHERE datname = current_database())
               AND l.classid::bigint
                   = (hashtext(%(lock_space)s || o.outbox)::bigint & 4294967295)
             ORDER BY 1),
       (SELECT count(*) FROM pgmsg_outbox_message
        WHERE outbox = o.outbox AND status = 'pending' AND attempts >= %(failing)s),
       coalesce((SELECT last_error FROM pgmsg_outbox_message
                 WHERE outbox = o.outbox AND status = 'pending' AND attempts >= %(failing)s
                 ORDER BY last_failed_at DESC LIMIT 1), '')
FROM unnest(%(outboxes)s::text[]) AS o(outbox);

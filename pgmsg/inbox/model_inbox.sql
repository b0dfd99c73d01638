-- The statements of an inbox over a project's own model. Besides %(parameters)s they take
-- {identifiers} and {fragments}, composed with psycopg.sql by pgmsg/inbox/model_inbox.py:
-- {table}, {pk}, {key} (the id field's column), {mark} (the processed field's column),
-- {unprocessed} (unprocessed_null, unprocessed_false or unprocessed_false_or_null), {set_mark}
-- (mark_now or mark_true),
-- {partition_key} (partition_by_key or partition_by_aggregate).

-- name: claim
-- Due unprocessed rows in primary-key order; rows another worker holds are skipped. A row is
-- not claimable while its failure record (pgmsg_inbox_message of (inbox, key)) is dead,
-- discarded, or backing off; the record's attempts count the failures so far. Each row comes
-- with this transaction's id, for the batch's claim record (pgmsg/core/claims.py).
SELECT t.{pk}, CASE WHEN f.status = 'pending' THEN f.attempts ELSE 0 END,
       pg_current_xact_id()::text::bigint
FROM {table} AS t
LEFT JOIN pgmsg_inbox_message AS f ON f.inbox = %(inbox)s AND f.message_id = t.{key}::text
WHERE {unprocessed}
  AND NOT EXISTS (
      SELECT FROM pgmsg_inbox_message AS s
      WHERE s.inbox = %(inbox)s AND s.message_id = t.{key}::text
        AND (s.status IN ('dead', 'discarded')
             OR (s.status = 'pending' AND s.available_at > now())))
  AND (%(parts)s = 1 OR mod(hashtext({partition_key})::bigint & 2147483647, %(parts)s) = %(part)s)
ORDER BY t.{pk}
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED;

-- name: ack
-- Mark handled rows processed, in the transaction that ran their handlers.
UPDATE {table} SET {mark} = {set_mark} WHERE {pk} = ANY(%(pks)s);

-- name: pending
-- For health: unprocessed rows that are not dead or discarded.
SELECT count(*) FROM {table} AS t
WHERE {unprocessed}
  AND NOT EXISTS (SELECT FROM pgmsg_inbox_message AS f
                  WHERE f.inbox = %(inbox)s AND f.message_id = t.{key}::text
                    AND f.status IN ('dead', 'discarded'));

-- name: processed_last_minute
-- For health: rows processed in the last minute (only a timestamp mark can tell).
SELECT count(*) FROM {table} AS t WHERE t.{mark} >= now() - interval '1 minute';

-- name: unprocessed_null
-- Fragment: a nullable DateTimeField mark.
t.{mark} IS NULL

-- name: unprocessed_false
-- Fragment: a BooleanField mark. Each unprocessed fragment is written as Django writes the
-- condition of the partial index that pgmsg.W001 asks for (model_inbox.missing_claim_index),
-- so that PostgreSQL sees the claim's condition implies the index's; `IS NOT TRUE` implies
-- no condition Django writes.
NOT t.{mark}

-- name: unprocessed_false_or_null
-- Fragment: a nullable BooleanField mark (NULL is unprocessed too).
(t.{mark} IS NULL OR NOT t.{mark})

-- name: mark_now
-- Fragment.
now()

-- name: mark_true
-- Fragment.
true

-- name: partition_by_key
-- Fragment: the static share of a row, by its id field.
t.{key}::text

-- name: partition_by_aggregate
-- Fragment: the static share of a row, by its aggregate field (its id field when NULL).
coalesce(t.{aggregate}::text, t.{key}::text)

-- name: record_failures
-- A failure record is the pgmsg_inbox_message row of (inbox, message_id); its status says
-- whether the model row may be claimed: pending and due, or (no record) never failed. An
-- existing record is updated, a missing one inserted (the worker holds the model row's lock,
-- so no other session writes the same record meanwhile).
WITH failure AS (
    SELECT * FROM unnest(%(message_ids)s::text[], %(types)s::text[], %(aggregates)s::text[],
                         %(refs)s::text[], %(errors)s::text[], %(delays)s::float8[],
                         %(dead)s::bool[])
             AS f(message_id, type, aggregate_id, ref, error, delay, dead)
), updated AS (
    UPDATE pgmsg_inbox_message AS m
    SET attempts = CASE WHEN m.status = 'pending' THEN m.attempts + 1 ELSE 1 END,
        last_error = f.error, last_failed_at = now(),
        status = CASE WHEN f.dead THEN 'dead' ELSE 'pending' END,
        available_at = now() + make_interval(secs => f.delay)
    FROM failure AS f
    WHERE m.inbox = %(inbox)s AND m.message_id = f.message_id
    RETURNING m.message_id
)
INSERT INTO pgmsg_inbox_message (inbox, message_id, type, aggregate_id, payload, attempts,
                                 last_error, last_failed_at, status, available_at)
SELECT %(inbox)s, f.message_id, f.type, f.aggregate_id, f.ref::jsonb, 1, f.error, now(),
       CASE WHEN f.dead THEN 'dead' ELSE 'pending' END, now() + make_interval(secs => f.delay)
FROM failure AS f
WHERE f.message_id NOT IN (SELECT message_id FROM updated);

-- name: ack_records
-- Close the failure records of rows handled now.
UPDATE pgmsg_inbox_message SET status = 'processed', processed_at = now()
WHERE inbox = %(inbox)s AND message_id = ANY(%(message_ids)s::text[]) AND status = 'pending';

-- name: seconds_until_due
-- How long until the next failed row's retry is due (NULL when none waits). Due records are
-- left out: a record whose row is gone must not keep the worker awake.
SELECT EXTRACT(EPOCH FROM min(available_at) - now())::float8
FROM pgmsg_inbox_message
WHERE inbox = %(inbox)s AND status = 'pending' AND available_at > now();

-- name: append_any
-- The one-statement append, for expected version ANY or "no stream" (%(expected)s NULL or 0).
-- The upsert locks the stream row (concurrent appends to one stream wait here, one after the
-- other; ON CONFLICT DO UPDATE works on the latest committed row, whatever the statement's
-- snapshot), moves its version unless the expected version differs, and hands the new version
-- and read-order transaction id to the events. No row returned means a version mismatch
-- (nothing was written); a stored message id fails the statement (unique violation). Either
-- way the caller looks closer. Being one statement, it needs no transaction of its own.
-- transaction_id is this transaction's id, raised to that of the stream's previous append when
-- lower: a transaction that started earlier but appends later must sort after it.
WITH stream AS (
    INSERT INTO pgmsg_stream AS s (name, version, transaction_id)
    VALUES (%(stream)s, %(count)s, pg_current_xact_id())
    ON CONFLICT (name) DO UPDATE
        SET version = s.version + %(count)s,
            transaction_id = greatest(s.transaction_id, pg_current_xact_id())
        WHERE %(expected)s::int IS NULL OR s.version = %(expected)s::int
    RETURNING version, transaction_id
)
INSERT INTO pgmsg_event
    (stream_name, category, version, type, data, metadata, message_id, transaction_id)
SELECT %(stream)s, %(category)s, s.version - %(count)s + e.n, e.type, e.data::jsonb,
       e.metadata::jsonb, e.message_id, s.transaction_id
FROM stream AS s,
     unnest(%(types)b::text[], %(data)b::text[], %(metadata)b::text[], %(ids)b::uuid[])
     WITH ORDINALITY AS e(type, data, metadata, message_id, n)
ORDER BY e.n
RETURNING version;

-- name: append_exact
-- The same for an exact expected version > 0: an UPDATE (the stream must exist), re-checked
-- against the latest committed row after waiting for its lock.
WITH stream AS (
    UPDATE pgmsg_stream AS s
    SET version = s.version + %(count)s,
        transaction_id = greatest(s.transaction_id, pg_current_xact_id())
    WHERE s.name = %(stream)s AND s.version = %(expected)s::int
    RETURNING version, transaction_id
)
INSERT INTO pgmsg_event
    (stream_name, category, version, type, data, metadata, message_id, transaction_id)
SELECT %(stream)s, %(category)s, s.version - %(count)s + e.n, e.type, e.data::jsonb,
       e.metadata::jsonb, e.message_id, s.transaction_id
FROM stream AS s,
     unnest(%(types)b::text[], %(data)b::text[], %(metadata)b::text[], %(ids)b::uuid[])
     WITH ORDINALITY AS e(type, data, metadata, message_id, n)
ORDER BY e.n
RETURNING version;

-- name: lock_stream
-- The careful path (after a mismatch or a stored id): lock the stream row, creating it if new,
-- and read its version.
INSERT INTO pgmsg_stream AS s (name, version) VALUES (%(stream)s, 0)
ON CONFLICT (name) DO UPDATE SET version = s.version
RETURNING version;

-- name: stored_messages
-- Which of these message ids are stored already, and where (idempotent re-append).
SELECT message_id, stream_name, version FROM pgmsg_event WHERE message_id = ANY(%(ids)s::uuid[]);

-- name: stream_version
SELECT version FROM pgmsg_stream WHERE name = %(stream)s;

-- name: read_stream_forwards
SELECT position, transaction_id::text AS xid, stream_name, version, type, data::text, metadata::text,
       message_id, (extract(epoch FROM recorded_at) * 1000000)::bigint AS recorded_at_us
FROM pgmsg_event
WHERE stream_name = %(stream)s AND version >= %(version)s
ORDER BY version
LIMIT %(limit)s;

-- name: read_stream_backwards
SELECT position, transaction_id::text AS xid, stream_name, version, type, data::text, metadata::text,
       message_id, (extract(epoch FROM recorded_at) * 1000000)::bigint AS recorded_at_us
FROM pgmsg_event
WHERE stream_name = %(stream)s AND version <= %(version)s
ORDER BY version DESC
LIMIT %(limit)s;

-- name: read_ordered
-- Gap-free read in (transaction_id, position) order after a checkpoint: only rows of ended
-- transactions (transaction_id < xmin), so no row can later appear before one returned here.
-- Optional filters: category, types, and one partition of N by a hash of the partition key
-- (stream name, or a data / metadata field).
SELECT position, transaction_id::text AS xid, stream_name, version, type, data::text, metadata::text,
       message_id, (extract(epoch FROM recorded_at) * 1000000)::bigint AS recorded_at_us
FROM pgmsg_event
WHERE (transaction_id, position) > (%(xid)s::text::xid8, %(position)s::bigint)
  AND transaction_id < %(xmin)s::text::xid8
  AND (%(category)s::text IS NULL OR category = %(category)s::text)
  AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
  AND (%(partitions)s::int = 1 OR abs(mod(hashtextextended(
        CASE %(key_source)s::text
            WHEN 'stream' THEN stream_name
            WHEN 'data' THEN coalesce(data ->> %(key)s::text, '')
            ELSE coalesce(metadata ->> %(key)s::text, '')
        END, 0), %(partitions)s::int)) = %(partition)s::int)
ORDER BY transaction_id, position
LIMIT %(limit)s;

-- name: checkpoint_of
-- The read-order key of one stored event (to reset a subscription to it).
SELECT transaction_id::text FROM pgmsg_event WHERE position = %(position)s;

-- name: archived_paths
-- A stream's version, and where its events before position %(position)s (NULL: all of them)
-- were archived (pgmsg_archive; pgmsg/export/archive.py), oldest first.
SELECT s.version,
       coalesce(array_agg(a.path ORDER BY a.lower) FILTER (WHERE a.id IS NOT NULL), '{}')
FROM pgmsg_stream AS s
LEFT JOIN pgmsg_archive AS a
       ON a."table" = 'pgmsg_event' AND a.status = 'archived'
      AND (%(position)s::bigint IS NULL OR a.first_position < %(position)s::bigint)
WHERE s.name = %(stream)s
GROUP BY s.version;

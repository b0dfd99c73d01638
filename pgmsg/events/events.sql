-- name: append
-- The one-statement append (pgmsg_append, functions.sql): the stream's new
-- version, or NULL on a version mismatch (nothing written); a stored message id fails the
-- call (unique violation). Either way the caller looks closer. Being one statement, it needs
-- no transaction of its own. The arrays go as binary parameters.
SELECT pgmsg_append(%(stream)s, %(category)s, %(types)b::text[], %(data)b::text[],
                    %(metadata)b::text[], %(ids)b::uuid[], %(expected)s::int);

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

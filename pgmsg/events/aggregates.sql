-- name: load_snapshot
-- The latest snapshot of a stream, if taken with the aggregate's current snapshot version.
SELECT version, state::text FROM pgmsg_snapshot
WHERE stream_name = %(stream)s AND schema = %(schema)s;

-- name: store_snapshot
-- Keep one snapshot per stream: the newest.
INSERT INTO pgmsg_snapshot (stream_name, version, schema, state, taken_at)
VALUES (%(stream)s, %(version)s, %(schema)s, %(state)s::jsonb, now())
ON CONFLICT (stream_name) DO UPDATE
SET version = excluded.version, schema = excluded.schema, state = excluded.state,
    taken_at = excluded.taken_at
WHERE pgmsg_snapshot.version < excluded.version OR pgmsg_snapshot.schema <> excluded.schema;

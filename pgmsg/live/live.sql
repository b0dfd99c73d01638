-- name: read_after
-- A live page of events after a checkpoint, in the store's gap-free read order
-- (events/events.sql's read_ordered): only rows of transactions below the horizon %(xmin)s,
-- so that no event can later appear before one already sent. The filters are a client's
-- (all NULL for the hub's own read of every category).
SELECT position, transaction_id::text AS xid, stream_name, category, version, type, data::text,
       (extract(epoch FROM recorded_at) * 1000000)::bigint AS recorded_at_us
FROM pgmsg_event
WHERE (transaction_id, position) > (%(xid)s::text::xid8, %(position)s::bigint)
  AND transaction_id < %(xmin)s::text::xid8
  AND (%(categories)s::text[] IS NULL OR category = ANY(%(categories)s::text[]))
  AND (%(stream)s::text IS NULL OR stream_name = %(stream)s::text)
  AND (%(types)s::text[] IS NULL OR type = ANY(%(types)s::text[]))
ORDER BY transaction_id, position
LIMIT %(limit)s;

-- name: above_horizon
-- Whether some committed or running transaction's events lie at or above the horizon: the
-- hub looks again shortly instead of waiting for a wake-up that the transaction holding the
-- horizon back (one that appends nothing) will never send.
SELECT EXISTS (SELECT FROM pgmsg_event WHERE transaction_id >= %(xmin)s::text::xid8);

-- name: checkpoint_of
-- The read-order key of the event a client names in Last-Event-ID, and the store's last
-- position (to tell a future id from one that is no longer stored).
SELECT (SELECT transaction_id::text FROM pgmsg_event WHERE position = %(position)s),
       (SELECT max(position) FROM pgmsg_event);

-- name: stream_exists
-- Whether a stream exists (a client asked to follow it).
SELECT 1 FROM pgmsg_stream WHERE name = %(stream)s;

-- name: newest
-- The read-order key of the last event of the transactions below the read horizon (all
-- ended): where a client that gives no Last-Event-ID starts. It is sent that event's position
-- as its first id, so that a browser cut off before its first event (a slow client, a server
-- restart) resumes from there and misses nothing. The horizon in a subselect: computed once.
SELECT transaction_id::text, position
FROM pgmsg_event
WHERE transaction_id < (SELECT pgmsg_read_horizon())::text::xid8
ORDER BY transaction_id DESC, position DESC
LIMIT 1;

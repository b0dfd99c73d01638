-- name: notifications
-- Per channel with stored notifications: pending (retrying included), seconds since the oldest
-- pending one was sent, and dead letters (a table of their own).
SELECT channel, sum(pending)::bigint, max(age)::float8, sum(dead)::bigint
FROM (
    SELECT channel, count(*) AS pending, EXTRACT(EPOCH FROM now() - min(created_at)) AS age,
           0 AS dead
    FROM pgmsg_notification GROUP BY channel
    UNION ALL
    SELECT channel, 0, 0, count(*) FROM pgmsg_notification_dead GROUP BY channel
) AS per_table
GROUP BY channel;

-- name: subscriptions
-- Per subscription: the events of its category after its lowest partition checkpoint (what it
-- still has to read; an upper bound when it has several partitions), the seconds since the
-- oldest of them was recorded, and its stopped partitions. A subscription that never ran has
-- every event of its category ahead of it.
WITH subs AS (
    SELECT * FROM unnest(%(names)s::text[], %(categories)s::text[]) AS s(name, category)
), low AS (
    SELECT DISTINCT ON (subscription) subscription, checkpoint_transaction, checkpoint_position
    FROM pgmsg_subscription_partition
    WHERE subscription = ANY(%(names)s::text[])
    ORDER BY subscription, checkpoint_transaction, checkpoint_position
)
SELECT s.name, ahead.events, ahead.age,
       (SELECT count(*) FROM pgmsg_subscription_partition p
        WHERE p.subscription = s.name AND p.status = 'stopped')
FROM subs s
LEFT JOIN low ON low.subscription = s.name
CROSS JOIN LATERAL (
    SELECT count(*) AS events,
           coalesce(EXTRACT(EPOCH FROM now() - min(e.recorded_at)), 0)::float8 AS age
    FROM pgmsg_event e
    WHERE (e.transaction_id, e.position)
          > (coalesce(low.checkpoint_transaction, 0)::text::xid8,
             coalesce(low.checkpoint_position, 0))
      AND (s.category IS NULL OR e.category = s.category)
) AS ahead;

-- name: throughput
-- Handled and failed messages per source and minute over the last hour (pgmsg_throughput).
SELECT kind, source, minute, sum(handled)::bigint, sum(failed)::bigint
FROM pgmsg_throughput
WHERE minute >= date_trunc('minute', now()) - interval '59 minutes'
GROUP BY kind, source, minute
ORDER BY kind, source, minute;

-- name: this_minute
-- The server's current minute: the throughput chart's last column (the server's clock, the
-- one that wrote the rows, not this process's).
SELECT date_trunc('minute', now());

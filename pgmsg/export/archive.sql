-- name: partition_rows
-- Under the partition's lock: its rows and the range of positions they hold.
SELECT count(*), min(position), max(position) FROM {partition};

-- name: lock_partition
-- Nobody writes or reads the partition while its rows are counted and it is dropped.
LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE;

-- name: forget_dataset_watermark
-- The archive's export is a one-off snapshot: its watermark row is not kept.
DELETE FROM pgmsg_export_watermark WHERE name = %(name)s;

-- name: forget_keys
-- The message ids of the events about to be dropped leave the key table with them (a later
-- append of such an id is a new event: the old one is in the archive).
DELETE FROM pgmsg_event_key WHERE message_id IN (SELECT message_id FROM {partition});

-- name: partition_end
-- The partition's last event in the read order (transaction id, position): a subscription
-- has passed every event of the partition once its checkpoint is at or after it.
SELECT transaction_id::text::bigint, position FROM {partition}
ORDER BY transaction_id DESC, position DESC
LIMIT 1;

-- name: subscriptions_behind
-- Subscriptions with a partition whose checkpoint is before (%(xid)s, %(position)s): they
-- have not passed every event of the partition about to be archived (stopped ones included).
SELECT subscription, count(*)
FROM pgmsg_subscription_partition
WHERE (checkpoint_transaction, checkpoint_position) < (%(xid)s::bigint, %(position)s::bigint)
GROUP BY subscription
ORDER BY subscription;

-- name: try_lock
-- One archive run at a time in the cluster (cron, an operator, workers' periodic runs): a
-- session lock, held until unlock or the end of the session (a killed run lets go of it).
SELECT pg_try_advisory_lock(%(lock_class)s, 0);

-- name: unlock
SELECT pg_advisory_unlock(%(lock_class)s, 0);

-- The outbox table's weekly partitions (outbox/partitions.py, docs/storage.md): a past week is
-- dropped once nothing in it is pending or dead, instead of leaving its relayed rows to VACUUM;
-- and the keys of relayed messages trimmed from pgmsg_outbox_key.

-- name: holds_rows
-- Whether a partition still holds a row. Every row is pending or dead (the status check), so
-- two probes of the partial indexes pgmsg_outbox_pending and pgmsg_outbox_failed answer it
-- without reading the relayed rows' dead tuples that fill the partition's heap.
SELECT EXISTS (SELECT FROM {partition} WHERE status = 'pending')
    OR EXISTS (SELECT FROM {partition} WHERE status = 'dead');

-- name: lock_table
-- Before a drop: the outbox table itself, first, as every query of it takes its locks (the
-- parent, then the partitions); DROP needs this lock on the parent anyway, and taking the
-- partition's first could deadlock with a relay's claim. Held for an instant: the partition
-- is checked again under it and dropped.
LOCK TABLE pgmsg_outbox_message IN ACCESS EXCLUSIVE MODE;

-- name: lock_stale_keys
-- Up to %(limit)s keys of pgmsg_outbox_key whose message is no longer in the outbox (relayed
-- or discarded), locked. A key a publish holds (it is storing that id again) is skipped, so
-- the trim never waits for a producer.
SELECT k.outbox, k.message_id FROM pgmsg_outbox_key AS k
WHERE NOT EXISTS (SELECT FROM pgmsg_outbox_message AS m
                  WHERE m.outbox = k.outbox AND m.message_id = k.message_id)
LIMIT %(limit)s
FOR UPDATE OF k SKIP LOCKED;

-- name: delete_stale_keys
-- The keys lock_stale_keys locked, those still without a message: checked again in this
-- statement, which sees every publish that committed before the locks were taken. After the
-- lock, a publish of such an id waits for this transaction, then inserts the key again.
DELETE FROM pgmsg_outbox_key AS k
USING unnest(%(outboxes)s::text[], %(message_ids)s::text[]) AS s(outbox, message_id)
WHERE k.outbox = s.outbox AND k.message_id = s.message_id
  AND NOT EXISTS (SELECT FROM pgmsg_outbox_message AS m
                  WHERE m.outbox = k.outbox AND m.message_id = k.message_id);

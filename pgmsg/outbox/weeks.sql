-- The outbox table's weekly partitions (outbox/partitions.py, docs/storage.md): a past week is
-- dropped once nothing in it is pending or dead, instead of leaving its relayed rows to VACUUM.

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

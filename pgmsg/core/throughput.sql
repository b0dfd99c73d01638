-- name: record
-- Add handled and failed counts to this process's row of the current minute, per (kind,
-- source): one batch's, in its transaction, or a running worker's last second (Tally).
INSERT INTO pgmsg_throughput AS t (minute, kind, source, pid, handled, failed)
SELECT date_trunc('minute', now()), kind, source, %(pid)s, handled, failed
FROM unnest(%(kinds)s::text[], %(sources)s::text[], %(handled)s::bigint[], %(failed)s::bigint[])
     AS u(kind, source, handled, failed)
ON CONFLICT (minute, kind, source, pid)
DO UPDATE SET handled = t.handled + excluded.handled, failed = t.failed + excluded.failed;

-- name: prune
-- Keep two hours: the overview shows one.
DELETE FROM pgmsg_throughput WHERE minute < now() - interval '2 hours';

-- name: horizon
-- The read horizon of gap-free readers (event subscriptions, ordered inboxes): a transaction
-- id such that every transaction below it that could write this database's tables has ended.
-- It is the lowest id of the transactions still open *in this database* (and of prepared
-- transactions of this database), or, when none is open, the next id to be assigned. Open
-- transactions of other databases cannot write pgmsg's tables, so unlike
-- pg_snapshot_xmin(pg_current_snapshot()) they do not hold it back; neither does a session
-- that only reads (it has no transaction id). pg_stat_activity is read after
-- pg_stat_clear_snapshot() (the LATERAL reference orders the two): it would otherwise show
-- what it showed earlier in this transaction. If some session's transaction id is hidden from
-- this role (pg_stat_activity shows it only to members of the session's role or of
-- pg_read_all_stats), the server-wide pg_snapshot_xmin is used instead: slower, never wrong.
-- The statement's snapshot is taken before the sessions are read, so a transaction that
-- ends in between is not counted yet its rows are not visible to this statement: read rows
-- below the horizon in a *later* statement.
-- backend_xid is a 32-bit xid: it is widened against the snapshot's 64-bit xmax (signed
-- distance, so an id assigned after the snapshot comes out above it).
WITH snap AS (
    SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax,
           pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS cluster_xmin
), sessions AS (
    SELECT s.xid, s.visible
    FROM (SELECT pg_stat_clear_snapshot()::text AS cleared) AS c
    CROSS JOIN LATERAL (
        SELECT a.backend_xid::text::bigint AS xid,
               (pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
                OR pg_has_role(current_user, a.usesysid, 'USAGE')) AS visible
        FROM pg_stat_activity AS a
        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
          AND c.cleared IS NOT DISTINCT FROM c.cleared
        UNION ALL
        SELECT p.transaction::text::bigint, true
        FROM pg_prepared_xacts AS p WHERE p.database = current_database()
    ) AS s
)
SELECT CASE WHEN bool_and(sessions.visible) IS FALSE THEN snap.cluster_xmin
            ELSE least(snap.xmax, min(snap.xmax - (mod(mod(snap.xmax, 4294967296) - sessions.xid
                                                       + 6442450944, 4294967296) - 2147483648)))
       END
FROM snap LEFT JOIN sessions ON true
GROUP BY snap.xmax, snap.cluster_xmin;

-- name: blockers
-- The sessions of this database (and prepared transactions) whose open transaction holds the
-- read horizon back, open longer than %(older_than)s seconds, oldest first.
SELECT a.pid, a.datname, coalesce(a.state, '?'),
       EXTRACT(EPOCH FROM now() - a.xact_start)::float8, left(coalesce(a.query, ''), 200)
FROM pg_stat_activity AS a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.backend_xid IS NOT NULL
  AND a.xact_start < now() - make_interval(secs => %(older_than)s)
UNION ALL
SELECT NULL, p.database, 'prepared ' || p.gid, EXTRACT(EPOCH FROM now() - p.prepared)::float8, ''
FROM pg_prepared_xacts AS p
WHERE p.database = current_database()
  AND p.prepared < now() - make_interval(secs => %(older_than)s)
ORDER BY 4 DESC;

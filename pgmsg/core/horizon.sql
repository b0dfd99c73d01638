-- name: horizon
-- The read horizon of gap-free readers: pgmsg_read_horizon() (functions.sql, which
-- holds the query and says how it is read; it answers from the snapshot alone when no
-- transaction is in progress on the server). A function so that PL/pgSQL keeps its plan for
-- the session: planning the query (views over pg_stat_activity, a union) took 0.5 ms of its
-- 1.1 ms, paid before every subscription read after a wake-up.
SELECT pgmsg_read_horizon();

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

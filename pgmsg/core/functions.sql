-- The SQL functions of the wake-ups (pgmsg/core/wake.py) and of the read horizon
-- (pgmsg/core/horizon.sql), as a migrated database holds them.
-- Edit here, then freeze a copy into a new migration (pgmsg/migrations/README.md);
-- pgmsg_tests/core/test_schema_sql.py checks the database against this file.

-- function: pgmsg_wake
-- A producer's wake-up (pgmsg/core/wake.py, docs/wakeups.md). Lock keys are (class,
-- hashtext(payload)), the classes of pgmsg/core/locks.py: PRODUCING held shared by producers
-- from their wake check until they commit, IDLE held shared by idle workers.
CREATE OR REPLACE FUNCTION pgmsg_wake(payload text, scope text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- Held until this transaction ends: a worker declaring itself idle waits for it before
    -- its last look at its tables, so this producer's rows are seen then or it NOTIFYs.
    PERFORM pg_advisory_xact_lock_shared(1885826370, hashtext(payload));
    IF scope IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared(1885826370, hashtext(scope));
    END IF;
    -- Someone idle holds the idle key shared, so the exclusive try fails; otherwise it is
    -- released at once. NOTIFY only then: a busy system commits without it.
    IF (CASE WHEN pg_try_advisory_lock(1885826377, hashtext(payload))
             THEN NOT pg_advisory_unlock(1885826377, hashtext(payload)) ELSE true END)
       OR (scope IS NOT NULL
           AND CASE WHEN pg_try_advisory_lock(1885826377, hashtext(scope))
                    THEN NOT pg_advisory_unlock(1885826377, hashtext(scope)) ELSE true END)
    THEN
        PERFORM pg_notify('pgmsg', payload);
    END IF;
END $$;

-- function: pgmsg_wake_idle
-- A worker declares itself idle, then tries the barrier (core/wake.sql, declare_idle).
CREATE OR REPLACE FUNCTION pgmsg_wake_idle(
    missing text[], settle text[], OUT declared text[], OUT settled boolean
) LANGUAGE plpgsql AS $$
BEGIN
    -- Declare: hold the idle key of each payload (shared: many workers may be idle).
    SELECT coalesce(array_agg(p), '{}') INTO declared FROM unnest(missing) AS p
    WHERE pg_try_advisory_lock_shared(1885826377, hashtext(p));
    -- Barrier: no producer of these payloads is between its wake check and its end.
    SELECT coalesce(bool_and(CASE WHEN pg_try_advisory_lock(1885826370, hashtext(p))
                                  THEN pg_advisory_unlock(1885826370, hashtext(p))
                                  ELSE false END), true)
    INTO settled FROM unnest(settle) AS p;
END $$;

-- function: pgmsg_wake_busy
-- A worker is busy again (core/wake.sql, withdraw).
CREATE OR REPLACE FUNCTION pgmsg_wake_busy(payloads text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- Withdraw: release every idle key this session holds for these payloads.
    PERFORM pg_advisory_unlock_shared(1885826377, hashtext(p)) FROM unnest(payloads) AS p;
END $$;

-- function: pgmsg_read_horizon
-- The read horizon (core/horizon.sql). The fast path: when the snapshot shows no transaction
-- in progress on the server, the horizon is its xmax, without reading pg_stat_activity
-- (which copies every session's status entry: 0.1 to 0.3 ms on the 2-core machine).
CREATE OR REPLACE FUNCTION pgmsg_read_horizon() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    -- A simple expression: in a volatile function it gets a snapshot of its own, as the
    -- query below does.
    snap pg_snapshot := pg_current_snapshot();
BEGIN
    -- No transaction in progress on the server (prepared ones included: they are in the
    -- snapshot): every id below xmax has ended.
    IF pg_snapshot_xmin(snap) = pg_snapshot_xmax(snap) THEN
        RETURN pg_snapshot_xmax(snap)::text::bigint;
    END IF;
    -- Else migration 0018's query, which says how the horizon is read.
    RETURN (
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
        GROUP BY snap.xmax, snap.cluster_xmin
    );
END $$;

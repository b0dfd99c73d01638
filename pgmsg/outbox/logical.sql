-- The outbox's logical capture mode: publish() writes a logical-decoding message into the WAL of
-- the caller's transaction; the relay reads the outbox's replication slot with pgoutput through
-- the SQL interface, and moves the slot past what the broker confirmed.

-- name: emit
-- One message, transactional: it is decoded only if (and when) its transaction commits, in
-- commit order. Written only while the outbox's slot exists and is ready (a message written
-- before would never be decoded, and so would one written after the slot was invalidated,
-- whose confirmed_flush_lsn stays set): no row means "no usable slot", and publish() raises.
-- pgmsg_wake wakes an idle relay at commit (pgmsg/core/wake.py).
SELECT pg_logical_emit_message(true, %(prefix)s, %(content)s::text), pgmsg_wake(%(wake)s)
FROM pg_replication_slots
WHERE slot_name = %(slot)s AND database = current_database()
  AND confirmed_flush_lsn IS NOT NULL AND wal_status IS DISTINCT FROM 'lost';

-- name: server
-- What the relay needs at start: wal_level, whether its slot and the (empty) publication that
-- pgoutput is given exist, and whether the slot was invalidated (wal_status 'lost').
SELECT current_setting('wal_level'),
       EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %(slot)s),
       EXISTS (SELECT FROM pg_publication WHERE pubname = %(publication)s),
       EXISTS (SELECT FROM pg_replication_slots
               WHERE slot_name = %(slot)s AND wal_status = 'lost'),
       coalesce(has_function_privilege(to_regprocedure('pg_log_standby_snapshot()'),
                                       'execute'), false);

-- name: create_publication
-- pgoutput needs a publication name; an empty one publishes no table change, so the slot yields
-- only the logical messages (PostgreSQL 18 would accept a missing one, older ones do not).
CREATE PUBLICATION pgmsg_outbox;

-- name: create_slot
-- The outbox's slot. It waits for the transactions running now to end; every transaction that
-- writes a message after it returns is decoded.
SELECT pg_create_logical_replication_slot(%(slot)s, 'pgoutput');

-- name: flushed
-- How far the WAL is flushed: a peek decodes at least up to here, so while it has not moved
-- since a peek that found nothing, there is nothing new to decode.
SELECT pg_current_wal_flush_lsn()::text;

-- name: peek
-- The next decoded changes past the slot's confirmed position, whole transactions in commit
-- order (upto_nchanges is checked at transaction ends), without moving the slot.
SELECT lsn::text, data
FROM pg_logical_slot_peek_binary_changes(%(slot)s, NULL, %(limit)s,
                                         'proto_version', '1',
                                         'publication_names', 'pgmsg_outbox',
                                         'messages', 'true');

-- name: advance
-- Confirm up to the end of the last transaction whose messages all went to the broker (or into
-- the outbox table): decoding starts after it from now on.
SELECT pg_replication_slot_advance(%(slot)s, %(lsn)s::pg_lsn)::text;

-- name: advance_and_log_snapshot
-- advance, and in the same round trip (PostgreSQL 16+): a peek decodes again from the slot's
-- restart position, which moves only past a running-transactions record (PostgreSQL writes one
-- every 15 s or so), so after a large transaction every peek decodes it again. When the slot's
-- restart position lags more than RESTART_GAP bytes behind, write such a record now; the next
-- advance past it moves the restart position. (The LATERAL reference makes the slot be read
-- after the advance.)
SELECT a.end_lsn::text,
       CASE WHEN pg_wal_lsn_diff(a.end_lsn, s.restart_lsn) > %(gap)s
            THEN pg_log_standby_snapshot()::text END
FROM pg_replication_slot_advance(%(slot)s, %(lsn)s::pg_lsn) AS a,
     LATERAL (SELECT restart_lsn FROM pg_replication_slots
              WHERE slot_name = %(slot)s AND a.end_lsn IS NOT NULL) AS s;

-- name: in_table
-- Rows of the outbox table with these keys or message ids. A key with a row there (refused,
-- retrying, dead, or parked behind one of those) holds back its next messages: they go into the
-- table too, behind it. A message id with a row there is still unrelayed: a second message
-- with that id is skipped, as table mode's publish() skips it (the first-publish trigger).
SELECT key, message_id FROM pgmsg_outbox_message
WHERE outbox = %(outbox)s AND (key = ANY(%(keys)s::text[]) OR message_id = ANY(%(ids)s::text[]));

-- name: park
-- Messages read from the slot that go to the table: refused ones (attempts 1, the broker's
-- error, backing off or dead) and those of their keys behind them (attempts 0), in slot order so
-- that one key's ids follow commit order. A message parked before a crash is not parked twice
-- (the trigger pgmsg_outbox_first_publish skips an id the table holds, in any partition).
INSERT INTO pgmsg_outbox_message (outbox, message_id, destination, topic, type, key, payload,
                                  headers, attempts, last_error, last_failed_at, status,
                                  available_at, created_at)
SELECT %(outbox)s, m.message_id, m.destination, m.topic, m.type, m.key, m.payload, m.headers,
       m.attempts, m.error, CASE WHEN m.attempts > 0 THEN now() END,
       CASE WHEN m.dead THEN 'dead' ELSE 'pending' END,
       now() + make_interval(secs => m.delay), m.created_at
FROM unnest(%(message_ids)s::text[], %(destinations)s::text[], %(topics)s::text[],
            %(types)s::text[], %(keys)s::text[], %(payloads)s::jsonb[], %(headers)s::jsonb[],
            %(attempts)s::int[], %(errors)s::text[], %(dead)s::bool[], %(delays)s::float8[],
            %(created)s::timestamptz[])
     WITH ORDINALITY AS m(message_id, destination, topic, type, key, payload, headers, attempts,
                          error, dead, delay, created_at, n)
ORDER BY m.n;

-- name: slot_health
-- Per outbox slot: how many bytes of WAL it holds back from the current position, whether a
-- relay reads it now, and the server's retention limit for slots.
SELECT s.slot_name,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,
       s.wal_status
FROM pg_replication_slots AS s
WHERE s.slot_name = ANY(%(slots)s::text[]);

-- name: oldest_unrelayed
-- The first decoded change past the slot's position: a BEGIN carrying the commit time of the
-- oldest transaction the relay has not confirmed (none: nothing waits), and the time now.
SELECT data, now()
FROM pg_logical_slot_peek_binary_changes(%(slot)s, NULL, 1,
                                         'proto_version', '1',
                                         'publication_names', 'pgmsg_outbox',
                                         'messages', 'true');

-- name: wal_keep_size
-- The server's cap on the WAL a slot may hold (-1: none, the default).
SELECT current_setting('max_slot_wal_keep_size'), current_setting('wal_level');

-- name: drop_slot
-- Remove an outbox's slot (it stops holding WAL; messages not yet relayed are lost with it).
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
WHERE slot_name = %(slot)s AND NOT active;

-- name: slot_state
-- Everything pg_replication_slots says about one slot, as JSON (its columns differ between
-- PostgreSQL versions: invalidation_reason and inactive_since exist from 17 on), with the
-- server's cap on slot WAL and the bytes of WAL from the slot's confirmed position to now.
SELECT to_jsonb(s), current_setting('max_slot_wal_keep_size'),
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint
FROM pg_replication_slots AS s
WHERE s.slot_name = %(slot)s;

-- name: lock_outbox
-- In the dropping transaction: the outbox's relay lock (partition 0, as a relay takes it), so
-- that no relay holds the outbox while its slot is dropped; false when one holds it now.
SELECT pg_try_advisory_xact_lock(hashtext(%(lock_space)s || %(outbox)s), 0);

-- name: relay_holder
-- The process of the session that holds an outbox's relay lock (a relay), if any.
SELECT a.pid, a.application_name, a.client_addr::text
FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
        SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = (hashtext(%(lock_space)s || %(outbox)s)::bigint & 4294967295)
  AND l.objid = 0 AND l.objsubid = 2
LIMIT 1;

# pgmsg_read_partition also says whether a crash is on record: whether pgmsg_claim holds a
# claim of events whose batch transaction aborted (docs/events.md, "Handlers do not wait for the
# claim record unless a crash is on record").
#
# Before a batch's handlers run, the worker records its claim on its side connection
# (pgmsg/core/claims.py) and waited for the record's answer, the crashes of the events it
# holds, before the first handler. When the read finds no aborted claim of events at all,
# none of the events read can have crashed, so the handlers run while the record commits and
# its answer is read by the batch's end: 0.15 to 0.35 ms less of append-to-handler at the
# median on the 2-core machine (embedded PostgreSQL 18, events appended 20 ms apart, two
# trees side by side). With a crash on record the worker waits for the answer as before.
#
# The check is in the statement that locks the partition: a batch that died holding this
# partition had ended (its lock released) before that statement could lock it, and its
# record had committed before its handlers ran, unless it ran them without waiting and died
# within moments (then another read may miss that death once: docs/events.md). As a
# statement of its own after the lock (a snapshot after it) the check cost 0.08 ms of every
# read after a wake-up, a third of what not waiting saves, and closed no more than the
# moments of the lock statement's own run.

import importlib

from django.db import migrations

PREVIOUS = importlib.import_module("pgmsg.migrations.0020_subscription_read_rows")

DROP_READ_FUNCTION = PREVIOUS.DROP_READ_FUNCTION

# The events after the held checkpoint. {category}: the condition the two branches differ by
# (an index condition when the subscription has a category).
EVENTS_QUERY = """        RETURN QUERY
        SELECT NULL::bigint, NULL::bigint, NULL::bigint, NULL::int, NULL::bigint, NULL::text,
               NULL::boolean,
               ev.position, ev.transaction_id::text, ev.stream_name, ev.version, ev.type,
               ev.data::text, ev.metadata::text, ev.message_id,
               (extract(epoch FROM ev.recorded_at) * 1000000)::bigint, NULL::bigint,
               NULL::boolean
        FROM pgmsg_event AS ev
        WHERE {category}(ev.transaction_id, ev.position) > (after_xid, after_position)
          AND ev.transaction_id < below
          AND ev.recorded_at >= since
          AND (type_names IS NULL OR ev.type = ANY(type_names))
        ORDER BY ev.transaction_id, ev.position
        LIMIT batch_limit;
"""

READ_FUNCTION = (
    """
CREATE FUNCTION pgmsg_read_partition(
    subscription_name text, partition_number int, horizon text, category_name text,
    type_names text[], batch_limit int, floor_at timestamptz, floor_xid bigint,
    floor_oids bigint[], floor_seals text[], floor_lowest timestamptz
) RETURNS TABLE (
    id bigint, checkpoint_transaction bigint, checkpoint_position bigint, attempts int,
    xid bigint, archived text, floor_ok boolean, event_position bigint, event_xid text,
    stream_name text, version int, type text, data text, metadata text, message_id uuid,
    recorded_at_us bigint, horizon_used bigint, crash_on_record boolean
)
LANGUAGE plpgsql
-- One plan per statement and session (0019): the filters are written so that the generic plan
-- is the good one.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    -- NULL: read it now, in a statement (and snapshot) before the lock's and the read's.
    below xid8 := coalesce(horizon, pgmsg_read_horizon()::text)::xid8;
    since timestamptz := coalesce(floor_at, '-infinity');
    after_xid xid8;
    after_position bigint;
BEGIN
    -- Hold the partition: no row when another worker holds it, or it is stopped or backing
    -- off. crash_on_record: a claim of events whose batch died is on record (0029).
    SELECT p.id, p.checkpoint_transaction, p.checkpoint_position, p.attempts,
           pg_current_xact_id()::text::bigint,
           (SELECT a.partition || ' (archived to ' || a.path || ')'
            FROM pgmsg_archive AS a
            WHERE a.status = 'archived' AND a.end_transaction_id IS NOT NULL
              AND (a.end_transaction_id, a.end_position)
                  > (p.checkpoint_transaction, p.checkpoint_position)
            ORDER BY a.lower
            LIMIT 1),
           (floor_at IS NULL
            OR (p.checkpoint_transaction >= floor_xid
                AND (SELECT count(*) FROM pg_constraint AS c
                     JOIN unnest(floor_oids, floor_seals) AS s(relation, name)
                       ON c.conrelid = s.relation::oid AND c.conname = s.name
                     WHERE c.contype = 'c') = cardinality(floor_oids)
                AND NOT EXISTS (SELECT FROM pgmsg_event AS earlier
                                WHERE earlier.recorded_at < floor_lowest))),
           EXISTS (SELECT FROM pgmsg_claim AS k
                   WHERE k.kind = 'event'
                     AND pg_xact_status(k.transaction_id::text::xid8) = 'aborted')
    INTO id, checkpoint_transaction, checkpoint_position, attempts, xid, archived, floor_ok,
         crash_on_record
    FROM pgmsg_subscription_partition AS p
    WHERE p.subscription = subscription_name AND p.partition = partition_number
      AND p.status = 'active' AND p.next_attempt_at <= now()
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    horizon_used := below::text::bigint;
    RETURN NEXT;  -- the partition's row: its columns and the horizon, the event columns NULL
    after_xid := checkpoint_transaction::text::xid8;
    after_position := checkpoint_position;
    IF category_name IS NULL THEN
"""
    + EVENTS_QUERY.format(category="")
    + "    ELSE\n"
    + EVENTS_QUERY.format(category="ev.category = category_name\n          AND ")
    + """    END IF;
END $$;
"""
)


class Migration(migrations.Migration):
    dependencies = [
        ("pgmsg", "0028_notification_wake_in_default"),
    ]

    operations = [
        migrations.RunSQL(
            DROP_READ_FUNCTION + READ_FUNCTION, DROP_READ_FUNCTION + PREVIOUS.READ_FUNCTION
        ),
    ]

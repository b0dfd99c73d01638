# pgmsg_read_partition: a single-partition subscription's lock-and-read as a function whose
# plan the session keeps (docs/events.md, "Reading a partition").

from django.db import migrations

# lock_and_read (subscriptions.sql) with one partition, in the same columns. {category}: the
# condition the function's two branches differ by.
READ_QUERY = """        RETURN QUERY
        WITH held AS (
            SELECT p.id, p.checkpoint_transaction, p.checkpoint_position, p.attempts,
                   pg_current_xact_id()::text::bigint AS xid,
                   (SELECT a.partition || ' (archived to ' || a.path || ')'
                    FROM pgmsg_archive AS a
                    WHERE a.status = 'archived' AND a.end_transaction_id IS NOT NULL
                      AND (a.end_transaction_id, a.end_position)
                          > (p.checkpoint_transaction, p.checkpoint_position)
                    ORDER BY a.lower
                    LIMIT 1) AS archived,
                   (floor_at IS NULL
                    OR (p.checkpoint_transaction >= floor_xid
                        AND (SELECT count(*) FROM pg_constraint AS c
                             JOIN unnest(floor_oids, floor_seals) AS s(relation, name)
                               ON c.conrelid = s.relation::oid AND c.conname = s.name
                             WHERE c.contype = 'c') = cardinality(floor_oids)
                        AND NOT EXISTS (SELECT FROM pgmsg_event AS earlier
                                        WHERE earlier.recorded_at < floor_lowest)))
                   AS floor_ok
            FROM pgmsg_subscription_partition AS p
            WHERE p.subscription = subscription_name AND p.partition = partition_number
              AND p.status = 'active' AND p.next_attempt_at <= now()
            FOR UPDATE SKIP LOCKED
        )
        SELECT held.id, held.checkpoint_transaction, held.checkpoint_position, held.attempts,
               held.xid, held.archived, held.floor_ok, e.position, e.xid, e.stream_name,
               e.version, e.type, e.data, e.metadata, e.message_id, e.recorded_at_us
        FROM held LEFT JOIN LATERAL (
            SELECT ev.position, ev.transaction_id::text AS xid, ev.stream_name, ev.version,
                   ev.type, ev.data::text AS data, ev.metadata::text AS metadata, ev.message_id,
                   (extract(epoch FROM ev.recorded_at) * 1000000)::bigint AS recorded_at_us
            FROM pgmsg_event AS ev
            WHERE {category}(ev.transaction_id, ev.position)
                  > (held.checkpoint_transaction::text::xid8, held.checkpoint_position)
              AND ev.transaction_id < below
              AND ev.recorded_at >= since
              AND (type_names IS NULL OR ev.type = ANY(type_names))
            ORDER BY ev.transaction_id, ev.position
            LIMIT batch_limit
        ) AS e ON true
        ORDER BY e.xid::xid8, e.position;
"""

READ_FUNCTION = (
    """
CREATE OR REPLACE FUNCTION pgmsg_read_partition(
    subscription_name text, partition_number int, horizon text, category_name text,
    type_names text[], batch_limit int, floor_at timestamptz, floor_xid bigint,
    floor_oids bigint[], floor_seals text[], floor_lowest timestamptz
) RETURNS TABLE (
    id bigint, checkpoint_transaction bigint, checkpoint_position bigint, attempts int,
    xid bigint, archived text, floor_ok boolean, event_position bigint, event_xid text,
    stream_name text, version int, type text, data text, metadata text, message_id uuid,
    recorded_at_us bigint
)
LANGUAGE plpgsql
-- One plan per session: the statement (READ_QUERY) took 0.6 to 1 ms to parse and plan on every
-- call (a partitioned table, a lateral join) against 0.15 ms to run. Its filters are written
-- so that the generic plan is the good one: the category (when given) an index condition, the
-- floor a bound that prunes months when the executor starts. Subscriptions with more than one
-- partition keep the statement lock_and_read (its bucket expression must reach the planner as
-- literals to match the partition's index).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    -- NULL: the horizon read by the previous statement of this transaction
    -- (subscriptions.sql, read_horizon_here).
    below xid8 := coalesce(horizon, current_setting('pgmsg.read_horizon'))::xid8;
    since timestamptz := coalesce(floor_at, '-infinity');
BEGIN
    -- READ_QUERY without a category, then with one (an index condition).
    IF category_name IS NULL THEN
"""
    + READ_QUERY.format(category="")
    + "    ELSE\n"
    + READ_QUERY.format(category="ev.category = category_name\n              AND ")
    + """    END IF;
END $$;
"""
)

DROP_READ_FUNCTION = """
DROP FUNCTION IF EXISTS pgmsg_read_partition(
    text, int, text, text, text[], int, timestamptz, bigint, bigint[], text[], timestamptz
);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('pgmsg', '0018_event_appends'),
    ]

    operations = [
        migrations.RunSQL(READ_FUNCTION, DROP_READ_FUNCTION),
    ]

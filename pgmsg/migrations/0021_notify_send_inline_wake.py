# pgmsg_send with pgmsg_wake's check written into it (docs/wakeups.md, "What notify() costs").
#
# 0016's pgmsg_send called pgmsg_wake(), a PL/pgSQL function of its own, and set the woken mark
# with PERFORM: each PERFORM runs a query through the executor, and the nested call sets up a
# second function. Here the same locks, check and mark are expressions that PL/pgSQL evaluates
# on its fast path for simple expressions (an assignment to a throwaway variable), in the one
# function. Measured on the 2-core machine (embedded PostgreSQL 18, 8 psycopg producers,
# alternating, 6 runs each): 0.69 -> 0.75 of plain INSERT. The keys are pgmsg_wake's
# (migration 0009, pgmsg/core/wake.py); pgmsg_wake stays what every trigger calls.

import importlib

from django.db import migrations

# Backwards: 0016's functions (pgmsg_send_many did not change).
PREVIOUS = importlib.import_module('pgmsg.migrations.0016_notify_send').SEND_FUNCTIONS

SEND_FUNCTION = """
CREATE OR REPLACE FUNCTION pgmsg_send(channel_name text, payload_text text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    sent bigint;
    done text;  -- takes the value of calls made for their effect (the fast path: no PERFORM)
BEGIN
    -- notify(): unless this transaction already woke for the channel, pgmsg_wake's check:
    -- hold the producing key shared until the transaction ends (the idle worker's barrier
    -- waits for it), NOTIFY when a worker holds the channel's idle key, and mark the channel
    -- woken (transaction-local, undone with a rolled-back savepoint, as the lock is) so that
    -- the row trigger's WHEN skips this row and later rows. Then insert; PL/pgSQL keeps the
    -- insert's plan for the session.
    IF current_setting('pgmsg.woken', true) IS DISTINCT FROM channel_name THEN
        done := pg_advisory_xact_lock_shared(1885826370, hashtext(channel_name))::text;
        IF (CASE WHEN pg_try_advisory_lock(1885826377, hashtext(channel_name))
                 THEN NOT pg_advisory_unlock(1885826377, hashtext(channel_name))
                 ELSE true END) THEN
            done := pg_notify('pgmsg', channel_name)::text;
        END IF;
        done := set_config('pgmsg.woken', channel_name, true);
    END IF;
    INSERT INTO pgmsg_notification (channel, payload)
    VALUES (channel_name, payload_text::jsonb) RETURNING id INTO sent;
    RETURN sent;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('pgmsg', '0020_subscription_read_rows'),
    ]

    operations = [
        migrations.RunSQL(SEND_FUNCTION, PREVIOUS),
    ]

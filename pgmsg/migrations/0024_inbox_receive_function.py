# pgmsg_receive: the inbox's receive() as one function call that does the work of
# pgmsg_inbox_message's first-receipt row trigger and wake statement trigger itself (docs/inbox.md).
#
# receive() sent an INSERT that PostgreSQL parsed and planned on every call, then ran the
# first-receipt check as a PL/pgSQL trigger call for the row and the wake-up as another, with
# a transition table, for the statement. pgmsg_receive makes the same checks (the isolation
# level, the bucket lock, the first copy) and wakes with pgmsg_send's inline check, with
# plans PL/pgSQL keeps for the session, around an INSERT it marks (pgmsg.receiving,
# transaction-local) so that the triggers' new WHEN skips it without a call. Every other
# INSERT into pgmsg_inbox_message meets the triggers as before.

import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations

RECEIVE_FUNCTION = """
CREATE OR REPLACE FUNCTION pgmsg_receive(
    inbox_name text, message_key text, message_type text, payload_text text,
    source_name text DEFAULT '', aggregate_key text DEFAULT NULL, trace text DEFAULT ''
) RETURNS bigint
LANGUAGE plpgsql AS $$
-- Store one message in inbox_name unless its message id is stored there already (in
-- whichever partition): the new row's id, or NULL for a duplicate. A concurrent receipt of
-- the same id waits for the first one's transaction, then returns NULL. The checks and the
-- lock are those of the trigger pgmsg_inbox_first_receipt (pgmsg/models/inbox.py); the
-- wake-up is pgmsg_wake's, once per transaction and inbox (the woken mark, as pgmsg_send).
DECLARE
    stored bigint;
    wake_payload text := 'inbox:' || inbox_name;
    done text;  -- takes the value of calls made for their effect (PL/pgSQL's fast path)
BEGIN
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'pgmsg: inbox % message %: receive in a READ COMMITTED or '
            'SERIALIZABLE transaction (REPEATABLE READ cannot see a concurrent first copy)',
            inbox_name, message_key USING ERRCODE = 'feature_not_supported';
    END IF;
    done := pg_advisory_xact_lock(
        hashtext('pgmsg.inbox.key'), hashtext(inbox_name || ':' || message_key) & 1023)::text;
    IF EXISTS (SELECT FROM pgmsg_inbox_message AS m
               WHERE m.inbox = inbox_name AND m.message_id = message_key) THEN
        RETURN NULL;
    END IF;
    -- The mark is undone with the transaction or savepoint if the INSERT fails.
    done := set_config('pgmsg.receiving', 'on', true);
    INSERT INTO pgmsg_inbox_message
        (inbox, message_id, type, payload, source, aggregate_id, trace_id)
    VALUES (inbox_name, message_key, message_type, payload_text::jsonb, source_name,
            aggregate_key, trace)
    RETURNING id INTO stored;
    done := set_config('pgmsg.receiving', '', true);
    IF current_setting('pgmsg.woken', true) IS DISTINCT FROM wake_payload THEN
        done := pg_advisory_xact_lock_shared(1885826370, hashtext(wake_payload))::text;
        IF (CASE WHEN pg_try_advisory_lock(1885826377, hashtext(wake_payload))
                 THEN NOT pg_advisory_unlock(1885826377, hashtext(wake_payload))
                 ELSE true END) THEN
            done := pg_notify('pgmsg', wake_payload)::text;
        END IF;
        done := set_config('pgmsg.woken', wake_payload, true);
    END IF;
    RETURN stored;
END $$;
"""

DROP_RECEIVE_FUNCTION = """
DROP FUNCTION IF EXISTS pgmsg_receive(text, text, text, text, text, text, text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('pgmsg', '0023_append_does_trigger_work'),
    ]

    operations = [
        migrations.RunSQL(RECEIVE_FUNCTION, DROP_RECEIVE_FUNCTION),
        pgtrigger.migrations.RemoveTrigger(
            model_name='inboxmessage',
            name='pgmsg_inbox_wake',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='inboxmessage',
            name='pgmsg_inbox_first_receipt',
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='inboxmessage',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_inbox_first_receipt', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (current_setting('pgmsg.receiving', true) IS DISTINCT FROM 'on')", func="IF current_setting('transaction_isolation') = 'repeatable read' THEN RAISE EXCEPTION 'pgmsg: inbox % message %: receive in a READ COMMITTED or SERIALIZABLE transaction (REPEATABLE READ cannot see a concurrent first copy)', NEW.inbox, NEW.message_id USING ERRCODE = 'feature_not_supported'; END IF; PERFORM pg_advisory_xact_lock(hashtext('pgmsg.inbox.key'), hashtext(NEW.inbox || ':' || NEW.message_id) & 1023); IF EXISTS (SELECT FROM pgmsg_inbox_message WHERE inbox = NEW.inbox AND message_id = NEW.message_id AND id IS DISTINCT FROM NEW.id) THEN RETURN NULL; END IF; RETURN NEW;", hash='20fa72e7bff5a2b68e2c7a222b3dd534925c393e', operation='INSERT', pgid='pgtrigger_pgmsg_inbox_first_receipt_9326c', table='pgmsg_inbox_message', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='inboxmessage',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_inbox_wake', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (current_setting('pgmsg.receiving', true) IS DISTINCT FROM 'on')", func="PERFORM pgmsg_wake('inbox:' || i.inbox) FROM (SELECT DISTINCT inbox FROM new_rows) AS i; RETURN NULL;", hash='ab0600f631e846a517c78663959106ac357bcab5', level='STATEMENT', operation='INSERT', pgid='pgtrigger_pgmsg_inbox_wake_c6bf7', referencing='REFERENCING NEW TABLE AS new_rows ', table='pgmsg_inbox_message', when='AFTER')),
        ),
    ]

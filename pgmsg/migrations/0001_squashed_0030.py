# Migrations 0001 to 0030 in one, made by squashmigrations, then cut down: the SQL moved to
# sql/0001_squashed_0030.sql (frozen: the text the replaced migrations ran), every function
# created once in its last version, each trigger added once after its table's last rebuild
# (two removed for good are added and removed, as before: their functions stay behind), and
# the data moves left out (a fresh database has nothing to move). The operations are Django's
# own, so the models' state is what the replaced migrations made. A database they migrated
# counts this one as applied (replaces). How to change a function: README.md here.

import re
from pathlib import Path

import django.contrib.postgres.fields
import django.core.serializers.json
import django.db.models.functions.datetime
import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models


def _frozen(name: str) -> dict[str, str]:
    """The blocks of sql/<name>.sql by name: each starts with a line "-- name: <name>"."""
    parts = re.split(r"(?m)^-- name: (\w+)\n", (Path(__file__).parent / "sql" / name).read_text())
    return dict(zip(parts[1::2], parts[2::2]))


SQL = _frozen("0001_squashed_0030.sql")


def run_deferred(apps, schema_editor):
    """Run the statements Django defers to the end of a migration (a new model's indexes) now,
    where a replaced migration ended: before a table is rebuilt as partitioned."""
    for statement in schema_editor.deferred_sql:
        schema_editor.execute(statement)
    schema_editor.deferred_sql.clear()


class Migration(migrations.Migration):

    replaces = [('pgmsg', '0001_initial'), ('pgmsg', '0002_events'), ('pgmsg', '0003_inbox'), ('pgmsg', '0004_export'), ('pgmsg', '0005_deadletter_listings'), ('pgmsg', '0006_outbox'), ('pgmsg', '0007_reliability_claims'), ('pgmsg', '0008_reliability_inbox_order'), ('pgmsg', '0009_wakeups'), ('pgmsg', '0010_throughput'), ('pgmsg', '0011_inbox_export_versions'), ('pgmsg', '0012_outbox_wakeups'), ('pgmsg', '0013_inbox_version_when_done'), ('pgmsg', '0014_storage_partitions'), ('pgmsg', '0015_storage_retention_receipts_archive'), ('pgmsg', '0016_notify_send'), ('pgmsg', '0017_outbox_partitions'), ('pgmsg', '0018_event_appends'), ('pgmsg', '0019_subscription_read'), ('pgmsg', '0020_subscription_read_rows'), ('pgmsg', '0021_notify_send_inline_wake'), ('pgmsg', '0022_read_horizon_fast_path'), ('pgmsg', '0023_append_does_trigger_work'), ('pgmsg', '0024_inbox_receive_function'), ('pgmsg', '0025_claim_ids_uncompressed'), ('pgmsg', '0026_inbox_ack_stamps_version'), ('pgmsg', '0027_inbox_pending_type'), ('pgmsg', '0028_notification_wake_in_default'), ('pgmsg', '0029_read_reports_crashes'), ('pgmsg', '0030_dead_letters_apart')]

    dependencies = [
    ]

    operations = [
        migrations.RunSQL(SQL["functions"]),
        migrations.CreateModel(
            name='Notification',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('channel', models.CharField(max_length=63)),
                ('payload', models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder)),
                ('status', models.CharField(choices=[('pending', 'pending'), ('dead', 'dead')], db_default='pending', default='pending', max_length=8)),
                ('attempts', models.IntegerField(db_default=0, default=0)),
                ('available_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_error', models.TextField(blank=True, db_default='', default='')),
                ('last_failed_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'pgmsg_notification',
                'permissions': [('replay_notification', 'Can replay dead or retrying notifications'), ('discard_notification', 'Can discard notifications')],
                'indexes': [models.Index(condition=models.Q(('status', 'pending')), fields=['id'], name='pgmsg_notification_pending'), models.Index(fields=['status', 'channel'], name='pgmsg_notification_status')],
            },
        ),
        migrations.CreateModel(
            name='Stream',
            fields=[
                ('name', models.TextField(primary_key=True, serialize=False)),
                ('version', models.IntegerField(default=0)),
            ],
            options={
                'db_table': 'pgmsg_stream',
            },
        ),
        migrations.CreateModel(
            name='Snapshot',
            fields=[
                ('stream_name', models.TextField(primary_key=True, serialize=False)),
                ('version', models.IntegerField()),
                ('schema', models.IntegerField()),
                ('state', models.JSONField()),
                ('taken_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'pgmsg_snapshot',
            },
        ),
        migrations.CreateModel(
            name='SubscriptionPartition',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('subscription', models.CharField(max_length=63)),
                ('partition', models.IntegerField()),
                ('checkpoint_transaction', models.BigIntegerField(default=0)),
                ('checkpoint_position', models.BigIntegerField(default=0)),
                ('status', models.CharField(choices=[('active', 'active'), ('stopped', 'stopped')], default='active', max_length=8)),
                ('attempts', models.IntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_error', models.TextField(blank=True, default='')),
                ('failed_position', models.BigIntegerField(blank=True, null=True)),
                ('handled', models.BigIntegerField(default=0)),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'pgmsg_subscription_partition',
                'permissions': [('operate_subscriptionpartition', 'Can skip, retry or reset subscription partitions')],
            },
        ),
        migrations.CreateModel(
            name='StoredEvent',
            fields=[
                ('position', models.BigAutoField(primary_key=True, serialize=False)),
                ('stream_name', models.TextField()),
                ('category', models.TextField()),
                ('version', models.IntegerField()),
                ('type', models.TextField()),
                ('data', models.JSONField()),
                ('metadata', models.JSONField(default=dict)),
                ('message_id', models.UUIDField(unique=True)),
                ('recorded_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'verbose_name': 'event',
                'db_table': 'pgmsg_event',
                'constraints': [models.UniqueConstraint(fields=('stream_name', 'version'), name='pgmsg_event_version')],
            },
        ),
        migrations.AddConstraint(
            model_name='subscriptionpartition',
            constraint=models.UniqueConstraint(fields=('subscription', 'partition'), name='pgmsg_subscription_partition_key'),
        ),
        migrations.RunSQL(SQL["event_transaction_ids"]),
        migrations.CreateModel(
            name='InboxMessage',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('inbox', models.CharField(max_length=63)),
                ('message_id', models.TextField()),
                ('type', models.TextField()),
                ('source', models.TextField(blank=True, db_default='', default='')),
                ('aggregate_id', models.TextField(blank=True, null=True)),
                ('payload', models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder)),
                ('trace_id', models.TextField(blank=True, db_default='', default='')),
                ('status', models.CharField(choices=[('pending', 'pending'), ('processed', 'processed'), ('dead', 'dead'), ('discarded', 'discarded')], db_default='pending', default='pending', max_length=10)),
                ('attempts', models.IntegerField(db_default=0, default=0)),
                ('last_error', models.TextField(blank=True, db_default='', default='')),
                ('available_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('received_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('processed_at', models.DateTimeField(blank=True, null=True)),
                ('last_failed_at', models.DateTimeField(blank=True, null=True)),
                ('discarded_at', models.DateTimeField(blank=True, null=True)),
                ('discard_reason', models.TextField(blank=True, db_default='', default='')),
            ],
            options={
                'db_table': 'pgmsg_inbox_message',
                'permissions': [('replay_inboxmessage', 'Can replay dead or retrying inbox messages'), ('discard_inboxmessage', 'Can discard inbox messages')],
                'indexes': [models.Index(condition=models.Q(('status', 'pending')), fields=['inbox', 'id'], name='pgmsg_inbox_pending'), models.Index(condition=models.Q(('status__in', ['pending', 'dead'])), fields=['inbox', 'aggregate_id', 'id'], name='pgmsg_inbox_open_aggregate'), models.Index(condition=models.Q(('status', 'processed')), fields=['inbox', 'processed_at'], name='pgmsg_inbox_processed')],
                'constraints': [models.UniqueConstraint(fields=('inbox', 'message_id'), name='pgmsg_inbox_message_unique'), models.CheckConstraint(condition=models.Q(('status__in', ['pending', 'processed', 'dead', 'discarded'])), name='pgmsg_inbox_message_status'), models.CheckConstraint(condition=models.Q(models.Q(('message_id', ''), _negated=True), models.Q(('type', ''), _negated=True)), name='pgmsg_inbox_message_id_type')],
            },
        ),
        migrations.RunSQL(SQL["inbox_transaction_ids"]),
        migrations.CreateModel(
            name='ExportWatermark',
            fields=[
                ('name', models.CharField(max_length=63, primary_key=True, serialize=False)),
                ('transaction_xmin', models.BigIntegerField(blank=True, null=True)),
                ('last_rows', models.BigIntegerField(default=0)),
                ('total_rows', models.BigIntegerField(default=0)),
                ('exported_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'pgmsg_export_watermark',
            },
        ),
        migrations.CreateModel(
            name='InboxDeadLetter',
            fields=[
            ],
            options={
                'verbose_name': 'dead letter (inboxes)',
                'verbose_name_plural': 'dead letters (inboxes)',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('pgmsg.inboxmessage',),
        ),
        migrations.CreateModel(
            name='NotificationDeadLetter',
            fields=[
            ],
            options={
                'verbose_name': 'dead letter (channels)',
                'verbose_name_plural': 'dead letters (channels)',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('pgmsg.notification',),
        ),
        migrations.CreateModel(
            name='OutboxMessage',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('outbox', models.CharField(max_length=63)),
                ('message_id', models.TextField()),
                ('destination', models.CharField(max_length=63)),
                ('topic', models.TextField()),
                ('type', models.TextField()),
                ('key', models.TextField(blank=True, null=True)),
                ('payload', models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder)),
                ('headers', models.JSONField(db_default={}, default=dict)),
                ('status', models.CharField(choices=[('pending', 'pending'), ('dead', 'dead')], db_default='pending', default='pending', max_length=8)),
                ('attempts', models.IntegerField(db_default=0, default=0)),
                ('last_error', models.TextField(blank=True, db_default='', default='')),
                ('available_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('last_failed_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'pgmsg_outbox_message',
                'permissions': [('replay_outboxmessage', 'Can replay dead or retrying outbox messages'), ('discard_outboxmessage', 'Can discard outbox messages')],
                'indexes': [models.Index(condition=models.Q(('status', 'pending')), fields=['outbox', 'id'], name='pgmsg_outbox_pending'), models.Index(condition=models.Q(('status', 'dead'), ('attempts__gt', 0), _connector='OR'), fields=['outbox', 'key', 'id'], name='pgmsg_outbox_failed')],
                'constraints': [models.UniqueConstraint(fields=('outbox', 'message_id'), name='pgmsg_outbox_message_unique'), models.CheckConstraint(condition=models.Q(('status__in', ['pending', 'dead'])), name='pgmsg_outbox_message_status')],
            },
        ),
        migrations.CreateModel(
            name='Claim',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('kind', models.CharField(max_length=20)),
                ('ids', django.contrib.postgres.fields.ArrayField(base_field=models.BigIntegerField(), size=None)),
                ('transaction_id', models.BigIntegerField()),
                ('pid', models.IntegerField()),
                ('claimed_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'pgmsg_claim',
            },
        ),
        migrations.RunSQL(SQL["inbox_open_receipt"]),
        migrations.CreateModel(
            name='Throughput',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('minute', models.DateTimeField()),
                ('kind', models.CharField(max_length=16)),
                ('source', models.CharField(max_length=63)),
                ('pid', models.IntegerField()),
                ('handled', models.BigIntegerField(default=0)),
                ('failed', models.BigIntegerField(default=0)),
            ],
            options={
                'db_table': 'pgmsg_throughput',
                'constraints': [models.UniqueConstraint(fields=('minute', 'kind', 'source', 'pid'), name='pgmsg_throughput_key')],
            },
        ),
        migrations.CreateModel(
            name='Overview',
            fields=[
            ],
            options={
                'verbose_name': 'pgmsg overview',
                'verbose_name_plural': 'pgmsg overview',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('pgmsg.throughput',),
        ),
        migrations.RunPython(run_deferred, migrations.RunPython.noop),
        migrations.RunSQL(SQL["inbox_partitioned"]),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='inboxmessage',
                    name='pgmsg_inbox_message_unique',
                ),
            ],
        ),
        migrations.AddIndex(
            model_name='inboxmessage',
            index=models.Index(fields=['inbox', 'message_id'], name='pgmsg_inbox_message_key'),
        ),
        migrations.RunPython(run_deferred, migrations.RunPython.noop),
        migrations.RunSQL(SQL["events_partitioned"]),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='storedevent',
                    name='pgmsg_event_version',
                ),
                migrations.AlterField(
                    model_name='storedevent',
                    name='message_id',
                    field=models.UUIDField(db_index=True),
                ),
                migrations.AddIndex(
                    model_name='storedevent',
                    index=models.Index(fields=['stream_name', 'version'], name='pgmsg_event_version'),
                ),
            ],
        ),
        migrations.CreateModel(
            name='EventKey',
            fields=[
                ('message_id', models.UUIDField(primary_key=True, serialize=False)),
            ],
            options={
                'db_table': 'pgmsg_event_key',
            },
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='storedevent',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_event_first_append', sql=pgtrigger.compiler.UpsertTriggerSql(func="INSERT INTO pgmsg_event_key (message_id) VALUES (NEW.message_id) ON CONFLICT DO NOTHING; IF NOT FOUND AND EXISTS (SELECT FROM pgmsg_event WHERE message_id = NEW.message_id AND position IS DISTINCT FROM NEW.position) THEN RAISE unique_violation USING MESSAGE = format('message id %s is stored already', NEW.message_id); END IF; RETURN NEW;", hash='5b94b88eeb1448c0072c86d6291bf2862e0d160d', operation='INSERT', pgid='pgtrigger_pgmsg_event_first_append_23729', table='pgmsg_event', when='BEFORE')),
        ),
        migrations.CreateModel(
            name='Archive',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('table', models.CharField(max_length=63)),
                ('partition', models.CharField(max_length=63, unique=True)),
                ('lower', models.DateTimeField()),
                ('upper', models.DateTimeField()),
                ('path', models.TextField()),
                ('rows', models.BigIntegerField(blank=True, null=True)),
                ('first_position', models.BigIntegerField(blank=True, null=True)),
                ('last_position', models.BigIntegerField(blank=True, null=True)),
                ('status', models.CharField(choices=[('exporting', 'exporting'), ('archived', 'archived')], default='exporting', max_length=10)),
                ('started_at', models.DateTimeField(auto_now_add=True)),
                ('archived_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'pgmsg_archive',
            },
        ),
        migrations.AddField(
            model_name='archive',
            name='end_position',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='archive',
            name='end_transaction_id',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='inboxmessage',
            index=models.Index(condition=models.Q(('status__in', ['dead', 'discarded'])), fields=['inbox', 'id'], name='pgmsg_inbox_failed'),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='notification',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_wake_workers', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (current_setting('pgmsg.woken', true) IS DISTINCT FROM NEW.channel)", func="IF current_setting('pgmsg.woken', true) IS DISTINCT FROM NEW.channel THEN PERFORM pgmsg_wake(NEW.channel); PERFORM set_config('pgmsg.woken', NEW.channel, true); END IF; RETURN NULL;", hash='45006d360a2a6c9f37033d2444d686ac6bf144ab', operation='INSERT', pgid='pgtrigger_pgmsg_wake_workers_f9bfa', table='pgmsg_notification', when='AFTER')),
        ),
        migrations.RunPython(run_deferred, migrations.RunPython.noop),
        migrations.RunSQL(SQL["outbox_partitioned"]),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='outboxmessage',
                    name='pgmsg_outbox_message_unique',
                ),
            ],
        ),
        migrations.AddIndex(
            model_name='outboxmessage',
            index=models.Index(fields=['outbox', 'message_id'], name='pgmsg_outbox_message_key'),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='outboxmessage',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_outbox_wake', sql=pgtrigger.compiler.UpsertTriggerSql(func="PERFORM pgmsg_wake('outbox:' || o.outbox) FROM (SELECT DISTINCT outbox FROM new_rows) AS o; RETURN NULL;", hash='23a1b9f49ff2a874651c3451f030b92d049bcf5b', level='STATEMENT', operation='INSERT', pgid='pgtrigger_pgmsg_outbox_wake_353dc', referencing='REFERENCING NEW TABLE AS new_rows ', table='pgmsg_outbox_message', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='outboxmessage',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_outbox_first_publish', sql=pgtrigger.compiler.UpsertTriggerSql(func="IF current_setting('transaction_isolation') = 'repeatable read' THEN RAISE EXCEPTION 'pgmsg: outbox % message %: publish in a READ COMMITTED or SERIALIZABLE transaction (REPEATABLE READ cannot see a concurrent first copy)', NEW.outbox, NEW.message_id USING ERRCODE = 'feature_not_supported'; END IF; PERFORM pg_advisory_xact_lock(hashtext('pgmsg.outbox.key'), hashtext(NEW.outbox || ':' || NEW.message_id) & 1023); IF EXISTS (SELECT FROM pgmsg_outbox_message WHERE outbox = NEW.outbox AND message_id = NEW.message_id AND id IS DISTINCT FROM NEW.id) THEN RETURN NULL; END IF; RETURN NEW;", hash='0ff220c0549adc04b0d8571a9a5af37fe8596475', operation='INSERT', pgid='pgtrigger_pgmsg_outbox_first_publish_4e47b', table='pgmsg_outbox_message', when='BEFORE')),
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='storedevent',
            name='pgmsg_event_first_append',
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='storedevent',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_event_keys', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (current_setting('pgmsg.appending', true) IS DISTINCT FROM 'on')", declare='DECLARE taken uuid; known uuid[];', func="SELECT message_id INTO taken FROM new_rows GROUP BY message_id HAVING count(*) > 1 LIMIT 1; IF taken IS NULL THEN WITH added AS (INSERT INTO pgmsg_event_key (message_id) SELECT message_id FROM new_rows ORDER BY position ON CONFLICT DO NOTHING RETURNING message_id) SELECT array_agg(n.message_id) INTO known FROM new_rows AS n WHERE NOT EXISTS (SELECT FROM added AS a WHERE a.message_id = n.message_id); IF known IS NOT NULL THEN SELECT n.message_id INTO taken FROM new_rows AS n WHERE n.message_id = ANY(known) AND EXISTS (SELECT FROM pgmsg_event AS e WHERE e.message_id = n.message_id AND e.position <> n.position) LIMIT 1; END IF; END IF; IF taken IS NOT NULL THEN RAISE unique_violation USING MESSAGE = format('message id %s is stored already', taken); END IF; RETURN NULL;", hash='17aeab1486ecd42e45e580d56ed4a24bb9d75c86', level='STATEMENT', operation='INSERT', pgid='pgtrigger_pgmsg_event_keys_a50ab', referencing='REFERENCING NEW TABLE AS new_rows ', table='pgmsg_event', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='storedevent',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_wake_subscriptions', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (current_setting('pgmsg.appending', true) IS DISTINCT FROM 'on')", func="PERFORM pgmsg_wake('events:' || c.category, 'events') FROM (SELECT DISTINCT category FROM new_rows) AS c; RETURN NULL;", hash='505a793a160c60abde4f6a089a443fac996ede99', level='STATEMENT', operation='INSERT', pgid='pgtrigger_pgmsg_wake_subscriptions_8859f', referencing='REFERENCING NEW TABLE AS new_rows ', table='pgmsg_event', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='inboxmessage',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_inbox_first_receipt', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (current_setting('pgmsg.receiving', true) IS DISTINCT FROM 'on')", func="IF current_setting('transaction_isolation') = 'repeatable read' THEN RAISE EXCEPTION 'pgmsg: inbox % message %: receive in a READ COMMITTED or SERIALIZABLE transaction (REPEATABLE READ cannot see a concurrent first copy)', NEW.inbox, NEW.message_id USING ERRCODE = 'feature_not_supported'; END IF; PERFORM pg_advisory_xact_lock(hashtext('pgmsg.inbox.key'), hashtext(NEW.inbox || ':' || NEW.message_id) & 1023); IF EXISTS (SELECT FROM pgmsg_inbox_message WHERE inbox = NEW.inbox AND message_id = NEW.message_id AND id IS DISTINCT FROM NEW.id) THEN RETURN NULL; END IF; RETURN NEW;", hash='20fa72e7bff5a2b68e2c7a222b3dd534925c393e', operation='INSERT', pgid='pgtrigger_pgmsg_inbox_first_receipt_9326c', table='pgmsg_inbox_message', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='inboxmessage',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_inbox_wake', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (current_setting('pgmsg.receiving', true) IS DISTINCT FROM 'on')", func="PERFORM pgmsg_wake('inbox:' || i.inbox) FROM (SELECT DISTINCT inbox FROM new_rows) AS i; RETURN NULL;", hash='ab0600f631e846a517c78663959106ac357bcab5', level='STATEMENT', operation='INSERT', pgid='pgtrigger_pgmsg_inbox_wake_c6bf7', referencing='REFERENCING NEW TABLE AS new_rows ', table='pgmsg_inbox_message', when='AFTER')),
        ),
        migrations.RunSQL(SQL["claim_ids_storage"]),
        pgtrigger.migrations.AddTrigger(
            model_name='inboxmessage',
            trigger=pgtrigger.compiler.Trigger(name='pgmsg_inbox_version', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (NEW.status IN ('processed', 'discarded') AND NEW.transaction_id IS DISTINCT FROM pg_current_xact_id() AND OLD.* IS DISTINCT FROM NEW.*)", func='NEW.transaction_id := pg_current_xact_id(); RETURN NEW;', hash='dc3b35543efe5e3e2326cc09b7eb15281eaf7250', operation='UPDATE', pgid='pgtrigger_pgmsg_inbox_version_46251', table='pgmsg_inbox_message', when='BEFORE')),
        ),
        migrations.AddIndex(
            model_name='inboxmessage',
            index=models.Index(condition=models.Q(('status', 'pending')), fields=['inbox', 'type', 'id'], name='pgmsg_inbox_pending_type'),
        ),
        migrations.AlterField(
            model_name='notification',
            name='created_at',
            field=models.DateTimeField(db_default=models.Func(function='pgmsg_notification_created', output_field=models.DateTimeField())),
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='notification',
            name='pgmsg_wake_workers',
        ),
        migrations.DeleteModel(
            name='NotificationDeadLetter',
        ),
        migrations.CreateModel(
            name='NotificationDeadLetter',
            fields=[
                ('id', models.BigIntegerField(primary_key=True, serialize=False)),
                ('channel', models.CharField(max_length=63)),
                ('payload', models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder)),
                ('attempts', models.IntegerField()),
                ('created_at', models.DateTimeField()),
                ('last_error', models.TextField(blank=True, default='')),
                ('last_failed_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'dead letter (channels)',
                'verbose_name_plural': 'dead letters (channels)',
                'db_table': 'pgmsg_notification_dead',
                'indexes': [models.Index(fields=['channel', 'id'], name='pgmsg_notification_dead_ch')],
            },
        ),
        migrations.RemoveIndex(
            model_name='notification',
            name='pgmsg_notification_pending',
        ),
        migrations.RemoveIndex(
            model_name='notification',
            name='pgmsg_notification_status',
        ),
        migrations.RemoveField(
            model_name='notification',
            name='status',
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(condition=models.Q(('available_at__gt', models.F('created_at')), ('attempts__gt', 0), _connector='OR'), fields=['channel', 'available_at'], name='pgmsg_notification_retrying'),
        ),
        migrations.RunSQL(SQL["notification_stored"]),
    ]

# Written by hand: Django has no xid8 field, so this index over transaction_id is SQL.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("pgmsg", "0007_reliability_claims"),
    ]

    operations = [
        # Ordered inboxes: the head of an aggregate in receipt order (transaction_id, id), and
        # the messages after it, read straight off an index.
        migrations.RunSQL(
            sql="CREATE INDEX pgmsg_inbox_open_receipt ON pgmsg_inbox_message "
            "(inbox, aggregate_id, transaction_id, id) WHERE status IN ('pending', 'dead')",
            reverse_sql="DROP INDEX pgmsg_inbox_open_receipt",
        ),
    ]

# 0035_receive_many_function: receive_many() calls the new SQL function pgmsg_receive_many
# (pgmsg/inbox/functions.sql, frozen in sql/0035_receive_many_function.sql by
# pgmsg_dev.freeze_sql). Before, receive_many() was one INSERT whose first-receipt trigger ran
# once per row, each call inserting one key into pgmsg_inbox_key; the function inserts the
# batch's keys in one statement and skips the trigger, as pgmsg_receive does for one message.

from pathlib import Path

from django.db import migrations

SQL = (Path(__file__).parent / "sql" / "0035_receive_many_function.sql").read_text()

DROP = (
    "DROP FUNCTION IF EXISTS pgmsg_receive_many(text, text[], text[], text[], text[], text[], "
    "text[]);"
)


class Migration(migrations.Migration):
    dependencies = [
        ("pgmsg", "0034_inbox_bridge"),
    ]

    operations = [
        migrations.RunSQL(SQL, reverse_sql=DROP),
    ]

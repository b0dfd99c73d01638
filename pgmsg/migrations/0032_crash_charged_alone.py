# pgmsg_claim.alone: whether the batch that a claim records ran one row (issue 44). A batch
# that dies charges a crash to its row only when it ran alone; the rows of a batch of several
# that died are suspects without a charge, run alone afterwards (pgmsg/core/claims.py). The
# claims on record before this migration count as batches of several: their rows run alone
# once more before any of them is charged.

from django.db import migrations, models

ADD = "ALTER TABLE pgmsg_claim ADD COLUMN alone boolean NOT NULL DEFAULT false;"
DROP = "ALTER TABLE pgmsg_claim DROP COLUMN alone;"


class Migration(migrations.Migration):
    dependencies = [
        ("pgmsg", "0031_overview_view_only"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(ADD, DROP)],
            state_operations=[
                migrations.AddField(
                    model_name="claim",
                    name="alone",
                    field=models.BooleanField(default=False, db_default=False),
                ),
            ],
        ),
    ]

# pgmsg_claim.ids stored out of line without compression (docs/benchmarks.md, "Seventeenth
# pass").
#
# A claim record names every row of its batch: 8 bytes an id, so a subscription's catch-up
# batch of 1,000 events records an 8 KB array. Past about 2 KB PostgreSQL's default storage
# (EXTENDED) first tries to compress the value with pglz: on the 2-core machine that took
# about 0.75 ms of the 0.87 ms the side connection's server process spent on each such
# record (the ids are a hash plus positions: little to gain), a third of the server CPU a
# catch-up costs per event. EXTERNAL moves a large value to the TOAST table as it is; small
# arrays (a batch of 100, 800 bytes) stay in the row either way. Changing a column's storage
# rewrites nothing and holds the table's lock for a moment.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('pgmsg', '0024_inbox_receive_function'),
    ]

    operations = [
        migrations.RunSQL(
            'ALTER TABLE pgmsg_claim ALTER COLUMN ids SET STORAGE EXTERNAL;',
            'ALTER TABLE pgmsg_claim ALTER COLUMN ids SET STORAGE EXTENDED;',
        ),
    ]

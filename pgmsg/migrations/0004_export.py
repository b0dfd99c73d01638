# Placeholder: the Parquet export's watermark table lands here.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("pgmsg", "0003_inbox")]
    operations = []

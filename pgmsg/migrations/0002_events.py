# Placeholder: the event store's tables land here (kept so later migrations have a fixed parent).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("pgmsg", "0001_initial")]
    operations = []

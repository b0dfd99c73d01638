# Placeholder: the transactional inbox's tables land here.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("pgmsg", "0002_events")]
    operations = []

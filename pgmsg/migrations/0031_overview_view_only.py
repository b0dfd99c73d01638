# The admin overview is a page to look at: its proxy model keeps the view permission only
# (add, change and delete meant nothing). Existing add/change/delete_overview rows in
# auth_permission stay until removed by hand; the admin never consults them.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("pgmsg", "0030_dead_letters_apart"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="overview",
            options={
                "default_permissions": ("view",),
                "verbose_name": "pgmsg overview",
                "verbose_name_plural": "pgmsg overview",
            },
        ),
    ]

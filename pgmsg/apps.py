"""Django app config: system checks, and discovery of each app's ``listeners`` module."""

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgmsgConfig(AppConfig):
    name = "pgmsg"
    verbose_name = "pgmsg messaging"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pgmsg import checks  # noqa: F401  (registers the checks)

        autodiscover_modules("listeners")

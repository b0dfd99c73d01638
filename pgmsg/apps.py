"""Django app config: system checks, each capability's worker sources, and discovery of each
app's ``listeners`` module."""

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgmsgConfig(AppConfig):
    name = "pgmsg"
    verbose_name = "pgmsg messaging"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pgmsg import checks  # noqa: F401  (registers the checks)
        from pgmsg.channels import source as channel_sources
        from pgmsg.core import sources
        from pgmsg.events import subscription_source
        from pgmsg.inbox import serving as inbox_sources
        from pgmsg.outbox import checks as outbox_checks  # noqa: F401  (registers them)
        from pgmsg.outbox import serving as outbox_sources

        # The order here is the order a worker serves its sources in.
        sources.register("channel_names", channel_sources.worker_sources)
        sources.register("inboxes", inbox_sources.worker_sources)
        sources.register("subscriptions", subscription_source.worker_sources)
        sources.register("outboxes", outbox_sources.worker_sources)
        autodiscover_modules("listeners")

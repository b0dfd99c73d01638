"""Django app config: system checks, each capability's worker sources, and discovery of each
app's ``listeners`` module."""

import functools

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class PgmsgConfig(AppConfig):
    name = "pgmsg"
    verbose_name = "pgmsg messaging"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pgmsg import checks  # noqa: F401  (registers the checks)
        from pgmsg.channels import serving as channel_sources
        from pgmsg.core import sources
        from pgmsg.events import serving as subscription_sources
        from pgmsg.export import periodic
        from pgmsg.inbox import serving as inbox_sources
        from pgmsg.inbox.bridges import checks as bridge_checks  # noqa: F401  (registers them)
        from pgmsg.inbox.bridges import source as bridge_sources
        from pgmsg.outbox import checks as outbox_checks  # noqa: F401  (registers them)
        from pgmsg.outbox import serving as outbox_sources

        # The order here is the order a worker serves its sources in.
        sources.register("channel_names", channel_sources.worker_sources)
        sources.register("inboxes", inbox_sources.worker_sources)
        # Subscription workers start periodic archiving (PGMSG ARCHIVE_INTERVAL) with their
        # maintenance: the export's timer, handed over here so that events need not import it.
        subscriptions = functools.partial(
            subscription_sources.worker_sources, archive=periodic.PeriodicArchive
        )
        sources.register("subscriptions", subscriptions)
        sources.register("outboxes", outbox_sources.worker_sources)
        sources.register("bridges", bridge_sources.worker_sources)
        autodiscover_modules("listeners")

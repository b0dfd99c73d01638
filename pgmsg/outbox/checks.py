"""System checks of the outbox: destinations that parse, outboxes that name one."""

from __future__ import annotations

from django.core import checks

from pgmsg.core import conf, errors
from pgmsg.outbox import declarations, destinations


@checks.register()
def check_destinations(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every PGMSG["OUTBOX_DESTINATIONS"] entry parses (scheme, options, client library,
    importable callable), and every declared outbox names one of them."""
    try:
        configured = conf.get().OUTBOX_DESTINATIONS
    except errors.ConfigurationError:
        return []  # reported by pgmsg.E003
    problems: list[checks.CheckMessage] = []
    for name, value in sorted(configured.items()):
        try:
            destinations.validate(name, value)
        except errors.ConfigurationError as exc:
            problems.append(
                checks.Error(
                    str(exc),
                    hint="see docs/outbox.md for the URL of each broker",
                    id="pgmsg.E501",
                )
            )
    for outbox in sorted(declarations.registry.outboxes.values(), key=lambda o: o.name):
        if outbox.destination not in configured:
            problems.append(
                checks.Error(
                    f"outbox {outbox.name!r} publishes to destination {outbox.destination!r}, "
                    "which is not in PGMSG['OUTBOX_DESTINATIONS']",
                    hint=f"configured destinations: {sorted(configured)}",
                    id="pgmsg.E502",
                )
            )
    return problems

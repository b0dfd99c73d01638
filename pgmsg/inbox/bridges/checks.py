"""System checks of the bridges: each declaration parses and names a declared inbox."""

from __future__ import annotations

from django.core import checks

from pgmsg.core import conf, errors
from pgmsg.inbox import declarations as inbox
from pgmsg.inbox.bridges import brokers, declarations


@checks.register()
def check_bridges(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every PGMSG["INBOX_BRIDGES"] entry parses (keys, scheme, mapping, the client library
    and the broker's own options) and stores into a declared inbox."""
    try:
        configured = conf.get().INBOX_BRIDGES
    except errors.ConfigurationError:
        return []  # reported by pgmsg.E003
    problems: list[checks.CheckMessage] = []
    for name, value in sorted(configured.items()):
        try:
            bridge = declarations.parse(name, value)
            brokers.module(bridge).consumer(bridge).close()  # parses; connects nothing
        except errors.ConfigurationError as exc:
            problems.append(checks.Error(str(exc), hint="see docs/bridges.md", id="pgmsg.E601"))
            continue
        if bridge.inbox not in inbox.registry.inboxes:
            problems.append(
                checks.Error(
                    f"bridge {name!r} stores into inbox {bridge.inbox!r}, which is not declared",
                    hint=f"declare it with pgmsg.Inbox({bridge.inbox!r}); declared inboxes: "
                    f"{sorted(inbox.registry.inboxes)}",
                    id="pgmsg.E602",
                )
            )
    return problems

"""Which channel sources a worker serves (registered with the core by the app config)."""

from __future__ import annotations

from collections.abc import Iterable

from pgmsg.channels import declarations as channels
from pgmsg.channels.source import BroadcastSource, NotificationSource
from pgmsg.core import errors, sources


def worker_sources(options: sources.SourceOptions) -> list[NotificationSource | BroadcastSource]:
    """The worker's channel sources: the channels named, or every one with a listener."""
    names = options.named("channel_names")
    if names is None and not options.serve_all:
        return []
    stored, broadcast = _split_channels(names)
    found: list[NotificationSource | BroadcastSource] = []
    if stored:
        found.append(NotificationSource(stored))
    if broadcast:
        found.append(BroadcastSource(broadcast))
    return found


def _split_channels(names: Iterable[str] | None) -> tuple[set[str], set[str]]:
    """Channels to serve, as (exactly-once, broadcast); names given must be known and listened."""
    registry = channels.registry
    if names is None:
        wanted = {name for name, funcs in registry.listeners.items() if funcs}
    else:
        wanted = set()
        for name in names:
            registry.get(name)  # raises UnknownChannel with the known names
            if not registry.listeners.get(name):
                raise errors.ConfigurationError(f"channel {name!r} has no listener registered")
            wanted.add(name)
    stored = {n for n in wanted if registry.get(n).delivery == channels.EXACTLY_ONCE}
    return stored, wanted - stored

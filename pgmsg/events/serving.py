"""Which subscription sources a worker serves (registered with the core by the app config)."""

from __future__ import annotations

from collections.abc import Callable

from pgmsg.core import errors, sources
from pgmsg.events.source import Archiving, SubscriptionSource
from pgmsg.events.subscriptions import registry


def worker_sources(
    options: sources.SourceOptions, *, archive: Callable[[], Archiving] | None = None
) -> list[SubscriptionSource]:
    """The listen worker's subscription sources: those named, or every one with a handler;
    ``archive`` makes each one's periodic archive timer."""
    named = options.named("subscriptions")
    if named is not None:
        subs = []
        for name in named:
            sub = registry.get(name)
            if not any(sub.handlers.values()):
                raise errors.ConfigurationError(
                    f"subscription {name!r} has no handler registered; register one with "
                    f"@<subscription>.handler(EventClass)"
                )
            subs.append(sub)
    elif options.serve_all:
        subs = [s for s in registry.subscriptions.values() if any(s.handlers.values())]
    else:
        subs = []
    return [
        SubscriptionSource(sub, options.partition, archive() if archive else None)
        for sub in sorted(set(subs), key=lambda s: s.name)
    ]

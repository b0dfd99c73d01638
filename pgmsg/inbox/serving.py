"""Which inbox sources a worker serves (registered with the core by the app config)."""

from __future__ import annotations

from pgmsg.core import errors, sources
from pgmsg.inbox import declarations as inbox
from pgmsg.inbox.model_inbox import ModelInbox
from pgmsg.inbox.model_source import ModelInboxSource
from pgmsg.inbox.source import InboxSource


def worker_sources(options: sources.SourceOptions) -> list[InboxSource]:
    """The listen worker's inbox sources: those named, or every inbox with a handler."""
    registry = inbox.registry
    named = options.named("inboxes")
    if named is not None:
        names = []
        for name in named:
            registry.get(name)  # raises UnknownInbox with the known names
            if not registry.types(name):
                raise errors.ConfigurationError(
                    f"inbox {name!r} has no handler registered; register one with "
                    f"@pgmsg.inbox_handler({name!r}, 'some.type')"
                )
            names.append(name)
    elif options.serve_all:
        names = [name for name in registry.inboxes if registry.types(name)]
    else:
        names = []
    found: list[InboxSource] = []
    for name in sorted(set(names)):
        spec = registry.get(name)
        source_class = ModelInboxSource if isinstance(spec, ModelInbox) else InboxSource
        found.append(source_class(spec, options.partition))
    return found

"""Which outbox relays a worker runs (registered with the core by the app config)."""

from __future__ import annotations

from pgmsg.core import sources
from pgmsg.outbox import declarations
from pgmsg.outbox.logical_source import LogicalRelay
from pgmsg.outbox.source import OutboxRelay


def worker_sources(options: sources.SourceOptions) -> list[OutboxRelay]:
    """The listen worker's relays: the outboxes named, or every declared outbox."""
    named = options.named("outboxes")
    if named is not None:
        for name in named:
            declarations.registry.get(name)  # raises UnknownOutbox with the known names
        names = named
    elif options.serve_all:
        names = list(declarations.registry.outboxes)
    else:
        names = []
    relays = []
    for name in sorted(set(names)):
        spec = declarations.registry.get(name)
        relay = LogicalRelay if spec.capture == "logical" else OutboxRelay
        relays.append(relay(spec, options.partition))
    return relays

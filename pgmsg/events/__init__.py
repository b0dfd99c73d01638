"""The event store: events, streams, reads, subscriptions, aggregates.

``pgmsg.events.START`` (also ``pgmsg.START``) is the checkpoint before the first event.
"""

from pgmsg.events.store import START, Checkpoint

__all__ = ["START", "Checkpoint"]

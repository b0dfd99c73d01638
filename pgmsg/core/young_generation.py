"""The garbage collector's threshold while a worker runs batches (core/worker.py)."""

from __future__ import annotations

import contextlib
import gc

#: Objects the garbage collector tracks per message of a running batch, with room to spare:
#: an event read keeps about five alive (its RecordedEvent, data and metadata dicts, typed
#: event and that one's metadata) until its batch ends.
TRACKED_PER_MESSAGE = 10


@contextlib.contextmanager
def young_generation_for(batch_size: int):
    """Raise the garbage collector's first threshold, for the block, above what one batch keeps
    alive (TRACKED_PER_MESSAGE * ``batch_size``), and restore it after.

    A batch's objects live until the batch ends and then die together. At CPython's default
    (700 net allocations), a batch of 1,000 events set off about nine collections, each walking
    every object of the batch still alive, and promoted them until full collections walked the
    whole process (Django's objects too): a fifth of a subscription's catch-up time went there
    (measured with gc.callbacks, docs/decisions.md). Above one batch, the batch's objects are
    freed by their reference counts before a collection comes due. Cycles a handler leaves
    behind are still collected, only after more allocations. A threshold of 0 (automatic
    collection off) or one already higher is left alone."""
    before = gc.get_threshold()
    wanted = TRACKED_PER_MESSAGE * batch_size
    if before[0] == 0 or before[0] >= wanted:
        yield
        return
    gc.set_threshold(wanted, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)

"""Where a claim in id order starts: past its last full batch.

The notification and inbox claims read a partial index of pending rows in id order. The rows a
worker has handled (deleted notifications, acknowledged inbox messages) leave their entries at
that index's head until vacuum removes them, and a claim from the start walks them all on every
batch (docs/channels.md, docs/inbox.md). So while batches come back full the next claim starts
past the last one. It starts from the start again when a batch comes back short, when rows were
put back below (``from_start``), and at least every ``interval`` seconds, so that rows that
appear below (a retry coming due, a producer's late commit, another worker's rolled-back batch)
wait at most about that long behind a backlog. A caller whose read past the last batch finds
too few reads the rest from the start in the same transaction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence


class ClaimStart:
    """One source's claim start (``interval``: most seconds between reads from the start)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        #: The id the next claim starts from; 0 is the start.
        self.from_id = 0
        self._next_from_start = 0.0

    def next(self) -> int:
        """Where the next claim starts: from the start once ``interval`` has passed."""
        now = time.monotonic()
        if now >= self._next_from_start:
            self.from_id, self._next_from_start = 0, now + self.interval
        return self.from_id

    def claimed(self, rows: Sequence[Sequence], limit: int) -> None:
        """After a claim of ``rows`` sorted by id (the id first): past them if the batch is
        full, else from the start."""
        self.from_id = rows[-1][0] + 1 if len(rows) >= limit else 0

    def from_start(self) -> None:
        """Rows were put back below where the next claim would start."""
        self.from_id = 0

    def again_from(self, first_id: int) -> None:
        """The batch that began at ``first_id`` was rolled back, to be claimed again (the
        claim with a savepoint per row: Worker.process), not the rows past it."""
        self.from_id = first_id

"""Wake-ups: producers NOTIFY only while a worker for their rows is idle (docs/wakeups.md).

PostgreSQL serializes the commits of every transaction that has a pending NOTIFY (one global
lock held until the commit is flushed), so a NOTIFY in each producing transaction stops
concurrent producers from sharing WAL flushes. Here a worker that has nothing left to claim
*declares itself idle* for the wake payloads it serves, by holding a shared session-level
advisory lock per payload; producers call the SQL function ``pgmsg_wake(payload[, scope])``
(from their statement triggers), which NOTIFYs only when such a lock is held. A busy system
has no idle worker, so its producers commit without NOTIFY.

The race (a producer that checked before the declaration and commits after the worker's last
look at its table) is closed by a barrier: ``pgmsg_wake`` holds a shared transaction-level
lock on the payload's "producing" key from its check until its commit, and the worker, after
declaring, waits until it can take that key exclusively (every producer that checked before
the declaration has then committed or rolled back) and only then looks at its tables again.
The worker never blocks on that key (it tries, and polls again after a short pause), so a long
producer transaction delays only that worker's sleep, never other producers.

The SQL functions live in core/functions.sql; their lock keys are (class, hashtext(payload))
with the two classes below. Since the producing lock is held until the transaction ends, one
``pgmsg_wake`` per payload and transaction is enough: ``wake_once_sql`` (the notification row
trigger; ``pgmsg_send`` does the same inline) remembers the last payload woken in a
transaction-local setting (``WOKEN_SQL``), which a row trigger's WHEN can test to skip a row.
"""

from __future__ import annotations

from collections.abc import Iterable

from pgmsg.core import locks, sql

QUERIES = sql.load(__package__, "wake.sql")

#: The NOTIFY channel that wakes workers for stored rows (exactly-once channels, inboxes,
#: events, ...). Its payload names what to look at (a channel, "inbox:<name>", ...).
WAKE_CHANNEL = "pgmsg"

#: The SQL function a producer's trigger calls once per distinct wake payload per statement:
#: ``pgmsg_wake(payload text, scope text DEFAULT NULL)``. ``scope`` is a second payload whose
#: idle workers also want this wake-up (the catch-all "events" for "events:<category>").
WAKE_FUNCTION = "pgmsg_wake"

#: The payload this transaction last woke through wake_once_sql (NULL or '' when none). It is
#: a transaction-local setting (set_config(..., true)): undone when the transaction ends, and
#: when a savepoint rolls back, together with the producing lock taken under it.
WOKEN_SQL = "current_setting('pgmsg.woken', true)"

#: Advisory lock classes (the first int of the two-int form, core/locks.py): idle workers hold
#: (IDLE_CLASS, hashtext(payload)) shared; producers hold (PRODUCING_CLASS, hashtext(payload))
#: shared until they commit. The SQL functions (core/functions.sql) hold the same literals.
IDLE_CLASS = locks.IDLE
PRODUCING_CLASS = locks.PRODUCING

#: First pause between looks for work while a worker lingers (PGMSG IDLE_AFTER) before
#: declaring itself idle; it doubles at each look that finds nothing.
LINGER_POLL = 0.001

#: First and longest pause between barrier attempts while producers are mid-transaction.
POLL_FIRST = 0.001
POLL_MAX = 0.1


def wake_sql(payload: str, scope: str | None = None) -> str:
    """The SQL call a trigger function makes to wake idle workers; arguments are SQL
    expressions (quote literals yourself: ``wake_sql("'inbox:' || i.inbox")``)."""
    args = payload if scope is None else f"{payload}, {scope}"
    return f"{WAKE_FUNCTION}({args})"


def wake_once_sql(payload: str) -> str:
    """PL/pgSQL that wakes for ``payload`` (an SQL expression, as in wake_sql) unless this
    transaction already did, and remembers it (WOKEN_SQL)."""
    return (
        f"IF {WOKEN_SQL} IS DISTINCT FROM {payload} THEN "
        f"PERFORM {wake_sql(payload)}; PERFORM set_config('pgmsg.woken', {payload}, true); "
        "END IF;"
    )


class IdleDeclaration:
    """One worker's declaration that it is idle for some wake payloads, on its own connection.

    ``declare()`` before sleeping, ``withdraw()`` as soon as a claim finds work again. The
    locks are session-level, so they live exactly as long as the connection: call ``lost()``
    when it is closed or broken.
    """

    def __init__(self, payloads: Iterable[str]) -> None:
        self.payloads = sorted(set(payloads))
        #: Payloads whose idle lock this session holds.
        self.held: set[str] = set()
        #: Held payloads whose barrier has not passed yet (their tables need another look).
        self.unsettled: set[str] = set()
        self._poll = POLL_FIRST
        #: The psycopg connection whose session holds the locks.
        self._session = None

    @property
    def declared(self) -> bool:
        return bool(self.held)

    @property
    def settled(self) -> bool:
        """Every payload is declared and its barrier passed: sleeping is safe."""
        return len(self.held) == len(self.payloads) and not self.unsettled

    def declare(self, cursor) -> bool:
        """Take the missing idle locks and try the barrier; True when it passed just now,
        which means: look at every table once more before sleeping."""
        missing = [p for p in self.payloads if p not in self.held]
        check = sorted(self.unsettled.union(missing))
        if not check:
            return False
        cursor.execute(QUERIES["declare_idle"], {"missing": missing, "settle": check})
        declared, passed = cursor.fetchone()
        self._session = cursor.connection
        self.held.update(declared)
        self.unsettled.update(declared)
        if passed:
            self.unsettled.clear()
        if self.settled:
            self._poll = POLL_FIRST
            return True
        return False

    def poll_delay(self) -> float:
        """How long to wait before trying the barrier again (doubles up to POLL_MAX)."""
        delay, self._poll = self._poll, min(self._poll * 2, POLL_MAX)
        return delay

    def withdraw(self, cursor) -> None:
        """Busy again: producers stop NOTIFYing for these payloads."""
        if self.held:
            cursor.execute(QUERIES["withdraw"], {"payloads": sorted(self.held)})
        self.lost()

    def held_by(self, connection) -> bool:
        """Whether the locks are still those of ``connection`` (the worker's current psycopg
        connection): a handler that closed the Django connection took them with it."""
        return self._session is connection and not connection.closed

    def lost(self) -> None:
        """The connection holding the locks is gone (they went with it)."""
        self.held.clear()
        self.unsettled.clear()
        self._poll = POLL_FIRST
        self._session = None

"""The worker's side of a silent network partition (no FIN, no RST): CONNECTION_DEAD_AFTER.

PostgreSQL's keepalives (worker.sql's configure_session) end the server's side of a worker
session whose host went silent; the worker's own sockets need libpq's. Without them, its LISTEN
socket never becomes readable, and its next statement (its sweep, at the latest) waits without
a word for the kernel to give up retransmitting it (Linux: about 15 minutes). With them,
the kernel reports the socket dead (ETIMEDOUT) after about CONNECTION_DEAD_AFTER seconds, the
wait returns, the statement under way fails, and the worker reconnects as after any lost
connection.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket

from django.db.backends.base.base import BaseDatabaseWrapper

from pgmsg.core import conf


def client_options() -> dict[str, int]:
    """CONNECTION_DEAD_AFTER as libpq connection parameters: keepalive probes that give up on a
    silent server within about that time (idle, then three probes), tcp_user_timeout for a
    statement sent and never acknowledged, connect_timeout for a connection attempt."""
    seconds = conf.get().CONNECTION_DEAD_AFTER
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, int(seconds / 2)),
        "keepalives_interval": max(1, int(seconds / 6)),
        "keepalives_count": 3,
        "tcp_user_timeout": max(1, int(seconds * 1000)),
        "connect_timeout": max(2, int(seconds)),  # libpq takes 1 as 2
    }


@contextlib.contextmanager
def on(db: BaseDatabaseWrapper):
    """Give ``db``'s connections client_options() for the block: merged into its OPTIONS under
    what the user set there, and taken back out after. Psycopg connections the worker opens from
    ``db.get_connection_params()`` (its LISTEN connection) get them too.

    A connection already open keeps its session (a caller's transaction, locks): its socket
    gets the same settings from the kernel directly."""
    before = db.settings_dict.get("OPTIONS", {})
    options = db.settings_dict["OPTIONS"] = {**client_options(), **before}
    if db.connection is not None and not db.connection.closed and int(options["keepalives"]):
        on_socket(db.connection.fileno(), options)
    try:
        yield
    finally:
        db.settings_dict["OPTIONS"] = before


def on_socket(fd: int, options: dict) -> None:
    """Set ``options``' keepalives and tcp_user_timeout on the open socket ``fd``, as libpq
    sets them on the sockets it opens (TCP only; what the system lacks is left out)."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, key in (
            ("TCP_KEEPIDLE", "keepalives_idle"),
            ("TCP_KEEPINTVL", "keepalives_interval"),
            ("TCP_KEEPCNT", "keepalives_count"),
            ("TCP_USER_TIMEOUT", "tcp_user_timeout"),
        ):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), int(options[key]))


#: How the kernel's verdict reads in libpq's messages ("could not receive data from server:
#: Connection timed out"): keepalive probes or tcp_user_timeout ran out.
TIMED_OUT = os.strerror(errno.ETIMEDOUT)


def silence_in(exc: BaseException) -> BaseException | None:
    """The error in ``exc``'s chain that says the kernel gave up on a connection for want of an
    answer, if any. Not always ``exc`` itself: a batch's atomic block that fails to roll back
    on the dead connection closes it, and Django's exit opens a new one, whose failure
    (connect_timeout, during the partition) is what reaches the worker."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        if TIMED_OUT in str(error):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None

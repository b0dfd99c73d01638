"""Whether pgmsg's migrations ran on a database: the system check, ``listen`` at start, and
the producers' errors when they did not.

The producers (notify(), receive(), publish(), append()) ask nothing beforehand: they are
measured per call. Their statement fails with PostgreSQL's undefined_function or
undefined_table naming a pgmsg object, and translate() turns that into NotMigrated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from django.db import DatabaseError, connections

from pgmsg.core import errors

#: undefined_function (pgmsg_send(), pgmsg_receive(), ...) and undefined_table.
_UNDEFINED = {"42883", "42P01"}

HINT = "run `python manage.py migrate`"

#: What a producer's statement raises: Django's wrapped errors, or psycopg's own where the
#: statement went below Django's cursor.
ERRORS = (DatabaseError, psycopg.Error)


def unapplied(alias: str) -> list[str] | None:
    """pgmsg's migrations not applied on database ``alias`` (names, in order), or None when
    the database cannot be reached (what tried to connect reports that)."""
    from django.db.migrations.loader import MigrationLoader

    try:
        loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    except DatabaseError:
        return None
    found: list[str] = []
    for leaf in loader.graph.leaf_nodes("pgmsg"):
        for node in loader.graph.forwards_plan(leaf):
            if node[0] == "pgmsg" and node not in loader.applied_migrations:
                if node[1] not in found:
                    found.append(node[1])
    return found


def describe(alias: str, missing: list[str]) -> str:
    return (
        f"{len(missing)} of pgmsg's migrations are not applied on database {alias!r} "
        f"(PGMSG['DATABASE']): {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}"
    )


def translate(exc: BaseException, alias: str) -> None:
    """Raise NotMigrated (from ``exc``) when ``exc`` is PostgreSQL saying a pgmsg function or
    table does not exist; else return, and the caller re-raises ``exc``."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if getattr(cause, "sqlstate", None) in _UNDEFINED and "pgmsg_" in str(cause):
        first = str(cause).strip().splitlines()[0]
        raise errors.NotMigrated(
            f"pgmsg's tables and functions are missing on database {alias!r} ({first}): "
            f"{HINT} for that database"
        ) from exc


@contextlib.contextmanager
def translated(alias: str) -> Iterator[None]:
    """translate() around a block (for the producers' many-message forms)."""
    try:
        yield
    except ERRORS as exc:
        translate(exc, alias)
        raise

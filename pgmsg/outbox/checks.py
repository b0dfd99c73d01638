"""System checks of the outbox: destinations that parse, outboxes that name one."""

from __future__ import annotations

from django.core import checks
from django.db import connections

from pgmsg.core import conf, errors, sql
from pgmsg.outbox import declarations, destinations

QUERIES = sql.load(__package__, "logical.sql")


@checks.register()
def check_destinations(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every PGMSG["OUTBOX_DESTINATIONS"] entry parses (scheme, options, client library,
    importable callable), and every declared outbox names one of them."""
    try:
        configured = conf.get().OUTBOX_DESTINATIONS
    except errors.ConfigurationError:
        return []  # reported by pgmsg.E003
    problems: list[checks.CheckMessage] = []
    for name, value in sorted(configured.items()):
        try:
            destinations.validate(name, value)
        except errors.ConfigurationError as exc:
            problems.append(
                checks.Error(
                    str(exc),
                    hint="see docs/outbox.md for the URL of each broker",
                    id="pgmsg.E501",
                )
            )
    for outbox in sorted(declarations.registry.outboxes.values(), key=lambda o: o.name):
        if outbox.destination not in configured:
            problems.append(
                checks.Error(
                    f"outbox {outbox.name!r} publishes to destination {outbox.destination!r}, "
                    "which is not in PGMSG['OUTBOX_DESTINATIONS']",
                    hint=f"configured destinations: {sorted(configured)}",
                    id="pgmsg.E502",
                )
            )
    return problems


@checks.register(checks.Tags.database)
def check_logical_capture(app_configs=None, databases=None, **kwargs) -> list[checks.CheckMessage]:
    """A logical outbox needs wal_level = logical (E503), and a slot whose relay stalls keeps
    WAL until the disk fills unless max_slot_wal_keep_size caps it (W503)."""
    logical = sorted(
        o.name for o in declarations.registry.outboxes.values() if o.capture == "logical"
    )
    try:
        database = conf.get().DATABASE
    except errors.ConfigurationError:
        return []
    if not logical or database not in (databases or ()):
        return []
    with connections[database].cursor() as cursor:
        cursor.execute(QUERIES["wal_keep_size"])
        keep_size, wal_level = cursor.fetchone()
    problems: list[checks.CheckMessage] = []
    if wal_level != "logical":
        problems.append(
            checks.Error(
                f"outbox(es) {logical} have capture='logical', which needs wal_level = logical; "
                f"the server of database {database!r} has wal_level = {wal_level}",
                hint="set wal_level = logical in postgresql.conf and restart PostgreSQL, or "
                "declare the outboxes with capture='table'",
                id="pgmsg.E503",
            )
        )
    if keep_size == "-1":
        problems.append(
            checks.Warning(
                f"outbox(es) {logical} read replication slots, and max_slot_wal_keep_size is -1 "
                "(unlimited): a relay that stops makes its slot keep WAL until the disk is full",
                hint="set max_slot_wal_keep_size (e.g. '10GB') in postgresql.conf; a slot past "
                "it is invalidated (its unrelayed messages are lost: the relay stops, and "
                "`manage.py pgmsg_outbox drop-slot NAME --yes` lets it start over) instead of "
                "filling the disk",
                id="pgmsg.W503",
            )
        )
    return problems

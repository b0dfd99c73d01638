"""System checks run at start-up (``manage.py check``, ``migrate``, ``listen``)."""

from __future__ import annotations

import sys

from django.conf import settings
from django.core import checks
from django.db import connections

from pgmsg.channels import declarations as channels
from pgmsg.core import conf, errors, schema
from pgmsg.inbox import declarations as inboxes
from pgmsg.inbox import (
    model_inbox,
    webhooks,  # noqa: F401  (registers check_webhooks)
)


@checks.register(checks.Tags.database, checks.Tags.compatibility)
def check_database(app_configs=None, **kwargs):
    try:
        alias = conf.get().DATABASE
    except errors.ConfigurationError:
        return []  # reported by check_settings
    if alias not in settings.DATABASES:
        return [
            checks.Error(
                f"PGMSG['DATABASE'] is {alias!r}, which is not in DATABASES",
                hint=f"use one of {sorted(settings.DATABASES)}",
                id="pgmsg.E001",
            )
        ]
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        return [
            checks.Error(
                f"pgmsg needs PostgreSQL, but database {alias!r} uses {vendor!r}",
                hint="set its ENGINE to 'django.db.backends.postgresql' (psycopg 3)",
                id="pgmsg.E002",
            )
        ]
    return []


@checks.register(checks.Tags.database)
def check_migrated(app_configs=None, databases=None, **kwargs):
    """pgmsg's migrations unapplied on PGMSG["DATABASE"]: notify() and the workers would fail
    on missing functions and tables.

    Django passes ``databases`` only from ``check --database`` and ``migrate``; a plain
    ``manage.py check`` (and a command's own checks: ``listen``, ``runserver``) passes None,
    and is answered for PGMSG["DATABASE"] too, since that is where the question was asked
    (issue 44). ``migrate``'s own checks are left alone: it is about to apply them. An
    unreachable database gives no message here: what connects next reports it."""
    try:
        alias = conf.get().DATABASE
    except errors.ConfigurationError:
        return []  # reported by check_settings
    if alias not in settings.DATABASES or (databases is not None and alias not in databases):
        return []
    if connections[alias].vendor != "postgresql" or _running_migrate():
        return []
    missing = schema.unapplied(alias)
    if not missing:
        return []
    return [
        checks.Error(
            schema.describe(alias, missing),
            hint=f"{schema.HINT}"
            + ("" if alias == "default" else f" --database {alias}")
            + " (pgmsg's tables and functions do not exist there yet)",
            id="pgmsg.E010",
        )
    ]


def _running_migrate() -> bool:
    """Whether these checks are a migration command's (a caller up the stack is one): those
    must run on a database that is not migrated yet (``migrate`` applies what this check
    reports; ``makemigrations`` writes the user's own migrations first, as the quick start
    does). ``call_command`` too, hence the stack rather than ``sys.argv``."""
    from django.core.management.commands import (
        makemigrations,
        migrate,
        optimizemigration,
        showmigrations,
        sqlmigrate,
        squashmigrations,
    )

    commands = tuple(
        module.Command
        for module in (
            makemigrations,
            migrate,
            optimizemigration,
            showmigrations,
            sqlmigrate,
            squashmigrations,
        )
    )
    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), commands):
            return True
        frame = frame.f_back
    return False


@checks.register()
def check_settings(app_configs=None, **kwargs):
    problems = []
    try:
        conf.get()
    except errors.ConfigurationError as exc:
        problems.append(checks.Error(str(exc), id="pgmsg.E003"))
    if "pgtrigger" not in settings.INSTALLED_APPS:
        problems.append(
            checks.Error(
                "pgmsg needs django-pgtrigger installed",
                hint="add 'pgtrigger' to INSTALLED_APPS",
                id="pgmsg.E004",
            )
        )
    return problems


@checks.register()
def check_listeners(app_configs=None, **kwargs):
    """Every listener must name a declared channel (a typo would otherwise never run)."""
    return [
        checks.Error(
            f"listener(s) registered for unknown channel {name!r}: "
            + ", ".join(f"{f.__module__}.{f.__qualname__}" for f in funcs),
            hint=f"declared channels: {sorted(channels.registry.channels)}",
            id="pgmsg.E005",
        )
        for name, funcs in sorted(channels.registry.listeners.items())
        if funcs and name not in channels.registry.channels
    ]


@checks.register()
def check_model_inboxes(app_configs=None, **kwargs):
    """A model inbox's claim needs an index over the unprocessed rows, or every claim reads
    every processed row of the project's table (model_inbox.missing_claim_index)."""
    problems = []
    for name, spec in sorted(inboxes.registry.inboxes.items()):
        if not isinstance(spec, model_inbox.ModelInbox):
            continue
        index = model_inbox.missing_claim_index(spec)
        if index is not None:
            label = spec.model._meta.label
            problems.append(
                checks.Warning(
                    f"model inbox {name!r}: {label} has no index over its unprocessed rows; "
                    "each claim reads the primary key's index from its start, over every "
                    "processed row",
                    hint=f"add to {label}.Meta.indexes (then makemigrations): {index}",
                    obj=spec.model,
                    id="pgmsg.W001",
                )
            )
    return problems

"""System checks run at start-up (``manage.py check``, ``migrate``, ``listen``)."""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.db import connections

from pgmsg.channels import declarations as channels
from pgmsg.core import conf, errors


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

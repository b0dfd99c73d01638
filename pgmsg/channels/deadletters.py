"""Dead letters of exactly-once channels: list, status, replay, discard."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import connections, transaction
from django.db.models import Count

from pgmsg.core import conf, sql

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "notifications.sql")


def dead_letters(channel: str | None = None):
    """Dead notifications, oldest first, optionally of one channel (a queryset of
    ``NotificationDeadLetter``: the notification's id, channel, payload, attempts, created_at,
    last_error and last_failed_at)."""
    from pgmsg.models import NotificationDeadLetter

    rows = NotificationDeadLetter.objects.using(conf.get().DATABASE)
    if channel is not None:
        rows = rows.filter(channel=channel)
    return rows.order_by("id")


def status() -> dict[str, int]:
    """How many dead notifications each channel holds (channels with none are left out)."""
    rows = (
        dead_letters()
        .values("channel")
        .annotate(n=Count("id"))
        .order_by("channel")
        .values_list("channel", "n")
    )
    return dict(rows)


def replay(ids: Iterable[int] | None = None, *, channel: str | None = None) -> int:
    """Make dead (or retrying) notifications due now with a fresh attempt count.

    By ``ids``, or every dead letter of ``channel`` when only that is given. A dead letter
    moves back to the pending notifications with its id. Returns how many were replayed;
    workers are woken at commit.
    """
    id_list = _select(ids, channel)
    with transaction.atomic(using=conf.get().DATABASE):
        with connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute(QUERIES["replay_notifications"], {"ids": id_list})
            count = cursor.fetchone()[0]
    logger.info("pgmsg: replayed %s notification(s)", count)
    return count


def discard(
    ids: Iterable[int] | None = None, *, channel: str | None = None, reason: str = ""
) -> int:
    """Delete dead notifications for good (by ``ids``, or all dead of ``channel``).

    The rows are gone afterwards: the log line (ids, and ``reason``, e.g. who asked) is the
    record of what was discarded.
    """
    id_list = _select(ids, channel)
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["discard_notifications"], {"ids": id_list})
        count = cursor.rowcount
    logger.warning(
        "pgmsg: discarded %s dead notification(s) of ids %s%s",
        count,
        id_list,
        f": {reason}" if reason else "",
    )
    return count


def missing(ids: Iterable[int], *, action: str) -> list[int]:
    """The ``ids`` that ``action`` ("replay" or "discard") would not find: not dead letters
    (nor, for replay, notifications retrying after a failure). Sorted."""
    from pgmsg.models import Notification

    wanted = {int(i) for i in ids}
    found = set(dead_letters().filter(id__in=wanted).values_list("id", flat=True))
    if action == "replay":
        retrying = Notification.objects.using(conf.get().DATABASE).filter(
            id__in=wanted - found, attempts__gt=0
        )
        found.update(retrying.values_list("id", flat=True))
    return sorted(wanted - found)


def _select(ids: Iterable[int] | None, channel: str | None) -> list[int]:
    if ids is not None:
        return [int(i) for i in ids]
    if channel is None:
        raise ValueError("name the notifications: ids=[...] or channel=...")
    return list(dead_letters(channel).values_list("id", flat=True))

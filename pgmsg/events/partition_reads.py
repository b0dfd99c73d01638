"""The statement through which a subscription worker holds a partition and reads its events
(subscriptions.sql, read_partition): its parameters, and where things are in its rows."""

from __future__ import annotations

from pgmsg.events import partitions as store_partitions
from pgmsg.events.subscriptions import QUERIES, Subscription, read_function

#: In a read's rows (subscriptions.sql, read_partition): the event columns are [7:EVENT_END];
#: the horizon the read used is in the partition's row, at HORIZON_USED, ...
EVENT_END = 16
HORIZON_USED = 16
#: ... and whether a claim of events whose batch died is on record (functions.sql): only
#: then must the batch's handlers wait for its claim record's answer (core/claims.py).
CRASH_ON_RECORD = 17


def read_parameters(
    sub: Subscription,
    partition: int,
    xmin: int | None,
    limit: int,
    floor: store_partitions.Floor | None = None,
) -> dict:
    """The parameters of read_partition for one partition of ``sub``: events below ``xmin``
    (None: the read reads the horizon itself), up to ``limit``, from ``floor`` on (None: every
    month)."""
    return {
        "subscription": sub.name,
        "partition": partition,
        "xmin": xmin,
        "category": sub.category,
        "types": sub.types,
        "limit": limit,
        "floor": floor and floor.at,
        "floor_xid": floor.xid if floor else 0,
        "floor_oids": floor.oids if floor else [],
        "floor_seals": floor.seals if floor else [],
        "floor_lowest": floor and floor.lowest,
    }


def read_query(sub: Subscription) -> str:
    """read_partition, calling ``sub``'s read function (a name pgmsg makes: no quoting)."""
    return QUERIES["read_partition"].format(function=read_function(sub))

"""The registry of exportable tables: which table each dataset comes from, and how to read it."""

from __future__ import annotations

import dataclasses
import re

from pgmsg.core import errors

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """How one table is exported. Its columns are read from the database catalog."""

    #: Dataset name: the directory under the output path and the watermark's key.
    name: str
    table: str
    #: Unique, increasing integer column: split into ranges, one per Spark partition.
    key: str
    #: Its UTC day is the default output partition.
    timestamp: str
    type_column: str | None = None
    category_column: str | None = None
    #: JSON column whose top-level fields ``flatten`` may copy into columns of their own.
    payload_column: str | None = None
    #: An xid8 column set to pg_current_xact_id() on insert (and, for tables whose rows
    #: change, on every update); None exports snapshots.
    transaction_column: str | None = None
    #: Whether rows change after they are written. An incremental export of such a table is a
    #: log of row versions: a changed row is exported again; its newest version (highest
    #: transaction id) is its current state.
    mutable: bool = False

    @property
    def incremental(self) -> bool:
        return self.transaction_column is not None


_REGISTRY: dict[str, TableSpec] = {}


def register(spec: TableSpec) -> TableSpec:
    """Add (or replace) a table spec; later message tables register themselves here."""
    if not NAME_RE.match(spec.name):
        raise errors.ConfigurationError(f"export dataset name {spec.name!r} is not a plain name")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered() -> dict[str, TableSpec]:
    return dict(_REGISTRY)


def get(name: str) -> TableSpec:
    """The spec of dataset ``name``; ExportError names the registered ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise errors.ExportError(
            f"export: unknown table(s) {[name]}; registered: {sorted(_REGISTRY)}"
        ) from None


register(
    TableSpec(
        name="events",
        table="pgmsg_event",
        key="position",
        timestamp="recorded_at",
        type_column="type",
        category_column="category",
        payload_column="data",
        transaction_column="transaction_id",
    )
)
# Inbox messages change status (pending -> processed, dead, discarded) and attempts: a trigger
# moves a changed row's transaction_id to the updating transaction, so the next incremental run
# exports its new version.
register(
    TableSpec(
        name="inbox_messages",
        table="pgmsg_inbox_message",
        key="id",
        timestamp="received_at",
        type_column="type",
        category_column="inbox",
        payload_column="payload",
        transaction_column="transaction_id",
        mutable=True,
    )
)
# Handled notifications are deleted, so these tables only ever hold pending, retrying and dead
# rows and have no transaction id: each run exports what is there now. The view
# pgmsg_notification_stored (made by the migrations) joins the pending ones and the dead
# letters (a table of their own) with their status.
register(
    TableSpec(
        name="notifications",
        table="pgmsg_notification_stored",
        key="id",
        timestamp="created_at",
        type_column="channel",
        payload_column="payload",
    )
)

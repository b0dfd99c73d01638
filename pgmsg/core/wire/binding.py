"""A batch's opening statement bound once per connection (batches.opening_rows' ``varying``):
the text of the parameters that stay the same, bound as psycopg's client-side cursor binds
them, kept; the integers that change from call to call written in on each call
(bound_once), or left as ``$1``... for a statement prepared on the connection
(with_placeholders)."""

from __future__ import annotations

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

#: Integers bound in place of the varying parameters (bound_once), then found in the text:
#: 19 digits that no claim's own text holds (it is checked).
_MARK = 7_239_562_148_031_000_000
#: Most statements bound_once keeps per connection: a worker's sources use one or two each
#: (a subscription partition's read: with its horizon, and without).
_BOUND_KEPT = 128


def bound_once(
    db: BaseDatabaseWrapper, raw_cursor, query: str, params: dict[str, Any], varying: tuple
) -> bytes:
    """``query`` bound with ``params`` as the cursor's mogrify binds it, for a batch's first
    statement: bound once per connection and values of the parameters not in ``varying``
    (mogrify took about 4 % of a drain's batch, most of it in psycopg's list dumper for the
    channels' array), the ``varying`` integers written in on each call, as psycopg writes an
    integer (a space before a negative one, so that no operator runs into its sign)."""
    encoding = db.connection.info.encoding
    # A varying parameter that is None this time is bound as NULL with the fixed ones (a
    # statement kept apart from the one its integers are written into).
    varying = tuple(name for name in varying if params[name] is not None)
    if any(type(params[name]) is not int for name in varying):
        return raw_cursor.mogrify(query, params).encode(encoding)
    kept = _kept(db, "_pgmsg_bound")
    try:
        key = _key(query, params, varying)
        split = kept.get(key)
    except TypeError:  # a value that cannot be a key (a dict): bound each time
        key, split = None, None
    if split is None:
        split = _split_at_marks(raw_cursor.mogrify, query, params, varying, encoding)
        if key is not None:
            kept[key] = split
    names, pieces = split
    if not pieces:  # a mark was not found once in the text
        return raw_cursor.mogrify(query, params).encode(encoding)
    parts = [pieces[0]]
    for name, piece in zip(names, pieces[1:], strict=True):
        value = params[name]
        parts += (b"%d" % value if value >= 0 else b" %d" % value), piece
    return b"".join(parts)


def _split_at_marks(
    mogrify, query: str, params: dict[str, Any], varying: tuple, encoding: str
) -> tuple[list[str], list[bytes]]:
    """``query`` bound with a mark in place of each varying parameter, split around them:
    (the varying names in the order of their places in the text, the text between them);
    no pieces when a mark is not found exactly once."""
    marks = {b"%d" % (_MARK + i): name for i, name in enumerate(varying)}
    text = mogrify(query, {**params, **{name: int(m) for m, name in marks.items()}})
    text = text.encode(encoding)
    if any(text.count(mark) != 1 for mark in marks):
        return [], []
    places = sorted((text.index(mark), mark) for mark in marks)
    names, pieces, start = [], [], 0
    for place, mark in places:
        names.append(marks[mark])
        pieces.append(text[start:place])
        start = place + len(mark)
    return names, [*pieces, text[start:]]


def _kept(db: BaseDatabaseWrapper, name: str) -> dict:
    """The statements kept under ``name`` for ``db``'s current connection (at most
    _BOUND_KEPT: a new connection, or one more, starts afresh)."""
    kept = db.__dict__.get(name)
    if kept is None or kept[0] is not db.connection or len(kept[1]) >= _BOUND_KEPT:
        kept = db.__dict__[name] = (db.connection, {})
    return kept[1]


def _key(query: str, params: dict[str, Any], varying: tuple) -> tuple:
    """What a kept statement is kept under: the query and its fixed parameters' values (a
    TypeError where one cannot be a key)."""
    return (query, *((k, type(v), _frozen(v)) for k, v in params.items() if k not in varying))


def _frozen(value: Any) -> Any:
    # Beside its type in the key: 1 and True, or a list and a tuple, bind differently.
    return tuple(value) if isinstance(value, list) else value


def with_placeholders(
    db: BaseDatabaseWrapper, raw_cursor, query: str, params: dict[str, Any], varying: tuple
) -> tuple[bytes, list[str]] | None:
    """(``query`` bound as bound_once binds it, with ``$1``... in place of the varying
    integers, to be prepared; those integers' names in that order), kept per connection as
    bound_once keeps its statements; None where bound_once would bind it whole (a varying
    value that is neither an integer nor None, a fixed one that cannot be a key). A varying
    None is sent as NULL in its place, to the same statement."""
    if any(type(params[name]) is not int and params[name] is not None for name in varying):
        return None
    kept = _kept(db, "_pgmsg_prepared")
    try:
        key = _key(query, params, varying)
        statement = kept.get(key)
    except TypeError:  # a value that cannot be a key (a dict)
        return None
    if statement is None:
        encoding = db.connection.info.encoding
        names, pieces = _split_at_marks(raw_cursor.mogrify, query, params, varying, encoding)
        if not pieces:
            return None
        text = pieces[0] + b"".join(
            b"$%d" % number + piece for number, piece in enumerate(pieces[1:], 1)
        )
        statement = kept[key] = (text, names)
    return statement

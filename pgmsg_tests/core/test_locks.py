"""Every advisory lock pgmsg takes is one that core/locks.py names, and no two of them meet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection

import pgmsg
from pgmsg.core import errors, locks, names

PACKAGE = Path(pgmsg.__file__).parent
#: A call that takes or releases an advisory lock, and its first argument.
_CALL = re.compile(r"pg_(?:try_)?advisory_(?:xact_)?(?:lock|unlock)(?:_shared)?\(\s*")
#: Class arguments that take the class from core/locks.py: a parameter the caller fills in from
#: it, or a literal the test checks against it below.
_PARAMETER = re.compile(r"%\(lock_class\)s|hashtext\(%\(lock_space\)s \|\| ")
_NUMBER = re.compile(r"(\d+)\b")
_TEXT = re.compile(r"hashtext\('([^']*)'\)")
_NAMED_TEXT = re.compile(r"hashtext\('\{locks\.(\w+)\}'\)")
#: The export's one-key locks: hashtext of locks.EXPORT_BATCH or of a checkpoint directory
#: (export/watermarks.py passes it).
_EXPORT = re.compile(r"hashtext\(%\(name\)s\)\)")


def class_arguments(text: str) -> list[str]:
    """The text after each advisory-lock call's opening parenthesis (up to 60 characters)."""
    return [text[m.end() : m.end() + 60] for m in _CALL.finditer(text)]


def unnamed(argument: str) -> bool:
    """Whether the class in ``argument`` is not one core/locks.py names."""
    if _PARAMETER.match(argument) or _EXPORT.match(argument):
        return False
    if match := _NUMBER.match(argument):
        return int(match.group(1)) not in locks.CLASSES.values()
    if match := _NAMED_TEXT.match(argument):
        return match.group(1) not in locks.TEXTS
    if match := _TEXT.match(argument):
        return match.group(1) not in locks.TEXTS.values()
    return True


def test_the_check_tells_a_named_class_from_another():
    assert not unnamed("1885826370, hashtext(payload))")
    assert not unnamed("%(lock_class)s, 0)")
    assert not unnamed("hashtext('pgmsg.outbox:'), hashtext(x))")
    assert unnamed("1885826399, 0)")
    assert unnamed("hashtext('pgmsg.other'), 0)")
    assert unnamed("hashtext(%(inbox)s), hashtext(a))")


def test_every_advisory_lock_in_the_package_takes_a_named_class():
    sources = [
        p
        for p in sorted(PACKAGE.rglob("*"))
        if p.suffix in (".py", ".sql")
        and "migrations" not in p.relative_to(PACKAGE).parts
        and p != PACKAGE / "core" / "locks.py"
    ]
    found = [
        f"{path.relative_to(PACKAGE)}: {argument!r}"
        for path in sources
        for argument in class_arguments(path.read_text())
        if unnamed(argument)
    ]
    assert not found, "advisory locks whose class core/locks.py does not name:\n" + "\n".join(found)
    assert len([a for p in sources for a in class_arguments(p.read_text())]) > 20


@pytest.mark.django_db
def test_every_advisory_lock_in_the_database_takes_a_named_class():
    # The functions and the trigger functions the migrations made (their text is frozen).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT proname, prosrc FROM pg_proc "
            "WHERE proname LIKE 'pgmsg\\_%%' OR proname LIKE 'pgtrigger\\_pgmsg\\_%%'"
        )
        functions = cursor.fetchall()
    calls = [(name, argument) for name, text in functions for argument in class_arguments(text)]
    assert len(calls) > 10
    found = [f"{name}: {argument!r}" for name, argument in calls if unnamed(argument)]
    assert not found, "advisory locks whose class core/locks.py does not name:\n" + "\n".join(found)


def test_the_fixed_classes_are_apart_and_spell_pgm():
    values = list(locks.CLASSES.values())
    assert len(set(values)) == len(values)
    for value in values:
        assert value.to_bytes(4, "big")[:3] == b"pgm"


@pytest.mark.django_db
def test_no_class_of_a_text_is_a_fixed_class():
    texts = list(locks.TEXTS.values())
    assert len(set(texts)) == len(texts)
    with connection.cursor() as cursor:
        cursor.execute("SELECT hashtext(t) FROM unnest(%s::text[]) AS t", [texts])
        hashed = [row[0] for row in cursor.fetchall()]
    assert len(set(hashed)) == len(hashed)
    assert not set(hashed) & set(locks.CLASSES.values())


def valid_name(name: str) -> bool:
    try:
        names.validate_name(name, kind="inbox")
    except errors.InvalidName:
        return False
    return True


def test_a_class_made_of_a_name_meets_no_other():
    # INBOX and OUTBOX are followed by an inbox's or an outbox's name: no name may make the
    # text of another class (names have no ':'; each of these texts ends with one).
    spaces = [locks.INBOX, locks.OUTBOX]
    fixed = [text for text in locks.TEXTS.values() if text not in spaces]
    assert not [
        (space, text)
        for space in spaces
        for text in fixed + [s + "name" for s in spaces if s != space]
        if text.startswith(space) and valid_name(text[len(space) :])
    ]

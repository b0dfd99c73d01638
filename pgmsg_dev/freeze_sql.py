"""Freeze the current text of SQL functions into a new migration (pgmsg/migrations/README.md).

    python -m pgmsg_dev.freeze_sql 0031_receive_faster pgmsg_receive [pgmsg_send ...]

writes pgmsg/migrations/sql/0031_receive_faster.sql, a copy of each named function's block of
pgmsg/*/functions.sql, and, unless it exists, pgmsg/migrations/0031_receive_faster.py, which
applies that copy after the highest-numbered migration. The copy never changes afterwards: the
current text lives on in functions.sql, and pgmsg_tests/core/test_schema_sql.py checks that a
migrated database holds it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "pgmsg"
MIGRATIONS = PACKAGE / "migrations"
_FUNCTION = re.compile(r"^-- function: (\w+)\s*$", re.MULTILINE)

MIGRATION = """# {name}: the SQL functions {functions}, as pgmsg/*/functions.sql has them (frozen in
# sql/{name}.sql by pgmsg_dev.freeze_sql). Say here why they changed.

from pathlib import Path

from django.db import migrations

SQL = (Path(__file__).parent / "sql" / "{name}.sql").read_text()


class Migration(migrations.Migration):
    dependencies = [
        ("pgmsg", "{previous}"),
    ]

    operations = [
        migrations.RunSQL(SQL),
    ]
"""


def function_files() -> list[Path]:
    """Every file that holds the current text of SQL functions, one per capability."""
    return sorted(PACKAGE.rglob("functions.sql"))


def current_functions() -> dict[str, tuple[Path, str]]:
    """{name: (file, statement)}: each ``-- function: <name>`` block of the function files, the
    CREATE OR REPLACE statement that follows its marker (with the comments before it)."""
    found: dict[str, tuple[Path, str]] = {}
    for path in function_files():
        parts = _FUNCTION.split(path.read_text())
        for name, text in zip(parts[1::2], parts[2::2]):
            if name in found:
                raise ValueError(f"{name} is in {found[name][0]} and in {path}")
            found[name] = (path, text.strip() + "\n")
    return found


def freeze(name: str, functions: list[str]) -> list[Path]:
    """Write the frozen copy of ``functions`` for migration ``name`` (and the migration, if it
    is not there yet); the paths written."""
    current = current_functions()
    unknown = sorted(set(functions) - set(current))
    if unknown:
        raise SystemExit(f"no such function in pgmsg/*/functions.sql: {', '.join(unknown)}")
    copy = MIGRATIONS / "sql" / f"{name}.sql"
    if copy.exists():
        raise SystemExit(f"{copy} exists: a frozen copy is never rewritten")
    copy.write_text(
        f"-- The SQL of migration {name}, frozen: never edit it.\n"
        + "".join(f"\n-- function: {f}\n{current[f][1]}" for f in functions)
    )
    written = [copy]
    migration = MIGRATIONS / f"{name}.py"
    if not migration.exists():
        previous = max(p.stem for p in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))
        migration.write_text(
            MIGRATION.format(name=name, functions=", ".join(functions), previous=previous)
        )
        written.append(migration)
    return written


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not re.fullmatch(r"\d{4}_\w+", argv[0]):
        raise SystemExit(__doc__)
    for path in freeze(argv[0], argv[1:]):
        print(path.relative_to(PACKAGE.parent))


if __name__ == "__main__":
    main(sys.argv[1:])

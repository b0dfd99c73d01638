"""Write the compatibility matrix's last results (nox's junit files) into docs/compatibility.md.

Usage: python .ci/matrix_table.py .nox/results [more result folders]  (the `table` session of
noxfile.py runs it). A cell found in several folders is shown from its newest run.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "compatibility.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
SERVERS = {"embedded": "embedded 18 (.pgdata/)", "pg15": "15 at 127.0.0.1:5432"}


def rows(folders: list[Path]) -> list[str]:
    newest: dict[str, Path] = {}
    for folder in folders:
        for xml in folder.glob("*.xml"):
            if xml.stem not in newest or xml.stat().st_mtime > newest[xml.stem].stat().st_mtime:
                newest[xml.stem] = xml
    out = []
    for _, xml in sorted(newest.items()):
        match = re.fullmatch(r"py(\d)(\d+)_dj(\d)(\d)_(\w+)", xml.stem)
        if not match:
            continue
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        tests, failures, errors, skipped = (
            int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")
        )
        passed = tests - failures - errors - skipped
        versions = xml.with_suffix(".versions")
        python, django = (
            versions.read_text().split()
            if versions.exists()
            else (f"{match[1]}.{match[2]}", f"{match[3]}.{match[4]}")
        )
        verdict = "pass" if not failures and not errors else "**FAIL**"
        when = dt.datetime.fromtimestamp(xml.stat().st_mtime, dt.UTC).strftime("%Y-%m-%d %H:%M")
        out.append(
            f"| {python} | {django} | {SERVERS.get(match[5], match[5])} | {verdict} | "
            f"{passed} | {failures + errors} | {skipped} | {float(suite.get('time', 0)):.0f} s "
            f"| {when} |"
        )
    return out


def main() -> None:
    found = rows([Path(arg) for arg in sys.argv[1:]])
    if not found:
        sys.exit(f"no results in {sys.argv[1:]}: run the matrix first (nox)")
    table = "\n".join(
        [
            BEGIN,
            "| Python | Django | PostgreSQL | result | passed | failed | skipped | time "
            "| finished (UTC) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *found,
            END,
        ]
    )
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    DOC.write_text(text[:start] + table + text[end:])
    print(table)


if __name__ == "__main__":
    main()

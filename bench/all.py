"""`make bench`: run every bench script, then print one summary table and write it to
docs/benchmarks.md (between its "make bench" markers) with the date, machine and server.

    python bench/all.py [--only wakeups,drain] [--no-write]

Each script prints its own full output as it runs; the summary keeps the headline lines:
pgmsg's figure, the raw-PostgreSQL ceiling measured in the same run, and the ratio (for rates
pgmsg / raw, for latencies raw / pgmsg: 1.0 means as fast as raw).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: (name, arguments) in the order they run.
SCRIPTS = [
    ("wakeups", ["--seconds", "3", "--reps", "3"]),
    ("drain", ["--n", "50000", "--reps", "3"]),
    ("drain", ["--growth-only", "--reps", "1", "--big", "1000000", "--small", "10000"]),
    # The one-process drain while as many spinning processes as cores keep the machine busy.
    ("drain", ["--busy-only", "--busy", str(os.cpu_count() or 2), "--n", "50000", "--reps", "5"]),
    ("notifications", []),
    ("events", []),
    ("inbox", []),
    ("inbox", ["--growth-only", "--big", "1000000", "--small", "10000"]),
    ("memory", ["--small", "100000", "--big", "1000000"]),
    ("metrics", ["--n", "50000", "--reps", "3"]),
]
BEGIN = "<!-- make bench: begin -->"
END = "<!-- make bench: end -->"


def server_line() -> str:
    from pgmsg_dev.devdb import database_url, default_database

    where = "DATABASE_URL's server" if os.environ.get("DATABASE_URL") else "embedded server"
    url = database_url(default_database(ROOT / ".pgdata"), name="postgres")
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        settings = ", ".join(
            f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"
            for name in ("fsync", "synchronous_commit", "autovacuum", "shared_buffers")
        )
    return f"PostgreSQL {version} ({where}; {settings})"


def table(lines: list[dict]) -> str:
    out = [
        "| work | pgmsg | raw PostgreSQL, same run | ratio |",
        "|---|---:|---:|---:|",
    ]
    for line in lines:
        ours, raw, unit = line["pgmsg"], line["raw"], line["unit"]
        fmt = {
            "ms": lambda v: f"{v:,.2f} ms",
            "MB": lambda v: f"{v:,.1f} MB",
        }.get(unit, lambda v: f"{v:,.0f} /s")
        ratio = ""
        if raw:
            # Latencies and memory: smaller is better, so raw / pgmsg (1.0 = as small).
            ratio = f"{(raw / ours if unit in ('ms', 'MB') else ours / raw):.2f}"
        out.append(f"| {line['work']} | {fmt(ours)} | {fmt(raw) if raw else ''} | {ratio} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated script names")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args()
    chosen = set(args.only.split(",")) if args.only else None
    server = server_line()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as collected:
        env = dict(os.environ, PGMSG_BENCH_SUMMARY=collected.name)
        for name, script_args in SCRIPTS:
            if chosen and name not in chosen:
                continue
            print(f"\n===== bench/{name}.py {' '.join(script_args)}", flush=True)
            done = subprocess.run(
                [sys.executable, str(ROOT / "bench" / f"{name}.py"), *script_args],
                cwd=ROOT,
                env=env,
            )
            if done.returncode:
                print(f"bench/{name}.py failed with exit code {done.returncode}", flush=True)
        lines = [json.loads(line) for line in collected.read().splitlines() if line]
    machine = f"{platform.node()}, {os.cpu_count()} cores, {platform.machine()}"
    heading = f"Run of {started} on {machine}; {server}."
    text = f"{heading}\n\n{table(lines)}\n"
    print(f"\n===== summary\n{text}")
    if not args.no_write:
        write(text)


def write(text: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    doc = path.read_text()
    block = f"{BEGIN}\n{text}{END}"
    if BEGIN in doc and END in doc:
        doc = doc[: doc.index(BEGIN)] + block + doc[doc.index(END) + len(END) :]
    else:
        doc = doc.rstrip() + "\n\n## Summary of `make bench`\n\n" + block + "\n"
    path.write_text(doc)
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

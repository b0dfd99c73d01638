#!/usr/bin/env bash
# pgmsg next to its peers, in one run, with the shared harness (../shared/bench-peers):
# the raw psycopg worker (the ceiling), pgmsg, pgqueuer, procrastinate and django-pgpubsub.
#   bash bench/peers/run.sh            # N=10000, 1 run each (about 15 minutes)
#   PEERS_QUICK=1 bash bench/peers/run.sh
# Needs the machine's PostgreSQL (unix socket /var/run/postgresql) and root, like the harness.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
SHARED="${PEERS_HARNESS:-$REPO/../shared/bench-peers}"
WORK="${PEERS_WORK:-/tmp/pgmsg-peers}"
VENV="${PEERS_VENV:-/tmp/peersvenv}"
[ -d "$SHARED" ] || { echo "harness not found at $SHARED (set PEERS_HARNESS)"; exit 2; }
rm -rf "$WORK" && cp -r "$SHARED" "$WORK" && chmod -R u+w "$WORK"
cp "$REPO/bench/peers/sys_pgmsg.py" "$WORK/"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "django>=5.2,<5.3" "psycopg[binary]" django-pgpubsub django-pgtrigger procrastinate pgqueuer
fi
# With the outbox extra: the bench settings declare the machine's brokers, which the system
# checks of `listen` require the clients of.
"$VENV/bin/pip" install -q -e "$REPO[outbox]"
su postgres -c "psql -Atc \"select 1 from pg_roles where rolname='root'\"" | grep -q 1 || su postgres -c "createuser -s root"
export PGMSG_REPO="$REPO" BENCH_RESULTS="$WORK/results/results.jsonl" BENCH_WORKDIR="$WORK/tmp"
mkdir -p "$WORK/results" "$WORK/tmp"; : > "$BENCH_RESULTS"
PY="$VENV/bin/python"
if [ "${PEERS_QUICK:-0}" = 1 ]; then N=1000; LAT="--lat-count 50"; else N=10000; LAT="--lat-count 300 --lat-gap-ms 20"; fi
C="--reps 1 $LAT --n $N"
cd "$WORK"
# --drain: also k workers on a prefilled backlog (the workers' own rate), pgmsg next to raw.
timeout 900 "$PY" sys_raw.py --limit 100 $C --no-latency --drain
timeout 900 "$PY" sys_pgmsg.py $C --drain
timeout 900 "$PY" sys_pgqueuer.py $C
timeout 900 "$PY" sys_procrastinate.py $C --no-enqueue
timeout 1500 "$PY" sys_pgpubsub.py $C --no-enqueue
"$PY" report.py "$BENCH_RESULTS" "$WORK/RESULTS.md"
echo "results: $WORK/RESULTS.md"

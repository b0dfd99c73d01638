"""pgmsg adapter for the peer harness (../shared/bench-peers): same method, same server, same run.

Producer: pgmsg.notify() per transaction, notify_many() per 1000; workers: `manage.py listen
bench.tick` with the documented default settings; acknowledged = the stored row deleted.
run.sh passes --drain: k workers also drain a prefilled backlog (enqueue_batch, then the
workers start), timed by the harness from the first claim to the empty table.
Copied next to the harness's common.py by bench/peers/run.sh.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.environ["PGMSG_REPO"]
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import common  # noqa: E402

DB = "peers_pgmsg"


class PgmsgAdapter(common.Adapter):
    def __init__(self):
        from importlib.metadata import version

        super().__init__(
            system="pgmsg",
            version=f"pgmsg {version('pgmsg')} "
            f"(django {version('django')}, psycopg {version('psycopg')})",
        )

    def setup(self):
        common.recreate_db(DB)
        os.environ["DATABASE_URL"] = f"postgresql:///{DB}?host={common.PGHOST}"
        # The settings' "logical" alias (the outbox's logical capture tests) is this database
        # itself: otherwise they start a private embedded server, a package this venv lacks.
        os.environ["PGMSG_LOGICAL_DATABASE_URL"] = os.environ["DATABASE_URL"]
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.db import connection, transaction

        import pgmsg
        from bench.benchapp.listeners import Tick

        self.pgmsg, self.Tick, self.connection, self.transaction = (
            pgmsg,
            Tick,
            connection,
            transaction,
        )

    def reset(self):
        with self.connection.cursor() as c:
            c.execute("TRUNCATE pgmsg_notification RESTART IDENTITY")

    def enqueue_single(self, seqs):
        for s in seqs:
            self.pgmsg.notify(self.Tick(seq=s))

    def enqueue_batch(self, seqs, batch=1000):
        seqs = list(seqs)
        for b in range(0, len(seqs), batch):
            with self.transaction.atomic():
                self.pgmsg.notify_many(self.Tick(seq=s) for s in seqs[b : b + batch])

    def enqueue_one(self, seq):
        self.pgmsg.notify(self.Tick(seq=seq))
        return time.time()

    def worker_cmds(self, k):
        argv = [common.PY, "-m", "django", "listen", "bench.tick", "-v", "0"]
        env = {
            "BENCH_CWD": REPO,
            "DATABASE_URL": os.environ["DATABASE_URL"],
            "PGMSG_LOGICAL_DATABASE_URL": os.environ["DATABASE_URL"],
            "DJANGO_SETTINGS_MODULE": "bench.settings",
        }
        return [(argv, env) for _ in range(k)]

    def pending(self):
        with self.connection.cursor() as c:
            c.execute("SELECT count(*) FROM pgmsg_notification")
            return c.fetchone()[0]

    def any_pending(self):
        with self.connection.cursor() as c:
            c.execute("SELECT EXISTS (SELECT 1 FROM pgmsg_notification)")
            return c.fetchone()[0]

    def close(self):
        self.connection.close()


if __name__ == "__main__":
    common.run_from_cli(PgmsgAdapter(), common.cli_args())

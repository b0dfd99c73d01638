"""Broker URLs as pgmsg's settings give them: pgmsg's own query options taken out, checked,
and the password hidden in messages. Shared by the outbox's destinations and the inbox's
bridges, which speak to the same brokers."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pgmsg.core import errors


def split_options(url: str, known: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Take pgmsg's own query options (``known``: name -> default) out of ``url``.

    Returns the URL without them (for the client library) and the options' values.
    """
    parts = urlsplit(url)
    rest, options = [], dict(known)
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in known:
            options[name] = value
        else:
            rest.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(rest))), options


def flag(
    value: str, *, option: str, url: str, error: type[Exception] = errors.ConfigurationError
) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise error(f"{redact(url)}: {option} must be 1 or 0, got {value!r}")


def seconds(
    value: str, *, option: str, url: str, error: type[Exception] = errors.ConfigurationError
) -> float:
    try:
        found = float(value)
    except ValueError:
        found = -1.0
    if not found > 0:
        raise error(f"{redact(url)}: {option} must be a positive number of seconds, got {value!r}")
    return found


def count(
    value: str, *, option: str, url: str, error: type[Exception] = errors.ConfigurationError
) -> int:
    if not value.isdigit() or int(value) < 1:
        raise error(f"{redact(url)}: {option} must be a positive int, got {value!r}")
    return int(value)


#: Query options whose values are secrets (the HTTP destination's signing secret).
SECRET_OPTIONS = ("secret",)


def redact(url: str) -> str:
    """The URL with its password and secret options hidden, for messages and logs."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret = any(name in SECRET_OPTIONS for name, _ in query)
    if not parts.password and not secret:
        return url
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    if secret:
        hidden = [(n, "***" if n in SECRET_OPTIONS else v) for n, v in query]
        parts = parts._replace(query=urlencode(hidden, safe="*"))
    return urlunsplit(parts)


def short(exc: BaseException) -> str:
    """One line naming the exception: what a log line or a dead letter carries."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else repr(exc)}"

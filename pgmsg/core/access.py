"""Who may read pgmsg's HTTP endpoints beyond their status: a logged-in user holding
``pgmsg.view_overview`` (the admin overview's permission), or a client that sends the PGMSG
``ENDPOINT_TOKEN`` as ``Authorization: Bearer <token>``. Anyone else learns the status only."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.crypto import constant_time_compare

from pgmsg.core import conf

#: The permission that opens names, counts and metrics to a logged-in user.
PERMISSION = "pgmsg.view_overview"
BEARER = "bearer "


def may_read(request: HttpRequest) -> bool:
    """Whether the request may see names, counts and metrics (not only a status)."""
    user = getattr(request, "user", None)  # absent without AuthenticationMiddleware
    if user is not None and user.is_authenticated and user.has_perm(PERMISSION):
        return True
    return _token_matches(request)


def _token_matches(request: HttpRequest) -> bool:
    token = conf.get().ENDPOINT_TOKEN
    header = request.headers.get("Authorization", "")
    if not token or header[: len(BEARER)].lower() != BEARER:
        return False
    # Constant time: a timing difference must not reveal how much of a guess was right.
    return constant_time_compare(header[len(BEARER) :].strip(), token)

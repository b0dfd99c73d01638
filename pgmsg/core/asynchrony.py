"""Async forms of pgmsg's sync functions and handlers, derived from them, never kept by hand.

Django's transactions are synchronous and belong to a thread's connection. Both directions go
through asgiref's thread-sensitive machinery, the one Django's async ORM uses, so that pgmsg's
statements and the ORM's land on the same connection (docs/async.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async

P = ParamSpec("P")
R = TypeVar("R")


def awaitable(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``func``'s async form, ``a<name>``: same signature, checks and errors.

    It runs ``func`` where Django's async ORM runs its queries (thread-sensitive
    ``sync_to_async``): on that thread's connection and in its transaction. From async code
    there is no open ``atomic`` block, so each call commits on its own before it returns.
    """
    run = sync_to_async(func, thread_sensitive=True)

    @functools.wraps(func)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return await run(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"a{func.__name__}"
    call.__doc__ = f"``await`` form of ``{func.__name__}()`` (docs/async.md).\n\n{func.__doc__}"
    return call


def in_worker_thread(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A handler as the worker calls it: a sync handler as it is; an ``async def`` one (or an
    object whose ``__call__`` is one) run to completion by asgiref's ``async_to_sync`` on each
    call.

    What the coroutine awaits through thread-sensitive ``sync_to_async`` (Django's async ORM,
    pgmsg's ``a...`` functions) runs back in the worker's thread, on its connection, inside the
    batch's transaction: the handler's writes and the acknowledgement commit together.
    """
    if not (iscoroutinefunction(handler) or iscoroutinefunction(type(handler).__call__)):
        return handler
    run = async_to_sync(handler)

    @functools.wraps(handler)
    def call(*args: Any, **kwargs: Any) -> Any:
        return run(*args, **kwargs)

    return call

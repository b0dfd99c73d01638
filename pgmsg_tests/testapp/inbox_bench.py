"""Inboxes for bench/inbox.py: handlers that do nothing, so the figures show pgmsg's own cost."""

import pgmsg

bench_unordered = pgmsg.Inbox("bench.unordered")
bench_ordered = pgmsg.Inbox("bench.ordered", ordered=True)


@bench_unordered.handler("tick")
@bench_ordered.handler("tick")
def bench_tick(message: pgmsg.InboxMessage) -> None:
    pass

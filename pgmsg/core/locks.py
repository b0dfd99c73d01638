"""Every advisory lock pgmsg takes, named once.

A database has one space of advisory locks, shared with the application. pgmsg takes two-key
locks, (class, key) (pg_locks: objsubid 2), and for exports one-key locks (objsubid 1), which
never conflict with two-key ones. A class is either one of the fixed numbers below ("pgm"
and a letter, in ASCII) or the hashtext of a text that starts with "pgmsg" and a separator
no capability's name may hold (core/names.py allows only [a-z0-9_.-]). The named statements
take these as parameters; the SQL functions (functions.sql) and the pgtrigger triggers of the
models hold them as literals, since a change there needs a migration:
pgmsg_tests/core/test_locks.py checks that every literal is one of these.
"""

from __future__ import annotations

#: Held shared by a producer from its wake check until its transaction ends (core/wake.py;
#: pgmsg_wake, pgmsg_send, pgmsg_append, pgmsg_receive and notify()'s prepared statement).
PRODUCING = 1885826370  # "pgmB"
#: One creator of a subscription's partition indexes and read functions at a time
#: (events/subscriptions.sql, lock_partition_indexes); key 0.
PARTITION_READS = 1885826371  # "pgmC"
#: One archive run at a time (export/archive.sql); key 0.
ARCHIVE = 1885826372  # "pgmD"
#: One worker at a time analyzes pgmsg_notification (channels/notifications.sql); key 0.
ANALYZE = 1885826373  # "pgmE"
#: Held shared by an idle worker per wake payload (core/wake.py, wake.sql); key hashtext(payload).
IDLE = 1885826377  # "pgmI"

#: The fixed classes by name, for the test that they stay apart.
CLASSES = {
    "PRODUCING": PRODUCING,
    "PARTITION_READS": PARTITION_READS,
    "ARCHIVE": ARCHIVE,
    "ANALYZE": ANALYZE,
    "IDLE": IDLE,
}

#: Classes that are hashtext(text) of these texts (a first receipt or publish takes no
#: advisory lock: the key tables pgmsg_inbox_key and pgmsg_outbox_key, migration 0033):
#: hashtext(OUTBOX || outbox name): an outbox's class; key hashtext(message key) orders a key's
#: messages (outbox/outbox.sql), key <partition> holds a relay partition (outbox.sql,
#: logical.sql).
OUTBOX = "pgmsg.outbox:"
#: hashtext(INBOX || inbox name): an ordered inbox's class; key hashtext(aggregate id) holds an
#: aggregate (inbox/inbox.sql, lock_aggregates).
INBOX = "pgmsg.inbox:"
#: hashtext(BRIDGE || bridge name), key 0: the one process that consumes a bridge's queue,
#: stream or session (inbox/bridges/bridges.sql), held for as long as its session lives.
BRIDGE = "pgmsg.bridge:"
#: A one-key lock hashtext(EXPORT_BATCH): one batch export at a time (export/watermarks.py); a
#: follow export takes hashtext of its checkpoint directory.
EXPORT_BATCH = "pgmsg_export:"
#: The texts by name, for the test that they stay apart.
TEXTS = {
    "OUTBOX": OUTBOX,
    "INBOX": INBOX,
    "BRIDGE": BRIDGE,
    "EXPORT_BATCH": EXPORT_BATCH,
}

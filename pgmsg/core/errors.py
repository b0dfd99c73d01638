"""Every exception pgmsg raises: one base class, each named for what went wrong."""

from __future__ import annotations


class PgmsgError(Exception):
    """Base class of pgmsg's errors."""


class NotMigrated(PgmsgError):
    """pgmsg's tables and functions are missing on the database: ``manage.py migrate`` never
    ran there (or not to the end). The message names the database."""


class NotRetryable(PgmsgError):
    """Raised while handling a message that no retry can mend (an undecodable payload, a type
    nobody handles): the worker dead-letters it (or stops its partition) at once."""


class ConfigurationError(PgmsgError):
    """Settings or declarations are wrong; the message says which and how to fix it."""


class InvalidName(PgmsgError, ValueError):
    """A channel, inbox, stream or subscription name that may not reach SQL."""


class ChannelAlreadyRegistered(ConfigurationError):
    """Two declarations claim the same channel name."""


class UnknownChannel(NotRetryable, LookupError):
    """A channel name that no declaration registered."""


class PayloadError(NotRetryable, ValueError):
    """A payload that cannot be encoded for, or decoded from, its channel's declared fields."""


class PayloadTooLarge(PayloadError):
    """A broadcast payload beyond PostgreSQL's NOTIFY limit (under 8000 bytes)."""


class InboxAlreadyDeclared(ConfigurationError):
    """Two declarations claim the same inbox name with different options."""


class UnknownInbox(PgmsgError, LookupError):
    """An inbox name that no declaration registered."""


class UnknownMessageType(NotRetryable, LookupError):
    """An inbox message whose type has no handler: it is dead-lettered at once, never retried."""


class InvalidMessage(PgmsgError, ValueError):
    """An inbox message that cannot be stored (empty id or type, payload not JSON, ...)."""


class InvalidStreamName(InvalidName):
    """A stream name that does not follow ``<category>-<id>``."""


class ConcurrencyError(PgmsgError):
    """An append's expected version did not match the stream; nothing was written."""

    def __init__(self, stream: str, expected: object, actual: int) -> None:
        self.stream, self.expected, self.actual = stream, expected, actual
        super().__init__(
            f"stream {stream!r} is at version {actual}, but the append expected {expected}; "
            "nothing was written: reload the stream and decide again"
        )


class InvalidCheckpoint(PgmsgError, ValueError):
    """A read_all() ``after`` that is not a checkpoint (None, START, or a pair of ints)."""


class DuplicateMessageId(PgmsgError, ValueError):
    """A message id stored already where a re-append cannot be idempotent."""


class UnknownEventType(NotRetryable, LookupError):
    """A stored event whose type name no Event class registers."""


class UnknownSubscription(PgmsgError, LookupError):
    """A subscription name that no declaration registered."""


class ExportError(PgmsgError):
    """A Parquet export that could not run or finish; the watermarks did not move."""


class ArchiveError(ExportError):
    """An archive run that stopped before dropping a partition; that partition is intact."""


class ArchiveRunning(ArchiveError):
    """Another archive run holds the cluster's archive lock; this one did nothing."""


class ArchivedEvents(PgmsgError, LookupError):
    """A read of stream events that were archived to Parquet and dropped from PostgreSQL; the
    message names the archive(s). Read them there, or load from a later snapshot."""


class JavaMissing(ExportError):
    """Spark needs Java 17+ and none was found; the message says what to install."""


class OutboxAlreadyDeclared(ConfigurationError):
    """Two declarations claim the same outbox name, or one message type, with different options."""


class UnknownOutbox(PgmsgError, LookupError):
    """An outbox name that no declaration registered."""


class InvalidOutboxMessage(PgmsgError, ValueError):
    """A message that cannot be written to the outbox (bad key, headers, topic or payload)."""


class UnknownDestination(ConfigurationError):
    """A destination name missing from PGMSG["OUTBOX_DESTINATIONS"], or a URL pgmsg can't use."""


class UnknownBridge(ConfigurationError):
    """A bridge name missing from PGMSG["INBOX_BRIDGES"], or a declaration pgmsg can't use."""


class BrokerUnavailable(PgmsgError):
    """The broker could not be reached or did not confirm in time: nothing is known about the
    message, so the relay keeps it, waits, reconnects and publishes it again (no attempt is
    counted). A callable destination raises it for the same meaning."""


class MessageRefused(PgmsgError):
    """The broker answered and refused the message (no route, no stream, too large): the relay
    retries it with backoff, then makes it a dead letter carrying this error."""


class LogicalDecodingUnavailable(ConfigurationError):
    """The logical-decoding relay needs ``wal_level = logical``; the message says what is set."""


class ReplicationSlotMissing(ConfigurationError):
    """publish() to a logical outbox whose replication slot does not exist yet: a message
    written now would never be decoded. Its relay creates the slot when it starts."""


class ReplicationSlotLost(ConfigurationError):
    """A logical outbox's replication slot was invalidated (``wal_status = 'lost'``, usually
    by ``max_slot_wal_keep_size``): the WAL it needed is gone, and with it the messages the relay
    had not published. The relay stops and publish() refuses until the slot is dropped
    (``manage.py pgmsg_outbox drop-slot``); the message says what may have been lost."""


class ReplicationSlotInUse(PgmsgError):
    """A slot cannot be dropped while a relay holds its outbox (or a session reads it)."""


class InvalidSignature(PgmsgError):
    """A webhook whose signature is missing, malformed, does not match the secret, or whose
    timestamp is outside the tolerance: the receiver answers 401 and stores nothing."""

"""The library's exceptions: one root, subclassed only for real distinctions.

Each error also inherits the built-in exception it resembles, so an existing
``except ValueError`` (or ``LookupError``, ``RuntimeError``) still catches it.
"""

from __future__ import annotations

import json
from typing import Any


class FlowdropError(Exception):
    """Root of every error flowdrop_local raises on purpose."""


class InvalidMessage(FlowdropError, ValueError):
    """An incoming message is malformed; nothing of its append was written.

    ``index`` is the message's place in the batch (0 for a single message) and
    ``field`` the offending field, dotted (``metadata.tool_calls[1].id``).
    """

    def __init__(self, index: int, field: str, problem: str) -> None:
        self.index = index
        self.field = field
        self.problem = problem
        super().__init__(f"message {index}: {field}: {problem}")


class MessageIdTaken(InvalidMessage):
    """A caller-supplied message id names a message of another buffer; nothing was written.

    Ids are keys across the whole store, so a retry may repeat an id only in the
    buffer it was first appended to (there the message is dropped as a duplicate).
    """


class InvalidPositionKey(FlowdropError, ValueError):
    """A fractional position key is malformed, or the bounds are out of order."""


class InvalidAddress(FlowdropError, ValueError):
    """A buffer address (scope, scope_id, key) is not three usable strings."""


class StoreClosed(FlowdropError, RuntimeError):
    """The store was closed, or was inherited across ``os.fork()``."""


class NotADatabase(FlowdropError, ValueError):
    """The file is not an SQLite database, or it is truncated or corrupt."""


class DatabaseNotFound(FlowdropError, FileNotFoundError):
    """The database file (opened with ``create=False``) or the folder for a new file is missing."""


class NotAFlowdropDatabase(FlowdropError, ValueError):
    """The file is an SQLite database written by something other than flowdrop_local."""


class SchemaTooNew(FlowdropError, RuntimeError):
    """The file was written by a newer flowdrop_local; upgrade the library to open it."""


class ReadOnlyStore(FlowdropError, PermissionError):
    """A write was asked of a store whose file or folder is read-only."""


class MessageNotFound(FlowdropError, LookupError):
    """No message with that id in this buffer."""


class InvalidContext(FlowdropError, ValueError):
    """An execution context or principal is malformed (not judged: malformed)."""


class InvalidValue(FlowdropError, ValueError):
    """A memory value cannot be stored as JSON; nothing was written."""


class InvalidSession(FlowdropError, ValueError):
    """A session id, workflow id, name, owner, viewer or metadata is malformed."""


class SessionStopped(FlowdropError, RuntimeError):
    """The session is stopped: it accepts no turn until it is resumed."""


class InvalidPayload(FlowdropError, ValueError):
    """A history breaks a rule of its format (a provider's, or tool pairing).

    ``format`` names the format (``openai-chat``, ``anthropic``, ...), ``index`` the
    first offending message or item (``None`` when the payload as a whole is
    wrong) and ``problem`` the rule it breaks.
    """

    def __init__(self, format: str, index: int | None, problem: str) -> None:
        self.format = format
        self.index = index
        self.problem = problem
        where = "payload" if index is None else f"message {index}"
        super().__init__(f"{format}: {where}: {problem}")


class InvalidImport(FlowdropError, ValueError):
    """An import file has a bad line (``line``, 1-based) or would overwrite; nothing was written."""

    def __init__(self, line: int | None, problem: str) -> None:
        self.line = line
        self.problem = problem
        super().__init__(f"line {line}: {problem}" if line is not None else problem)


class BackupTargetExists(FlowdropError, FileExistsError):
    """The backup target exists already; it is never overwritten."""


class InvalidArgument(FlowdropError, ValueError):
    """An argument other than a message is out of range (a limit, a window, a setting)."""


class UnsupportedOperation(FlowdropError, NotImplementedError):
    """The operation has no meaning on this backend (the message says what to use instead)."""


class BufferNotEmpty(FlowdropError, ValueError):
    """A fork's target buffer already holds messages; nothing was written."""


class SearchNotEnabled(FlowdropError, RuntimeError):
    """Search was asked of a store whose search index is not built (``enable_search``)."""


def shown(value: object, width: int = 80) -> str:
    """``repr(value)`` for an error message: shortened, and never an error itself.

    ``repr`` of an int past Python's conversion limit (about 4,300 digits) raises
    ``ValueError``, and a hostile argument's ``__repr__`` may raise anything: the
    message about a bad argument must not become a second, untyped error.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4096:
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    try:
        text = repr(value)
    except Exception:
        return f"<a {type(value).__name__}>"
    return text if len(text) <= width else f"{text[: width - 5]}...{text[-2:]}"


class ReplicaConflict(FlowdropError, ValueError):
    """Two stores carry one sync replica id but hold different histories: one is a copy
    made outside flowdrop_local (``syncing.new_replica`` on the copy fixes it)."""


class ReplicaRetired(ReplicaConflict):
    """One side of a sync is a replica the other retired (``syncing.forget_peer``):
    tombstones it never received may be compacted, so what it still holds could bring
    deleted messages back. Replace it with a fresh ``backup`` of a current store."""


class SyncRefused(FlowdropError, ValueError):
    """A row one side of a sync holds fails the checks an import makes (a malformed or
    over-long position, a healed mark on a message that is no placeholder, a message
    too large): a peer is untrusted input, so the sync refuses and neither side changes.
    ``store`` names the side, ``message_id`` the row."""

    def __init__(self, store: str, message_id: str, problem: str, *, kind: str = "message") -> None:
        self.store = store
        self.message_id = message_id  # or the key of the session, memory value, buffer
        super().__init__(
            f"{store} holds {kind} {message_id}, which {problem}; nothing was synced "
            "(neither side changed)"
        )


class SyncIdConflict(FlowdropError, ValueError):
    """A message id names different messages on the two sides of a sync (a caller-supplied
    id reused in another buffer, or for another role): ids are store-wide keys, so the
    sync refuses and neither side changes."""


class SymlinkRefused(FlowdropError, OSError):
    """The database path (or its ``-wal``, ``-shm`` or ``-journal``) is a symbolic link.

    A database holds every conversation and is created private: opened through a
    link, SQLite would write the file the link points to (or create it, with the
    umask's mode, not 0600), a file someone else may have chosen. Nothing is opened,
    created or removed.
    """


class LockTimeout(FlowdropError, TimeoutError):
    """A write waited ``lock_timeout`` seconds for a lock another writer held (SQLite's
    write lock, a PostgreSQL row or table lock); it gave up and wrote nothing.

    ``seconds`` is the timeout the store was opened with.
    """

    def __init__(self, message: str, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(message)


class ServerUnreachable(FlowdropError, ConnectionError):
    """No connection to the PostgreSQL server could be made (refused, unknown host, timed
    out, or turned away: a wrong password, a missing database). Nothing was opened; the
    message gives libpq's reason without any secret of the URL. Not to be confused with
    :class:`NotADatabase` or :class:`NotAFlowdropDatabase`: the server was never reached."""


class SharedSchemaRefused(NotAFlowdropDatabase):
    """The store's PostgreSQL schema (the first of the search path) lets roles other
    than the store's own create objects in it (``public`` on PostgreSQL 14 and older):
    an operator or function one of them makes there, even after the open, comes before
    pg_catalog's on the library's path and would run inside its statements, as this
    role. Nothing was created. The message names the schema, the roles and the fix
    (``REVOKE CREATE ON SCHEMA ...``, or a schema of the store's own); the opt-in
    ``shared_schema=True`` opens it anyway, with a warning."""


class CorruptRow(NotADatabase):
    """A stored row does not hold what the library writes (text that is not JSON, say):
    the file was changed outside the library. The message names the row; ``check()``
    lists every such row."""


class TooLarge(FlowdropError, ValueError):
    """A value is longer than the database takes (SQLite's ``SQLITE_LIMIT_LENGTH``, a
    PostgreSQL field's limit); nothing was written."""


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (``"\\ud800"``: an undecodable byte of a
    path or of ``argv``, as Python decodes it), which no database, file system call or
    UTF-8 encoder takes. The one test every text crossing into the library goes through."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def stored_json(text: object, what: str, *args: object) -> Any:
    """``json.loads`` of a JSON column read back from the database, or :class:`CorruptRow`
    naming the row (``what.format(*args)``, formatted only on failure: this runs per
    row read) when a damaged file holds something else there."""
    try:
        return json.loads(text)  # type: ignore[arg-type]
    except (ValueError, TypeError, RecursionError) as error:  # JSONDecodeError: a ValueError
        raise CorruptRow(
            f"the database is damaged: {what.format(*args)} does not hold valid JSON "
            f"({type(error).__name__}); run 'flowdrop-local check'"
        ) from None


class UnsafeFile(FlowdropError, PermissionError):
    """A file at the database path (or its ``-wal``, ``-shm`` or ``-journal``) may have
    been put there by another user, and the library will not write into it: an
    existing empty file that is not yours, mode-private (no group or other bits) and
    singly linked gets no schema; an existing database another user owns and group
    or others may write is not opened for writing. Nothing is opened or changed."""

"""The store: one SQLite file, one connection, and the transactions around it.

Connection policy: a ``Store`` owns one connection, shared by all threads of the
process and serialised by a re-entrant lock. One connection is what makes
``":memory:"`` a single database for every thread, and SQLite takes one writer
at a time anyway; the lock costs a read only the wait for a write in progress in
this process. Other processes get their own ``Store`` and queue on SQLite's
write lock (WAL mode: readers never wait for writers).

Every write goes through :meth:`Store._write`: ``BEGIN IMMEDIATE`` (the write
lock is taken before anything is read, so a read-then-write transaction can never
fail half way with "database is locked"), then one ``COMMIT``, or a ``ROLLBACK``
on any exception, ``KeyboardInterrupt`` included.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import sqlite_utils

from . import memory
from ._schema import prepare
from .access import (
    AccessHook,
    ExecutionContext,
    Principal,
    ScopeResolution,
    resolve_address,
    resolve_scope,
)
from .buffer import Buffer, check_address_part
from .check import Violation, check_database
from .errors import (
    BackupTargetExists,
    FlowdropError,
    InvalidArgument,
    NotADatabase,
    ReadOnlyStore,
    StoreClosed,
)
from .model import BufferRef
from .portability import (
    ImportReport,
    export_records,
    import_records,
    number_records,
    parse_lines,
)
from .refused import RefusedBuffer
from .sessions import Sessions

log = logging.getLogger("flowdrop_local")

Durability = Literal["normal", "full"]
_SYNCHRONOUS: dict[str, str] = {"normal": "NORMAL", "full": "FULL"}
_LIVE_STORES: weakref.WeakSet[Store] = weakref.WeakSet()

_LIST_BUFFERS = (
    "SELECT scope, scope_id, key, message_count FROM buffers "
    "WHERE message_count > 0 ORDER BY scope, scope_id, key"
)


def _writable(path: str) -> bool:
    """Whether this process may write the file and create its -wal/-shm beside it."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.access(path, os.W_OK) and os.access(folder, os.W_OK)


def _forget_connections_after_fork() -> None:
    for store in list(_LIVE_STORES):
        store._forked = True


os.register_at_fork(after_in_child=_forget_connections_after_fork)


class Store:
    """A flowdrop_local database file.

    Args:
        path: the file (created with its schema on first open), or ``":memory:"``.
        durability: ``"normal"`` (WAL, synchronous=NORMAL: a committed append
            survives any crash of the process) or ``"full"`` (synchronous=FULL:
            it also survives a power loss or an OS crash).
        lock_warning_after: seconds an append waits for another writer before a
            warning is logged; it then goes on waiting (MEM-12: never fatal).

    Raises:
        NotADatabase, NotAFlowdropDatabase, SchemaTooNew: the file is not one
            this library can open; it is left untouched.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "normal",
        lock_warning_after: float = 5.0,
        read_only: bool = False,
    ) -> None:
        if durability not in _SYNCHRONOUS:
            raise InvalidArgument(f"durability must be 'normal' or 'full', got {durability!r}")
        if not isinstance(lock_warning_after, int | float) or not lock_warning_after > 0:
            raise InvalidArgument(
                "lock_warning_after must be a positive number of seconds, "
                f"got {lock_warning_after!r}"
            )
        self.path = os.fspath(path)
        # A file (or folder) this process cannot write is opened read-only: reads
        # work, and every write raises ReadOnlyStore before touching the file.
        self.read_only = read_only or (
            self.path != ":memory:" and os.path.exists(self.path) and not _writable(self.path)
        )
        self.durability = durability
        self.lock_warning_after = lock_warning_after
        self._lock = threading.RLock()
        # What the append path knows of each buffer it wrote: buffer id ->
        # (message count, last position, may hold unanswered calls). Valid while
        # no other connection has committed (PRAGMA data_version, checked after
        # every BEGIN IMMEDIATE); any other write through this store drops it.
        self._tails: dict[int, tuple[int, str | None, bool]] = {}
        self._data_version = -1
        self._changes = -1  # conn.total_changes when the tails were last right
        self._forked = False
        self._closed = True
        conn = self._connect()
        try:
            prepare(conn, self.path)
            self._configure(conn)
        except sqlite3.OperationalError as error:
            conn.close()
            if "readonly" in str(error):
                raise ReadOnlyStore(
                    f"{self.path} is read-only and needs its schema created or upgraded"
                ) from None
            raise NotADatabase(f"cannot open {self.path}: {error}") from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._closed = False
        _LIVE_STORES.add(self)

    def _connect(self) -> sqlite3.Connection:
        def connect(target: str, uri: bool = False) -> sqlite3.Connection:
            return sqlite3.connect(
                target,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.lock_warning_after,
                uri=uri,
            )

        if not self.read_only:
            try:
                return connect(self.path)
            except sqlite3.Error as error:
                raise NotADatabase(f"cannot open {self.path}: {error}") from None
        if not os.path.exists(self.path):
            raise ReadOnlyStore(f"{self.path} does not exist; a read-only store cannot create it")
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.path))
        try:
            return connect(uri + "?mode=ro", uri=True)
        except sqlite3.OperationalError:
            # A WAL file in a read-only folder: no -shm can be made. Read it as a
            # snapshot that no one is writing.
            return connect(uri + "?immutable=1", uri=True)

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.durability]}")
        if self.path != ":memory:" and not self.read_only:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as error:
                # A read-only file keeps its journal mode; reads still work.
                log.debug("journal_mode=WAL not set on %s: %s", self.path, error)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the connection. Idempotent; the store is unusable afterwards."""
        with self._lock:
            if not self._closed:
                self._closed = True
                if not self._forked:
                    self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.durability
        return f"<Store {self.path!r} ({state})>"

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreClosed(f"the store {self.path!r} is closed")
        if self._forked:
            raise StoreClosed(
                "this Store was opened in the parent process before os.fork(); "
                "open a new Store in the child"
            )
        return self._conn

    # ------------------------------------------------------------- transactions

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE, then COMMIT, or ROLLBACK on any error."""
        with self._lock:
            conn = self._connection()
            self._begin_immediate(conn)
            self._tails.clear()
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as error:
                self._abort(conn)
                raise self._translated(error) from None

    def _translated(self, error: BaseException) -> BaseException:
        """The library's error for a damaged or read-only file; any other error as it is."""
        if type(error) is sqlite3.DatabaseError:  # not its Integrity/Operational subclasses
            return NotADatabase(f"{self.path} is corrupt: {error}")
        if isinstance(error, sqlite3.OperationalError) and "readonly" in str(error):
            return ReadOnlyStore(f"{self.path} is read-only: {error}")
        return error

    def _abort(self, conn: sqlite3.Connection) -> None:
        """Roll back the open transaction (if SQLite has not already) and forget the tails."""
        self._tails.clear()
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """Take the write lock, waiting as long as it takes (MEM-12).

        Then drop the cached tails if another connection committed meanwhile.
        """
        if self.read_only:
            raise ReadOnlyStore(f"{self.path} is open read-only")
        started = time.monotonic()
        warned = False
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                message = str(error)
                if "readonly" in message or "read-only" in message:
                    raise ReadOnlyStore(f"{self.path} is read-only: {message}") from None
                if "locked" not in message and "busy" not in message:
                    raise FlowdropError(f"cannot start a write on {self.path}: {message}") from None
                if not warned:
                    warned = True
                    log.warning(
                        "flowdrop_local: waited %.1f s for the write lock on %s; still waiting",
                        time.monotonic() - started,
                        self.path,
                    )
                continue
            try:
                # Another connection committed, or this one wrote outside the append
                # path (store.db): what the tails cache says may be stale.
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if version != self._data_version or conn.total_changes != self._changes:
                    self._tails.clear()
                    self._data_version = version
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except sqlite3.DatabaseError as error:
                raise self._translated(error) from None

    # ------------------------------------------------------------- maintenance

    def check(self) -> list[Violation]:
        """Every broken invariant in the file (empty when sound); see :mod:`.check`."""
        with self._read() as conn:
            conn.execute("BEGIN")  # one snapshot for the whole check
            try:
                return check_database(conn)
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    def vacuum(self) -> None:
        """Checkpoint the WAL into the file, truncate it, and compact the file."""
        if self.read_only:
            raise ReadOnlyStore(f"{self.path} is open read-only")
        with self._lock:
            conn = self._connection()
            self._tails.clear()
            try:
                conn.execute("VACUUM")  # in WAL mode the compacted pages go to the WAL ...
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # ... then into the file
            except sqlite3.DatabaseError as error:
                raise self._translated(error) from None

    def backup(self, path: str | os.PathLike[str]) -> None:
        """Write a consistent copy of the database to ``path`` while writers go on.

        Uses SQLite's online backup API in one step, so the copy is one snapshot.

        Raises:
            FileExistsError (a FlowdropError): ``path`` exists; it is not overwritten.
        """
        target_path = os.fspath(path)
        if os.path.exists(target_path):
            raise BackupTargetExists(f"{target_path} exists; not overwriting it")
        try:
            target = sqlite3.connect(target_path)
            try:
                with self._lock:
                    self._connection().backup(target)
            finally:
                target.close()
        except sqlite3.DatabaseError as error:
            raise FlowdropError(f"cannot back up to {target_path}: {error}") from None

    def export(self, address: tuple[str, str, str] | None = None) -> Iterator[dict[str, Any]]:
        """Export records (see :mod:`.portability`) of every buffer, or of one."""
        return export_records(self, address)

    def import_records(
        self, records: Iterable[Mapping[str, Any]], *, replace: bool = False
    ) -> ImportReport:
        """Import export records in one transaction, healing as appends would.

        Raises:
            InvalidImport: a bad record (numbered from 1), or a buffer that already
                holds messages while ``replace`` is false. Nothing is written.
        """
        return import_records(self, number_records(records), replace=replace)

    def import_jsonl(self, lines: Iterable[str], *, replace: bool = False) -> ImportReport:
        """Import a JSON Lines export (``flowdrop-local import``); errors name the line."""
        return import_records(self, parse_lines(lines), replace=replace)

    # --------------------------------------------------------------- buffers

    def buffer(self, scope: str, scope_id: str, key: str, *, window: int | None = None) -> Buffer:
        """The buffer addressed by ``(scope, scope_id, key)``; nothing is written until an append.

        ``window``: keep only the last ``window`` messages (see :class:`Buffer`).

        A ``user`` or ``session`` address whose id is not a usable identity (``"0"``,
        ``""``, ``None``, ...) gives a refused buffer (MEM-6, MEM-13; see
        :meth:`buffer_for`), decided by the same function as a context's scope.

        Raises:
            InvalidAddress: an address part is not a string, or scope or key is blank.
        """
        self._connection()
        check_address_part("key", key, allow_empty=False)  # bad input is an error, not a refusal
        return self._buffer_of(resolve_address(scope, scope_id), scope, key, window)

    def _buffer_of(
        self, resolution: ScopeResolution, scope: str, key: str, window: int | None
    ) -> Buffer:
        if resolution.refused:
            return RefusedBuffer(scope, key, window=window)
        return Buffer(self, scope, resolution.scope_id, key, window=window)

    def buffers(self) -> list[BufferRef]:
        """The buffers that hold messages, ordered by address."""
        with self._read() as conn:
            return [BufferRef(*row) for row in conn.execute(_LIST_BUFFERS)]

    @property
    def db(self) -> sqlite_utils.Database:
        """A sqlite-utils view of the same connection, for ad-hoc table work.

        Writes through it bypass the buffer rules (the schema's triggers still
        apply); the store notices them (``total_changes``) and re-reads what it
        cached of a buffer before the next append.
        """
        self._tails.clear()
        return sqlite_utils.Database(self._connection())

    # ------------------------------------------- identity scopes and sessions (issue 5)
    # Scope refusal and session access are decided in access.py; the methods here
    # only route to the consumers (memory.py, sessions.py, RefusedBuffer).

    def buffer_for(
        self,
        context: ExecutionContext | None,
        scope: str,
        key: str,
        *,
        window: int | None = None,
    ) -> Buffer:
        """The buffer of ``key`` in ``scope`` as ``context`` resolves it (MEM-6, MEM-13).

        Scopes: ``global``, ``workflow``, ``pipeline``, ``execution``, ``session``,
        ``user``. When ``user`` or ``session`` refuses, the result is a
        :class:`RefusedBuffer` (``refused`` is True): it reads as empty and an append
        drops the turn with ``count=0, appended=0``, without any SQL (MEM-7, MEM-14).
        One warning is logged per refusal.

        Raises:
            InvalidAddress: an unknown scope, or a blank key.
        """
        self._connection()
        check_address_part("key", key, allow_empty=False)  # bad input is an error, not a refusal
        return self._buffer_of(resolve_scope(context, scope), scope, key, window)

    def memory_get(
        self, context: ExecutionContext | None, scope: str, key: str, default: object = None
    ) -> memory.MemoryRead:
        """Read ``key`` in ``scope``: ``{value, found, scope, resolved_scope_id}`` (MEM-7).

        A refused scope returns ``default`` with ``found=False`` and
        ``resolved_scope_id=""``, without reading anything.

        Raises:
            InvalidAddress: an unknown scope, or a blank key.
        """
        self._connection()
        return memory.get(self, context, scope, key, default)

    def memory_set(
        self, context: ExecutionContext | None, scope: str, key: str, value: object
    ) -> memory.MemoryWrite:
        """Store the JSON ``value`` under ``key`` in ``scope``; ``ok`` is False if it refused.

        Raises:
            InvalidAddress: an unknown scope, or a blank key.
            InvalidValue: ``value`` is not JSON; nothing was written.
        """
        self._connection()
        return memory.set_(self, context, scope, key, value)

    def memory_delete(
        self, context: ExecutionContext | None, scope: str, key: str
    ) -> memory.MemoryWrite:
        """Delete ``key`` in ``scope``; ``ok`` is False if it refused, ``existed`` if removed.

        Raises:
            InvalidAddress: an unknown scope, or a blank key.
        """
        self._connection()
        return memory.delete(self, context, scope, key)

    def sessions(self, principal: Principal) -> Sessions:
        """The sessions API acting as ``principal`` (MEM-8, MEM-9, MEM-15).

        Raises:
            InvalidContext: ``principal`` is not a :class:`Principal`.
        """
        self._connection()
        return Sessions(self, principal)

    @functools.cached_property
    def _access_hook_list(self) -> list[AccessHook]:
        return []

    @property
    def access_hooks(self) -> tuple[AccessHook, ...]:
        """The registered extension hooks, in the order they are asked."""
        with self._lock:
            return tuple(self._access_hook_list)

    def add_access_hook(self, hook: AccessHook) -> None:
        """Register an extension hook for session access decisions.

        A hook receives an :class:`~flowdrop_local.access.AccessRequest` only after
        the rules allowed it, and can only deny (return ``False``, or raise): it
        cannot grant what the rules denied (MEM-15). Hooks run inside the decision's
        transaction, so they must not write through this store.
        """
        if not callable(hook):
            raise InvalidArgument(f"an access hook must be callable, not {type(hook).__name__}")
        with self._lock:
            self._access_hook_list.append(hook)

    def remove_access_hook(self, hook: AccessHook) -> None:
        """Unregister a hook added with :meth:`add_access_hook` (no error if absent)."""
        with self._lock:
            if hook in self._access_hook_list:
                self._access_hook_list.remove(hook)

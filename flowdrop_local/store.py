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

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import sqlite_utils

from ._schema import prepare
from .buffer import Buffer
from .errors import FlowdropError, NotADatabase, ReadOnlyStore, StoreClosed
from .model import BufferRef

log = logging.getLogger("flowdrop_local")

Durability = Literal["normal", "full"]
_SYNCHRONOUS: dict[str, str] = {"normal": "NORMAL", "full": "FULL"}
_LIVE_STORES: weakref.WeakSet[Store] = weakref.WeakSet()

_LIST_BUFFERS = (
    "SELECT scope, scope_id, key, message_count FROM buffers "
    "WHERE message_count > 0 ORDER BY scope, scope_id, key"
)


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
    ) -> None:
        if durability not in _SYNCHRONOUS:
            raise ValueError(f"durability must be 'normal' or 'full', got {durability!r}")
        self.path = os.fspath(path)
        self.durability = durability
        self.lock_warning_after = lock_warning_after
        self._lock = threading.RLock()
        self._forked = False
        self._closed = True
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=lock_warning_after,
            )
        except sqlite3.Error as error:
            raise NotADatabase(f"cannot open {self.path}: {error}") from None
        try:
            prepare(conn, self.path)
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._closed = False
        _LIVE_STORES.add(self)

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.durability]}")
        if self.path != ":memory:":
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
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """Take the write lock, waiting as long as it takes (MEM-12)."""
        started = time.monotonic()
        warned = False
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
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

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._connection()

    # --------------------------------------------------------------- buffers

    def buffer(self, scope: str, scope_id: str, key: str, *, window: int | None = None) -> Buffer:
        """The buffer addressed by ``(scope, scope_id, key)``; nothing is written until an append.

        ``window``: keep only the last ``window`` messages (see :class:`Buffer`).

        Raises:
            InvalidAddress: an address part is not a string, or scope or key is blank.
        """
        self._connection()
        return Buffer(self, scope, scope_id, key, window=window)

    def buffers(self) -> list[BufferRef]:
        """The buffers that hold messages, ordered by address."""
        with self._read() as conn:
            return [BufferRef(*row) for row in conn.execute(_LIST_BUFFERS)]

    @property
    def db(self) -> sqlite_utils.Database:
        """A sqlite-utils view of the same connection, for ad-hoc table work.

        Writes through it bypass the buffer rules (the schema's triggers still apply).
        """
        return sqlite_utils.Database(self._connection())

"""The PostgreSQL backend: a connection pool, per-buffer locks and pipelined writes.

Connection policy: a pool (``psycopg_pool.ConnectionPool``), so one backend is
safe to share between threads; several processes and machines may open the same
database. Each transaction borrows one connection for its duration.

MEM-12 per buffer: an append locks its buffer's row (``SELECT ... FOR UPDATE``)
before it reads the buffer's state, so appends to one buffer serialise while
appends to different buffers run in parallel. Past ``lock_warning_after`` one
warning is logged and the append keeps waiting: an append that went ahead
unserialised would race its neighbour for the next position, and the unique key
would abort one of them, losing a turn. Deadlocks and serialisation failures are
retried inside the library (bounded, with backoff) when the whole transaction
can be run again (:meth:`PostgresBackend.transact`).

Round trips: statements whose result the engine does not need (``write`` and
``many`` steps) are queued and sent in one pipeline with the next read or with
the ``COMMIT``. A plain append is two round trips: lock + state, then insert +
count + commit. Healing k calls adds no round trip per call.

What the two backends share (the transaction, preparing the schema, the check,
the export) is :mod:`.postgresql_io`, generated from :mod:`.postgresql_io_async`;
what is here is the blocking face: the pool, ``transact`` and its retries.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

try:
    import psycopg
    import psycopg_pool
    from psycopg import errors as pg_errors
except ImportError as missing:  # pragma: no cover - depends on the install
    raise ImportError(
        "the PostgreSQL backend needs psycopg 3 and psycopg_pool: "
        "pip install 'flowdrop-local[postgresql]'"
    ) from missing

from ..check import Violation
from ..errors import StoreClosed, UnsupportedOperation
from .base import Backend, Durability, Tx
from .postgresql_dialect import (
    READ_SNAPSHOT,
    RETRIED_ERRORS,
    RETRIES,
    connect_error,
    opening_error,
    redact,
    refuse_sqlite_settings,
    translated,
    write_begin,
)
from .postgresql_io import PgTx, borrowed, check, exported_rows, prepare, rollback

T = TypeVar("T")
log = logging.getLogger("flowdrop_local")


class PostgresBackend(Backend):
    """A flowdrop_local PostgreSQL database; see the module docstring.

    Raises:
        NotADatabase: the server cannot be reached (the message has no password).
        NotAFlowdropDatabase, SchemaTooNew: the database holds tables that are not ours,
            or a newer schema.
    """

    kind = "postgresql"

    def __init__(
        self,
        target: str | psycopg_pool.ConnectionPool[Any],
        *,
        durability: Durability = "normal",
        lock_warning_after: float = 5.0,
        lock_timeout: float | None = None,
        read_only: bool = False,
        create: bool = True,
        shared_schema: bool = False,
    ) -> None:
        refuse_sqlite_settings(durability, read_only)
        self.durability = durability
        self.read_only = False
        self.shared_schema = shared_schema
        self.lock_warning_after = lock_warning_after
        self.lock_timeout = lock_timeout
        self._closed = True
        self._exporting: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        self.schema = ""  # the store's schema and the path every statement runs under,
        self.search_path = ""  # found by _prepare (postgresql_trust.py)
        if isinstance(target, str):
            self.where = redact(target)
            try:
                # One direct connection first: a server that is not there fails now,
                # with libpq's reason, instead of after the pool's retries.
                psycopg.connect(target, connect_timeout=10).close()
                self._pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
                    target, min_size=1, max_size=8, open=False, kwargs={"autocommit": True}
                )
                self._pool.open(wait=True, timeout=30)
            except (psycopg.Error, psycopg_pool.PoolTimeout) as error:
                raise connect_error(error, target) from None
            self._owns_pool = True
        else:
            self._pool = target
            self.where = "a psycopg pool"
            self._owns_pool = False
        try:
            self._prepare(create)
        except BaseException as error:
            if self._owns_pool:
                self._pool.close()
            raise opening_error(error, self.where) from None
        self._closed = False

    # ------------------------------------------------------------------ schema

    def _prepare(self, create: bool) -> None:
        with self._pool.connection() as conn:
            prepare(self, conn, create)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            # A checked-out connection outlives the pool's close: end the exports'
            # snapshots here (their next row raises StoreClosed).
            for conn in list(self._exporting):
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            if self._owns_pool:
                self._pool.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def ensure_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"the store {self.where!r} is closed")

    # ------------------------------------------------------------- transactions

    def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return borrowed(self._pool, self.where)

    def transact(self, work: Callable[[Tx], T], *, keep_tails: bool = False) -> T:
        """Run ``work`` in a write transaction, again after a deadlock or serialisation failure."""
        for attempt in range(RETRIES):
            try:
                with self.write(retrying=True) as tx:
                    return work(tx)
            except RETRIED_ERRORS as error:
                if attempt == RETRIES - 1:
                    raise self._translated(error) from None
                time.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise AssertionError("unreachable")

    @contextmanager
    def write(
        self, *, keep_tails: bool = False, retrying: bool = False, syncing: bool = False
    ) -> Iterator[Tx]:
        """See :meth:`Backend.write`; ``retrying``: let a deadlock or serialisation
        failure through as it is, for :meth:`transact` to run the work again;
        ``syncing``: a lock timeout too (a sync gives up a lock wait soon, and runs
        again: see syncing.SYNC_RETRIES)."""
        self.ensure_open()
        with self._connection() as conn:
            tx = PgTx(self, conn, "BEGIN")
            tx.queued = write_begin(self.lock_timeout)
            try:
                yield tx
                tx.commit()
            except BaseException as error:
                rollback(conn)
                if (retrying or syncing) and isinstance(error, RETRIED_ERRORS):
                    raise
                if syncing and isinstance(error, pg_errors.LockNotAvailable):
                    raise
                raise self._translated(error) from None

    @contextmanager
    def read(self, *, snapshot: bool = True) -> Iterator[Tx]:
        self.ensure_open()
        with self._connection() as conn:
            # One statement alone is consistent: then no BEGIN/ROLLBACK, one round trip.
            tx = PgTx(self, conn, READ_SNAPSHOT if snapshot else None)
            try:
                yield tx
            except psycopg.Error as error:
                raise self._translated(error) from None
            finally:
                rollback(conn)

    def _translated(self, error: BaseException) -> BaseException:
        return translated(error, self.where, self.lock_timeout)

    def snapshot_rows(self, reads: list[tuple[str, Any]]) -> Iterator[tuple[int, Any]]:
        """See :meth:`Backend.snapshot_rows`: a REPEATABLE READ transaction on a pooled
        connection of its own, each read through a server-side cursor in turn."""
        self.ensure_open()
        with self._connection() as conn:
            self._exporting.add(conn)  # close() ends it, with the snapshot it holds
            try:
                yield from exported_rows(self, conn, reads)
            finally:
                self._exporting.discard(conn)

    # ------------------------------------------------------------- maintenance

    def check(self) -> list[Violation]:
        self.ensure_open()
        with self._connection() as conn:
            return check(self, conn)

    def vacuum(self) -> None:
        raise UnsupportedOperation(
            "vacuum compacts a SQLite file; PostgreSQL runs autovacuum (or run VACUUM there)"
        )

    def backup(self, path: str) -> None:
        raise UnsupportedOperation(
            "backup copies a SQLite file; on PostgreSQL use pg_dump, or "
            f"'flowdrop-local copy {self.where} {path}' for a SQLite copy"
        )

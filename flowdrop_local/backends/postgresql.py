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
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from ..errors import (
    FlowdropError,
    StoreClosed,
    UnsupportedOperation,
)
from ..plans import BufferState
from .base import Backend, Durability, Tx
from .postgresql_dialect import (
    CHECK_BUFFERS_SQL,
    CHECK_LEDGER_SQL,
    CHECK_MESSAGES_SQL,
    CREATE_LOCK_SQL,
    LOCK_AT,
    META_SQL,
    NAMED_PARAMS,
    READ_SNAPSHOT,
    RETRIED_ERRORS,
    RETRIES,
    SCHEMA_VERSION,
    SQL,
    TABLES_SQL,
    after_begin,
    buffer_state,
    checked_buffer,
    connect_error,
    lock_statement,
    lock_waits,
    no_connection,
    opening_error,
    redact,
    redacted,
    refuse,
    refuse_shared,
    refuse_sqlite_settings,
    schema_findings,
    schema_scripts,
    stale_findings,
    state_statement,
    statement_params,
    translated,
    version_of,
    warn,
    warn_lock_wait,
    write_begin,
)
from .postgresql_trust import (
    CURRENT_SCHEMA_SQL,
    PIN_SQL,
    Verdict,
    pinned_path,
    refresh_statements,
    schema_of,
    verdict,
    verification_reads,
)

T = TypeVar("T")
log = logging.getLogger("flowdrop_local")


class _PgTx(Tx):
    """A transaction on one pooled connection; writes wait for the next round trip."""

    def __init__(
        self, backend: PostgresBackend, conn: psycopg.Connection[Any], begin: str | None
    ) -> None:
        self._backend = backend
        self.conn = conn
        self.cursor = conn.cursor()
        self.begin = begin or "BEGIN"
        # (sql, params, many); the BEGIN goes with the first statement, in its pipeline.
        self._queued: list[tuple[str, Any, bool]] = [] if begin is None else [(begin, None, False)]
        self.fresh = True  # nothing sent yet: a lock timeout may restart the transaction
        self._pinned = False

    def _take(self) -> list[tuple[str, Any, bool]]:
        """The queued statements, the search path's pin first after the ``BEGIN`` statements
        the first time (postgresql_trust.py: it goes in the same pipeline, no round trip)."""
        queued, self._queued = self._queued, []
        if not self._pinned:
            self._pinned = True
            queued.insert(after_begin(queued), (PIN_SQL, (self._backend.search_path,), False))
        return queued

    # Writes are queued; every read sends them first, in one pipeline.
    def _send(self, sql: str | None = None, params: Any = None) -> psycopg.Cursor[Any]:
        cursor = self.cursor
        queued = self._take()
        self.fresh = False
        if not queued:
            if sql is not None:
                cursor.execute(sql, params, prepare=True)
            return cursor
        with self.conn.pipeline():
            for text, values, many in queued:
                if many:
                    cursor.executemany(text, values)
                else:
                    cursor.execute(text, values, prepare=True)
            if sql is not None:
                cursor.execute(sql, params, prepare=True)
        return cursor

    def one(self, statement: str, params: Any = ()) -> Any:
        return self._send(SQL[statement], statement_params(statement, params)).fetchone()

    def all(self, statement: str, params: Any = ()) -> list[Any]:
        return self._send(SQL[statement], statement_params(statement, params)).fetchall()

    def run(self, statement: str, params: Any = ()) -> int:
        return self._send(SQL[statement], statement_params(statement, params)).rowcount

    def write(self, statement: str, params: Any = ()) -> None:
        self._queued.append((SQL[statement], statement_params(statement, params), False))

    def many(self, statement: str, rows: Any) -> None:
        rows = (
            [statement_params(statement, row) for row in rows]
            if statement in NAMED_PARAMS
            else rows
        )
        self._queued.append((SQL[statement], rows, True))

    def open_buffer(self, scope: str, scope_id: str, key: str, known_id: int | None) -> BufferState:
        address = (scope, scope_id, key)
        lock, lock_params = lock_statement(known_id, address)
        locked, row = self._locked_state(lock, lock_params, known_id, address)
        while locked is None:
            # Not locked: the buffer is new (create it), or another transaction
            # committed it between the lock and the state statement: lock it now.
            if row is None:
                self.cursor.execute(SQL["create_buffer"], address)
            locked, row = self._locked_state(LOCK_AT, address, None, address)
        return buffer_state(row)

    def _locked_state(
        self, lock: str, lock_params: Any, known_id: int | None, address: tuple[str, str, str]
    ) -> tuple[Any, Any]:
        """Lock the buffer row, then read its state in a statement of its own.

        Both go in one pipeline; at READ COMMITTED the second statement takes its
        snapshot after the lock was granted, so it sees every append before ours.
        Returns (the locked row or None, the state or None): the state of a row the
        lock did not find (committed meanwhile) is not to be trusted.
        """
        state, state_params = state_statement(known_id, address)
        warn_after = self._backend.lock_warning_after
        first, after, again = lock_waits(warn_after, self._backend.lock_timeout)
        fresh = self.fresh
        self.fresh = False
        locking, cursor = self.conn.cursor(), self.cursor
        queued = self._take()
        try:
            with self.conn.pipeline():
                for text, values, many in queued:  # the BEGIN, the path
                    (cursor.executemany if many else cursor.execute)(text, values)
                if fresh:
                    cursor.execute(first)
                locking.execute(lock, lock_params, prepare=True)
                if fresh:  # the warning's timeout is for the row lock only
                    cursor.execute(after)
                cursor.execute(state, state_params, prepare=True)
        except pg_errors.LockNotAvailable:
            if not fresh or again is None:
                raise  # past the store's lock_timeout: write() makes it LockTimeout
            # Nothing else was done in this transaction: start it again and wait.
            _rollback(self.conn)
            warn_lock_wait(warn_after, address, self._backend.where)
            with self.conn.pipeline():
                cursor.execute(self.begin)
                cursor.execute(PIN_SQL, (self._backend.search_path,))
                cursor.execute(again)
                locking.execute(lock, lock_params)
                cursor.execute(after)
                cursor.execute(state, state_params)
        return locking.fetchone(), cursor.fetchone()

    def remember(self, state: BufferState) -> None:
        """PostgreSQL reads the state under the row lock each time: nothing to keep."""

    def script(self, sql: str) -> None:
        self._send()  # what is queued goes first
        self.conn.execute(sql.encode())

    def commit(self) -> None:
        """Send what is queued and the ``COMMIT`` in one pipeline: one round trip."""
        self._queued.append(("COMMIT", None, False))
        self._send()

    def raw(self, sql: str, params: Any = ()) -> list[Any]:
        """Rows of a statement that is not a named one (maintenance: ``check``)."""
        return self._send(sql, params).fetchall()

    def raw_many(self, statements: list[tuple[str, Any]]) -> list[list[Any]]:
        """The rows of each statement, all sent in one pipeline (the verification's)."""
        queued = self._take()
        cursors = [self.conn.cursor() for _ in statements]
        with self.conn.pipeline():
            for text, values, many in queued:
                (self.cursor.executemany if many else self.cursor.execute)(text, values)
            for cursor, (sql, params) in zip(cursors, statements, strict=True):
                cursor.execute(sql, params)
        return [cursor.fetchall() for cursor in cursors]


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
        """Find the store's schema, pin the path to it, verify what could run inside our
        statements (before any of them runs), then create, upgrade or refresh."""
        with self._pool.connection() as conn:
            conn.autocommit = True  # a pool handed in by the application may differ
            self.schema = schema_of(conn.execute(CURRENT_SCHEMA_SQL).fetchone()[0], self.where)
            self.search_path = pinned_path(self.schema)
            with conn.transaction():
                conn.execute(PIN_SQL, (self.search_path,))
                found = self._verdict(conn)
                refuse(found.refused, self.where)
                refuse_shared(found, self.where, accepted=self.shared_schema)
                if _schema_version(conn, self.where) == SCHEMA_VERSION and not found.stale:
                    refuse(schema_findings(found), self.where)
                    warn(found, self.where)
                    return
            with conn.transaction():
                conn.execute(PIN_SQL, (self.search_path,))
                # Create it, serialised against other processes doing the same.
                conn.execute(CREATE_LOCK_SQL)
                for script in schema_scripts(_schema_version(conn, self.where), create, self.where):
                    conn.execute(script)
                found = self._verdict(conn)
                if found.stale:  # a store made before our functions pinned their path
                    for statement in refresh_statements(self.schema, found.stale):
                        conn.execute(statement)
                    found = self._verdict(conn)
                # Before COMMIT: a refused upgrade leaves the database as it was.
                refuse(schema_findings(found), self.where)
            warn(found, self.where)

    def _verdict(self, conn: psycopg.Connection[Any]) -> Verdict:
        """The verification (postgresql_trust.py), in one round trip."""
        rows = _PgTx(self, conn, None).raw_many(verification_reads(self.schema))
        return verdict(self.schema, rows)

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

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection from the pool, for one transaction; a pool that has none is typed."""
        try:
            conn = self._pool.getconn()
        except (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as error:
            raise no_connection(self.where, error) from None
        try:
            yield conn
        finally:
            self._pool.putconn(conn)

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
            tx = _PgTx(self, conn, "BEGIN")
            tx._queued = write_begin(self.lock_timeout)
            try:
                yield tx
                tx.commit()
            except BaseException as error:
                _rollback(conn)
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
            tx = _PgTx(self, conn, READ_SNAPSHOT if snapshot else None)
            try:
                yield tx
            except psycopg.Error as error:
                raise self._translated(error) from None
            finally:
                _rollback(conn)

    def _translated(self, error: BaseException) -> BaseException:
        return translated(error, self.where, self.lock_timeout)

    def snapshot_rows(self, reads: list[tuple[str, Any]]) -> Iterator[tuple[int, Any]]:
        """See :meth:`Backend.snapshot_rows`: a REPEATABLE READ transaction on a pooled
        connection of its own, each read through a server-side cursor in turn."""
        self.ensure_open()
        with self._connection() as conn:
            self._exporting.add(conn)  # close() ends it, with the snapshot it holds
            try:
                conn.execute(READ_SNAPSHOT)
                conn.execute(PIN_SQL, (self.search_path,))
                for i, (statement, params) in enumerate(reads):
                    with conn.cursor(name=f"flowdrop_export_{i}") as cursor:
                        cursor.itersize = 500
                        cursor.execute(SQL[statement], statement_params(statement, params))
                        for row in cursor:
                            self.ensure_open()  # a store closed meanwhile: StoreClosed
                            yield i, row
            except psycopg.Error as error:
                self.ensure_open()
                raise FlowdropError(f"cannot export {self.where}: {redacted(error)}") from None
            finally:
                self._exporting.discard(conn)
                _rollback(conn)

    # ------------------------------------------------------------- maintenance

    def check(self) -> list[Violation]:
        with self.read() as tx:
            assert isinstance(tx, _PgTx)
            found = verdict(self.schema, tx.raw_many(verification_reads(self.schema)))
            violations = [
                *schema_findings(found),
                *found.shared,
                *found.warned,
                *stale_findings(found),
            ]
            if found.refused:
                return violations  # reading on could run the foreign objects' SQL
            for buffer_id, scope, scope_id, key in tx.raw(CHECK_BUFFERS_SQL):
                messages = tx.raw(CHECK_MESSAGES_SQL, (buffer_id,))
                ledger = tx.raw(CHECK_LEDGER_SQL, (buffer_id,))
                violations += checked_buffer(f"{scope}/{scope_id}/{key}", messages, ledger)
            return violations

    def vacuum(self) -> None:
        raise UnsupportedOperation(
            "vacuum compacts a SQLite file; PostgreSQL runs autovacuum (or run VACUUM there)"
        )

    def backup(self, path: str) -> None:
        raise UnsupportedOperation(
            "backup copies a SQLite file; on PostgreSQL use pg_dump, or "
            f"'flowdrop-local copy {self.where} {path}' for a SQLite copy"
        )


def _rollback(conn: psycopg.Connection[Any]) -> None:
    """End a transaction the library began (connections are in autocommit mode)."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    with contextlib.suppress(psycopg.Error):  # a broken connection: the pool replaces it
        conn.execute("ROLLBACK")


def _schema_version(conn: psycopg.Connection[Any], where: str) -> int | None:
    """The schema version of the database, None when it has no tables of ours."""
    tables = {row[0] for row in conn.execute(TABLES_SQL)}
    meta = dict(conn.execute(META_SQL).fetchall()) if "flowdrop_meta" in tables else {}
    return version_of(tables, meta, where)

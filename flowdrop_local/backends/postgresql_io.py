"""PostgreSQL I/O, blocking: generated from postgresql_io_async.py, do not edit.

``python -m tests._async_to_sync`` writes this file again; read (and change) the
async source, whose docstring says what is here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

from ..check import Violation
from ..errors import FlowdropError
from ..plans import BufferState
from .base import Tx
from .postgresql_dialect import (
    CHECK_BUFFERS_SQL,
    CHECK_LEDGER_SQL,
    CHECK_MESSAGES_SQL,
    CREATE_LOCK_SQL,
    META_SQL,
    NUMBERED_PARAMS,
    READ_SNAPSHOT,
    SCHEMA_VERSION,
    SQL,
    TABLES_SQL,
    after_begin,
    buffer_state,
    checked_buffer,
    lock_statement,
    lock_waits,
    no_connection,
    redacted,
    refuse,
    refuse_shared,
    schema_findings,
    schema_scripts,
    stale_findings,
    state_statement,
    statement_params,
    translated,
    version_of,
    warn,
    warn_lock_wait,
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

EXPORT_CHUNK = 500


class Database(Protocol):
    """What the I/O needs of the backend it works for (either backend is one)."""

    where: str
    schema: str
    search_path: str
    lock_warning_after: float
    lock_timeout: float | None
    shared_schema: bool

    def ensure_open(self) -> None: ...


class PgTx(Tx):
    """A transaction on one pooled connection; writes wait for the next round trip."""

    def __init__(
        self, database: Database, conn: psycopg.Connection[Any], begin: str | None
    ) -> None:
        self.database = database
        self.conn = conn
        self.cursor = conn.cursor()
        self.begin = begin or "BEGIN"
        self.queued: list[tuple[str, Any, bool]] = [] if begin is None else [(begin, None, False)]
        self.fresh = True
        self._pinned = False

    def _take(self) -> list[tuple[str, Any, bool]]:
        """The queued statements, the search path's pin first after the ``BEGIN`` statements
        the first time (postgresql_trust.py: it goes in the same pipeline, no round trip)."""
        queued, self.queued = (self.queued, [])
        if not self._pinned:
            self._pinned = True
            queued.insert(after_begin(queued), (PIN_SQL, (self.database.search_path,), False))
        return queued

    def _send(self, sql: str | None = None, params: Any = None) -> psycopg.Cursor[Any]:
        """Send what is queued and then ``sql``, in one pipeline; the cursor holds its rows."""
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
        cursor = self._send(SQL[statement], statement_params(statement, params))
        return cursor.fetchone()

    def all(self, statement: str, params: Any = ()) -> list[Any]:
        cursor = self._send(SQL[statement], statement_params(statement, params))
        return cursor.fetchall()

    def run(self, statement: str, params: Any = ()) -> int:
        cursor = self._send(SQL[statement], statement_params(statement, params))
        return cursor.rowcount

    def write(self, statement: str, params: Any = ()) -> None:
        self.queued.append((SQL[statement], statement_params(statement, params), False))

    def many(self, statement: str, rows: Any) -> None:
        if statement in NUMBERED_PARAMS:
            rows = [statement_params(statement, row) for row in rows]
        self.queued.append((SQL[statement], rows, True))

    def open_buffer(self, scope: str, scope_id: str, key: str, known_id: int | None) -> BufferState:
        """Lock the buffer's row, creating the buffer first when it is new."""
        address = (scope, scope_id, key)
        lock, lock_params = lock_statement(known_id, address)
        locked, row = self._locked_state(lock, lock_params, known_id, address)
        while locked is None:
            if row is None:
                self.cursor.execute(SQL["create_buffer"], address)
            locked, row = self._locked_state(*lock_statement(None, address), None, address)
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
        warn_after = self.database.lock_warning_after
        first, after, again = lock_waits(warn_after, self.database.lock_timeout)
        fresh = self.fresh
        self.fresh = False
        locking, cursor = (self.conn.cursor(), self.cursor)
        queued = self._take()
        try:
            with self.conn.pipeline():
                for text, values, many in queued:
                    if many:
                        cursor.executemany(text, values)
                    else:
                        cursor.execute(text, values)
                if fresh:
                    cursor.execute(first)
                locking.execute(lock, lock_params, prepare=True)
                if fresh:
                    cursor.execute(after)
                cursor.execute(state, state_params, prepare=True)
        except pg_errors.LockNotAvailable:
            if not fresh or again is None:
                raise
            rollback(self.conn)
            warn_lock_wait(warn_after, address, self.database.where)
            with self.conn.pipeline():
                cursor.execute(self.begin)
                cursor.execute(PIN_SQL, (self.database.search_path,))
                cursor.execute(again)
                locking.execute(lock, lock_params)
                cursor.execute(after)
                cursor.execute(state, state_params)
        return (locking.fetchone(), cursor.fetchone())

    def remember(self, state: BufferState) -> None:
        """PostgreSQL reads the state under the row lock each time: nothing to keep."""

    def script(self, sql: str) -> None:
        self._send()
        self.conn.execute(sql.encode())

    def commit(self) -> None:
        """Send what is queued and the ``COMMIT`` in one pipeline: one round trip."""
        self.queued.append(("COMMIT", None, False))
        self._send()

    def raw(self, sql: str, params: Any = ()) -> list[Any]:
        """Rows of a statement that is not a named one (maintenance: ``check``)."""
        cursor = self._send(sql, params)
        return cursor.fetchall()

    def raw_many(self, statements: list[tuple[str, Any]]) -> list[list[Any]]:
        """The rows of each statement, all sent in one pipeline (the verification's)."""
        queued = self._take()
        cursors = [self.conn.cursor() for _ in statements]
        with self.conn.pipeline():
            for text, values, many in queued:
                if many:
                    self.cursor.executemany(text, values)
                else:
                    self.cursor.execute(text, values)
            for cursor, (sql, params) in zip(cursors, statements, strict=True):
                cursor.execute(sql, params)
        return [cursor.fetchall() for cursor in cursors]


def rollback(conn: psycopg.Connection[Any]) -> None:
    """End a transaction the library began (connections are in autocommit mode); a
    connection that cannot is closed, and the pool replaces it."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        with contextlib.suppress(psycopg.Error):
            conn.close()


@contextmanager
def borrowed(
    pool: psycopg_pool.ConnectionPool[Any], where: str
) -> Iterator[psycopg.Connection[Any]]:
    """A connection from the pool, for one transaction; a pool that has none is typed."""
    try:
        conn = pool.getconn()
    except (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as error:
        raise no_connection(where, error) from None
    try:
        yield conn
    finally:
        pool.putconn(conn)


def prepare(database: Database, conn: psycopg.Connection[Any], create: bool) -> None:
    """Find the store's schema (set on ``database``), pin the path to it, verify what
    could run inside our statements (before any of them runs), then create, upgrade
    or refresh."""
    conn.set_autocommit(True)
    current = conn.execute(CURRENT_SCHEMA_SQL).fetchone()
    database.schema = schema_of(None if current is None else current[0], database.where)
    database.search_path = pinned_path(database.schema)
    with conn.transaction():
        conn.execute(PIN_SQL, (database.search_path,))
        found = _verdict(database, conn)
        refuse(found.refused, database.where)
        refuse_shared(found, database.where, accepted=database.shared_schema)
        if _schema_version(conn, database.where) == SCHEMA_VERSION and (not found.stale):
            refuse(schema_findings(found), database.where)
            warn(found, database.where)
            return
    with conn.transaction():
        conn.execute(PIN_SQL, (database.search_path,))
        conn.execute(CREATE_LOCK_SQL)
        version = _schema_version(conn, database.where)
        for script in schema_scripts(version, create, database.where):
            conn.execute(script)
        found = _verdict(database, conn)
        if found.stale:
            for statement in refresh_statements(database.schema, found.stale):
                conn.execute(statement.encode())
            found = _verdict(database, conn)
        refuse(schema_findings(found), database.where)
    warn(found, database.where)


def _verdict(database: Database, conn: psycopg.Connection[Any]) -> Verdict:
    """The verification (postgresql_trust.py), in one round trip."""
    rows = PgTx(database, conn, None).raw_many(verification_reads(database.schema))
    return verdict(database.schema, rows)


def _schema_version(conn: psycopg.Connection[Any], where: str) -> int | None:
    """The schema version of the database, None when it has no tables of ours."""
    tables = {row[0] for row in conn.execute(TABLES_SQL).fetchall()}
    meta: dict[str, str] = {}
    if "flowdrop_meta" in tables:
        meta = dict(conn.execute(META_SQL).fetchall())
    return version_of(tables, meta, where)


def check(database: Database, conn: psycopg.Connection[Any]) -> list[Violation]:
    """Every broken invariant, read in one snapshot: the verification's findings, then
    each buffer's messages and ledger (unless the verification refused the schema)."""
    tx = PgTx(database, conn, READ_SNAPSHOT)
    try:
        found = verdict(database.schema, tx.raw_many(verification_reads(database.schema)))
        violations = [*schema_findings(found), *found.shared, *found.warned, *stale_findings(found)]
        if found.refused:
            return violations
        for buffer_id, scope, scope_id, key in tx.raw(CHECK_BUFFERS_SQL):
            messages = tx.raw(CHECK_MESSAGES_SQL, (buffer_id,))
            ledger = tx.raw(CHECK_LEDGER_SQL, (buffer_id,))
            violations += checked_buffer(f"{scope}/{scope_id}/{key}", messages, ledger)
        return violations
    except psycopg.Error as error:
        raise translated(error, database.where) from None
    finally:
        rollback(conn)


def exported_rows(
    database: Database, conn: psycopg.Connection[Any], reads: list[tuple[str, Any]]
) -> Iterator[tuple[int, Any]]:
    """``(i, row)`` for each read in turn, from one REPEATABLE READ snapshot on ``conn``,
    each through a server-side cursor that fetches ``EXPORT_CHUNK`` rows at a time."""
    try:
        conn.execute(READ_SNAPSHOT)
        conn.execute(PIN_SQL, (database.search_path,))
        for i, (statement, params) in enumerate(reads):
            with conn.cursor(name=f"flowdrop_export_{i}") as cursor:
                cursor.itersize = EXPORT_CHUNK
                cursor.execute(SQL[statement], statement_params(statement, params))
                for row in cursor:
                    database.ensure_open()
                    yield (i, row)
    except psycopg.Error as error:
        database.ensure_open()
        raise FlowdropError(f"cannot export {database.where}: {redacted(error)}") from None
    finally:
        rollback(conn)

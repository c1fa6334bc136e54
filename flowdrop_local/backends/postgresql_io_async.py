"""PostgreSQL I/O, written once: the transaction, preparing the schema, the check, the export.

This module is the source. Its blocking twin, :mod:`.postgresql_io`, is generated
from it by ``python -m tests._async_to_sync`` (``async`` and ``await`` dropped, the
``Async`` names made blocking: psycopg 3 keeps its two connection classes so), and
``tests/test_async_to_sync.py`` fails when the twin is not current. Edit this file,
never the twin. What the sync and async backends do differently (how a pool is
made, how a transaction is retried, the face they offer the handles) stays in
:mod:`.postgresql` and :mod:`.postgresql_async`; the statements and the judgement
of what is found are in :mod:`.postgresql_dialect` and :mod:`.postgresql_trust`.

* MEM-12 per buffer: :meth:`AsyncPgTx.open_buffer` locks the buffer's row
  (``FOR UPDATE``) before it reads the buffer's state; past
  ``lock_warning_after`` one warning is logged and the lock is waited for again.
* Writes whose result the plan does not need (``write``, ``many``) are queued
  and sent in one pipeline with the next read or with the ``COMMIT``: a plain
  append is two round trips, and healing k calls adds none.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

from ..check import Violation
from ..errors import FlowdropError
from ..plans import BufferState
from .base import AsyncTx
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

EXPORT_CHUNK = 500  # rows a server-side cursor fetches at a time


class Database(Protocol):
    """What the I/O needs of the backend it works for (either backend is one)."""

    where: str  # the database, for messages: a URL without its password
    schema: str  # the store's schema and the path every statement runs under,
    search_path: str  # found by prepare() (postgresql_trust.py)
    lock_warning_after: float
    lock_timeout: float | None
    shared_schema: bool  # prepare() accepts a schema other roles may create in

    def ensure_open(self) -> None: ...


class AsyncPgTx(AsyncTx):
    """A transaction on one pooled connection; writes wait for the next round trip."""

    def __init__(
        self, database: Database, conn: psycopg.AsyncConnection[Any], begin: str | None
    ) -> None:
        self.database = database
        self.conn = conn
        self.cursor = conn.cursor()
        self.begin = begin or "BEGIN"
        # (sql, params, many); the BEGIN goes with the first statement, in its pipeline.
        self.queued: list[tuple[str, Any, bool]] = [] if begin is None else [(begin, None, False)]
        self.fresh = True  # nothing sent yet: a lock timeout may restart the transaction
        self._pinned = False

    def _take(self) -> list[tuple[str, Any, bool]]:
        """The queued statements, the search path's pin first after the ``BEGIN`` statements
        the first time (postgresql_trust.py: it goes in the same pipeline, no round trip)."""
        queued, self.queued = self.queued, []
        if not self._pinned:
            self._pinned = True
            queued.insert(after_begin(queued), (PIN_SQL, (self.database.search_path,), False))
        return queued

    async def _send(self, sql: str | None = None, params: Any = None) -> psycopg.AsyncCursor[Any]:
        """Send what is queued and then ``sql``, in one pipeline; the cursor holds its rows."""
        cursor = self.cursor
        queued = self._take()
        self.fresh = False
        if not queued:
            if sql is not None:
                await cursor.execute(sql, params, prepare=True)
            return cursor
        async with self.conn.pipeline():
            for text, values, many in queued:
                if many:
                    await cursor.executemany(text, values)
                else:
                    await cursor.execute(text, values, prepare=True)
            if sql is not None:
                await cursor.execute(sql, params, prepare=True)
        return cursor

    async def one(self, statement: str, params: Any = ()) -> Any:
        cursor = await self._send(SQL[statement], statement_params(statement, params))
        return await cursor.fetchone()

    async def all(self, statement: str, params: Any = ()) -> list[Any]:
        cursor = await self._send(SQL[statement], statement_params(statement, params))
        return await cursor.fetchall()

    async def run(self, statement: str, params: Any = ()) -> int:
        cursor = await self._send(SQL[statement], statement_params(statement, params))
        return cursor.rowcount

    async def write(self, statement: str, params: Any = ()) -> None:
        self.queued.append((SQL[statement], statement_params(statement, params), False))

    async def many(self, statement: str, rows: Any) -> None:
        if statement in NUMBERED_PARAMS:
            rows = [statement_params(statement, row) for row in rows]
        self.queued.append((SQL[statement], rows, True))

    async def open_buffer(
        self, scope: str, scope_id: str, key: str, known_id: int | None
    ) -> BufferState:
        """Lock the buffer's row, creating the buffer first when it is new."""
        address = (scope, scope_id, key)
        lock, lock_params = lock_statement(known_id, address)
        locked, row = await self._locked_state(lock, lock_params, known_id, address)
        while locked is None:
            # Not locked: the buffer is new (create it), or another transaction
            # committed it between the lock and the state statement: lock it now.
            if row is None:
                await self.cursor.execute(SQL["create_buffer"], address)
            locked, row = await self._locked_state(*lock_statement(None, address), None, address)
        return buffer_state(row)

    async def _locked_state(
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
        locking, cursor = self.conn.cursor(), self.cursor
        queued = self._take()
        try:
            async with self.conn.pipeline():
                for text, values, many in queued:  # the BEGIN, the path
                    if many:
                        await cursor.executemany(text, values)
                    else:
                        await cursor.execute(text, values)
                if fresh:
                    await cursor.execute(first)
                await locking.execute(lock, lock_params, prepare=True)
                if fresh:  # the warning's timeout is for the row lock only
                    await cursor.execute(after)
                await cursor.execute(state, state_params, prepare=True)
        except pg_errors.LockNotAvailable:
            if not fresh or again is None:
                raise  # past the store's lock_timeout: the backend makes it LockTimeout
            # Nothing else was done in this transaction: start it again and wait.
            await rollback(self.conn)
            warn_lock_wait(warn_after, address, self.database.where)
            async with self.conn.pipeline():
                await cursor.execute(self.begin)
                await cursor.execute(PIN_SQL, (self.database.search_path,))
                await cursor.execute(again)
                await locking.execute(lock, lock_params)
                await cursor.execute(after)
                await cursor.execute(state, state_params)
        return await locking.fetchone(), await cursor.fetchone()

    def remember(self, state: BufferState) -> None:
        """PostgreSQL reads the state under the row lock each time: nothing to keep."""

    async def script(self, sql: str) -> None:
        await self._send()  # what is queued goes first
        await self.conn.execute(sql.encode())

    async def commit(self) -> None:
        """Send what is queued and the ``COMMIT`` in one pipeline: one round trip."""
        self.queued.append(("COMMIT", None, False))
        await self._send()

    async def raw(self, sql: str, params: Any = ()) -> list[Any]:
        """Rows of a statement that is not a named one (maintenance: ``check``)."""
        cursor = await self._send(sql, params)
        return await cursor.fetchall()

    async def raw_many(self, statements: list[tuple[str, Any]]) -> list[list[Any]]:
        """The rows of each statement, all sent in one pipeline (the verification's)."""
        queued = self._take()
        cursors = [self.conn.cursor() for _ in statements]
        async with self.conn.pipeline():
            for text, values, many in queued:
                if many:
                    await self.cursor.executemany(text, values)
                else:
                    await self.cursor.execute(text, values)
            for cursor, (sql, params) in zip(cursors, statements, strict=True):
                await cursor.execute(sql, params)
        return [await cursor.fetchall() for cursor in cursors]


async def rollback(conn: psycopg.AsyncConnection[Any]) -> None:
    """End a transaction the library began (connections are in autocommit mode); a
    connection that cannot is closed, and the pool replaces it."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        await conn.execute("ROLLBACK")
    except psycopg.Error:
        with contextlib.suppress(psycopg.Error):
            await conn.close()


@asynccontextmanager
async def borrowed(
    pool: psycopg_pool.AsyncConnectionPool[Any], where: str
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection from the pool, for one transaction; a pool that has none is typed."""
    try:
        conn = await pool.getconn()
    except (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as error:
        raise no_connection(where, error) from None
    try:
        yield conn
    finally:
        # Shielded: a cancellation arriving now must not lose the connection.
        await asyncio.shield(pool.putconn(conn))


async def prepare(database: Database, conn: psycopg.AsyncConnection[Any], create: bool) -> None:
    """Find the store's schema (set on ``database``), pin the path to it, verify what
    could run inside our statements (before any of them runs), then create, upgrade
    or refresh."""
    await conn.set_autocommit(True)  # a pool handed in by the application may differ
    current = await (await conn.execute(CURRENT_SCHEMA_SQL)).fetchone()
    database.schema = schema_of(None if current is None else current[0], database.where)
    database.search_path = pinned_path(database.schema)
    async with conn.transaction():
        await conn.execute(PIN_SQL, (database.search_path,))
        found = await _verdict(database, conn)
        refuse(found.refused, database.where)
        refuse_shared(found, database.where, accepted=database.shared_schema)
        if await _schema_version(conn, database.where) == SCHEMA_VERSION and not found.stale:
            refuse(schema_findings(found), database.where)
            warn(found, database.where)
            return
    async with conn.transaction():
        await conn.execute(PIN_SQL, (database.search_path,))
        # Create it, serialised against other processes doing the same.
        await conn.execute(CREATE_LOCK_SQL)
        version = await _schema_version(conn, database.where)
        for script in schema_scripts(version, create, database.where):
            await conn.execute(script)
        found = await _verdict(database, conn)
        if found.stale:  # a store made before our functions pinned their path
            for statement in refresh_statements(database.schema, found.stale):
                await conn.execute(statement.encode())
            found = await _verdict(database, conn)
        # Before COMMIT: a refused upgrade leaves the database as it was.
        refuse(schema_findings(found), database.where)
    warn(found, database.where)


async def _verdict(database: Database, conn: psycopg.AsyncConnection[Any]) -> Verdict:
    """The verification (postgresql_trust.py), in one round trip."""
    rows = await AsyncPgTx(database, conn, None).raw_many(verification_reads(database.schema))
    return verdict(database.schema, rows)


async def _schema_version(conn: psycopg.AsyncConnection[Any], where: str) -> int | None:
    """The schema version of the database, None when it has no tables of ours."""
    tables = {row[0] for row in await (await conn.execute(TABLES_SQL)).fetchall()}
    meta: dict[str, str] = {}
    if "flowdrop_meta" in tables:
        meta = dict(await (await conn.execute(META_SQL)).fetchall())
    return version_of(tables, meta, where)


async def check(database: Database, conn: psycopg.AsyncConnection[Any]) -> list[Violation]:
    """Every broken invariant, read in one snapshot: the verification's findings, then
    each buffer's messages and ledger (unless the verification refused the schema)."""
    tx = AsyncPgTx(database, conn, READ_SNAPSHOT)
    try:
        found = verdict(database.schema, await tx.raw_many(verification_reads(database.schema)))
        violations = [
            *schema_findings(found),
            *found.shared,
            *found.warned,
            *stale_findings(found),
        ]
        if found.refused:
            return violations  # reading on could run the foreign objects' SQL
        for buffer_id, scope, scope_id, key in await tx.raw(CHECK_BUFFERS_SQL):
            messages = await tx.raw(CHECK_MESSAGES_SQL, (buffer_id,))
            ledger = await tx.raw(CHECK_LEDGER_SQL, (buffer_id,))
            violations += checked_buffer(f"{scope}/{scope_id}/{key}", messages, ledger)
        return violations
    except psycopg.Error as error:
        raise translated(error, database.where) from None
    finally:
        await rollback(conn)


async def exported_rows(
    database: Database, conn: psycopg.AsyncConnection[Any], reads: list[tuple[str, Any]]
) -> AsyncIterator[tuple[int, Any]]:
    """``(i, row)`` for each read in turn, from one REPEATABLE READ snapshot on ``conn``,
    each through a server-side cursor that fetches ``EXPORT_CHUNK`` rows at a time."""
    try:
        await conn.execute(READ_SNAPSHOT)
        await conn.execute(PIN_SQL, (database.search_path,))
        for i, (statement, params) in enumerate(reads):
            async with conn.cursor(name=f"flowdrop_export_{i}") as cursor:
                cursor.itersize = EXPORT_CHUNK
                await cursor.execute(SQL[statement], statement_params(statement, params))
                async for row in cursor:
                    database.ensure_open()  # a store closed meanwhile: StoreClosed
                    yield i, row
    except psycopg.Error as error:
        database.ensure_open()
        raise FlowdropError(f"cannot export {database.where}: {redacted(error)}") from None
    finally:
        await rollback(conn)

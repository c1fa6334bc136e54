"""The PostgreSQL backend, natively async: psycopg's ``AsyncConnectionPool``.

The async twin of :mod:`.postgresql`, with the same statements (its ``SQL``
dict), the same transaction semantics and the same errors; only the I/O is
awaited. The buffer rules are not here: the handles' plans (the append engine's
among them) are driven on :class:`_AsyncPgTx` by :func:`plans.run_plan_async`.

* MEM-12 per buffer: an append locks its buffer's row (``FOR UPDATE``) before it
  reads the buffer's state; past ``lock_warning_after`` one warning is logged and
  the lock is waited for again.
* Writes whose result the plan does not need (``write``, ``many``) are queued
  and sent in one pipeline with the next read or with the ``COMMIT``.
* A deadlock or serialisation failure runs the whole transaction again
  (bounded, with backoff): :meth:`AsyncPostgresBackend.transact` takes a
  function that makes the plan, so each attempt starts from a fresh one.
* Cancellation: a task cancelled inside a transaction rolls it back (psycopg
  cancels the statement on the server first) and the connection goes back to
  the pool, or is discarded when it cannot be brought back to idle. A
  cancellation that arrives while the ``COMMIT`` is on its way cannot tell the
  caller whether it committed: the transaction is whole or absent, and a retry
  with the same message ids (:mod:`flowdrop_local.aio`) stores nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

from ..check import Violation
from ..errors import (
    FlowdropError,
    InvalidArgument,
    StoreClosed,
)
from ..plans import BufferState, Plan, run_plan_async
from .postgresql_dialect import (
    CHECK_BUFFERS_SQL,
    CHECK_LEDGER_SQL,
    CHECK_MESSAGES_SQL,
    CREATE_LOCK_SQL,
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

_EXPORT_CHUNK = 500


class _AsyncPgTx:
    """A transaction on one pooled async connection; writes wait for the next round trip."""

    def __init__(
        self,
        backend: AsyncPostgresBackend,
        conn: psycopg.AsyncConnection[Any],
        begin: str | None,
    ) -> None:
        self._backend = backend
        self.conn = conn
        self.cursor = conn.cursor()
        self.begin = begin or "BEGIN"
        self._queued: list[tuple[str, Any, bool]] = [] if begin is None else [(begin, None, False)]
        self.fresh = True
        self._pinned = False

    def _take(self) -> list[tuple[str, Any, bool]]:
        """The queued statements, with the path's pin the first time (``_PgTx._take``)."""
        queued, self._queued = self._queued, []
        if not self._pinned:
            self._pinned = True
            queued.insert(after_begin(queued), (PIN_SQL, (self._backend.search_path,), False))
        return queued

    async def _send(self, sql: str | None = None, params: Any = None) -> psycopg.AsyncCursor[Any]:
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
        self._queued.append((SQL[statement], statement_params(statement, params), False))

    async def many(self, statement: str, rows: Any) -> None:
        rows = (
            [statement_params(statement, row) for row in rows]
            if statement in NAMED_PARAMS
            else rows
        )
        self._queued.append((SQL[statement], rows, True))

    async def open_buffer(
        self, scope: str, scope_id: str, key: str, known_id: int | None
    ) -> BufferState:
        """Lock the buffer's row, creating it first when it is new; see ``_PgTx.open_buffer``."""
        address = (scope, scope_id, key)
        lock, lock_params = lock_statement(known_id, address)
        locked, row = await self._locked_state(lock, lock_params, known_id, address)
        while locked is None:
            if row is None:
                await self.cursor.execute(SQL["create_buffer"], address)
            locked, row = await self._locked_state(*lock_statement(None, address), None, address)
        return buffer_state(row)

    async def _locked_state(
        self, lock: str, lock_params: Any, known_id: int | None, address: tuple[str, str, str]
    ) -> tuple[Any, Any]:
        """The row lock and then the state, in one pipeline; see ``_PgTx._locked_state``."""
        state, state_params = state_statement(known_id, address)
        warn_after = self._backend.lock_warning_after
        first, after, again = lock_waits(warn_after, self._backend.lock_timeout)
        fresh = self.fresh
        self.fresh = False
        locking, cursor = self.conn.cursor(), self.cursor
        queued = self._take()
        try:
            async with self.conn.pipeline():
                for text, values, many in queued:  # the BEGIN
                    if many:
                        await cursor.executemany(text, values)
                    else:
                        await cursor.execute(text, values)
                if fresh:
                    await cursor.execute(first)
                await locking.execute(lock, lock_params, prepare=True)
                if fresh:
                    await cursor.execute(after)
                await cursor.execute(state, state_params, prepare=True)
        except pg_errors.LockNotAvailable:
            if not fresh or again is None:
                raise  # past the store's lock_timeout: _write makes it LockTimeout
            await _rollback(self.conn)
            warn_lock_wait(warn_after, address, self._backend.where)
            async with self.conn.pipeline():
                await cursor.execute(self.begin)
                await cursor.execute(PIN_SQL, (self._backend.search_path,))
                await cursor.execute(again)
                await locking.execute(lock, lock_params)
                await cursor.execute(after)
                await cursor.execute(state, state_params)
        return await locking.fetchone(), await cursor.fetchone()

    async def commit(self) -> None:
        self._queued.append(("COMMIT", None, False))
        await self._send()

    async def raw(self, sql: str, params: Any = ()) -> list[Any]:
        """Rows of a statement that is not a named one (maintenance: ``check``)."""
        cursor = await self._send(sql, params)
        return await cursor.fetchall()

    async def raw_many(self, statements: list[tuple[str, Any]]) -> list[list[Any]]:
        """The rows of each statement, all sent in one pipeline (``_PgTx.raw_many``)."""
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


class AsyncPostgresBackend:
    """A flowdrop_local PostgreSQL database, reached through an ``AsyncConnectionPool``.

    Open it with :meth:`connect`. ``target`` is a ``postgresql://`` URL (a pool is
    made and owned) or an ``AsyncConnectionPool`` the application owns (used, and
    left open by :meth:`close`).
    """

    kind = "postgresql"
    read_only = False
    durability = "normal"

    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Any],
        where: str,
        *,
        owns_pool: bool,
        lock_warning_after: float,
        lock_timeout: float | None = None,
        shared_schema: bool = False,
    ) -> None:
        self._pool = pool
        self.where = where
        self._owns_pool = owns_pool
        self.shared_schema = shared_schema
        self.lock_warning_after = lock_warning_after
        self.lock_timeout = lock_timeout
        self._closed = False
        self._exporting: set[psycopg.AsyncConnection[Any]] = set()
        self.schema = ""  # found by _prepare, as the sync backend's
        self.search_path = ""

    @classmethod
    async def connect(
        cls,
        target: Any,
        *,
        lock_warning_after: float,
        create: bool,
        lock_timeout: float | None = None,
        shared_schema: bool = False,
    ) -> AsyncPostgresBackend:
        """Open the database (creating its schema when ``create``); errors as ``Store``'s."""
        if isinstance(target, str):
            where = redact(target)
            try:
                # One direct connection first: a server that is not there fails now.
                await (await psycopg.AsyncConnection.connect(target, connect_timeout=10)).close()
                pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
                    target, min_size=1, max_size=8, open=False, kwargs={"autocommit": True}
                )
                await pool.open(wait=True, timeout=30)
            except (psycopg.Error, psycopg_pool.PoolTimeout) as error:
                raise connect_error(error, target) from None
            owns = True
        elif isinstance(target, psycopg_pool.AsyncConnectionPool):
            pool, where, owns = target, "a psycopg pool", False
        else:
            raise InvalidArgument(
                "AsyncStore takes a SQLite path, a postgresql:// URL or a "
                f"psycopg_pool.AsyncConnectionPool, not a {type(target).__name__}"
            )
        backend = cls(
            pool,
            where,
            owns_pool=owns,
            lock_warning_after=lock_warning_after,
            lock_timeout=lock_timeout,
            shared_schema=shared_schema,
        )
        try:
            await backend._prepare(create)
        except BaseException as error:
            if owns:
                await pool.close()
            raise opening_error(error, where) from None
        return backend

    async def _prepare(self, create: bool) -> None:
        """As the sync backend's ``_prepare``: pin the path, verify, then create or refresh."""
        async with self._pool.connection() as conn:
            await conn.set_autocommit(True)  # a pool handed in by the application may differ
            current = await (await conn.execute(CURRENT_SCHEMA_SQL)).fetchone()
            self.schema = schema_of(None if current is None else current[0], self.where)
            self.search_path = pinned_path(self.schema)
            async with conn.transaction():
                await conn.execute(PIN_SQL, (self.search_path,))
                found = await self._verdict(conn)
                refuse(found.refused, self.where)
                refuse_shared(found, self.where, accepted=self.shared_schema)
                if await self._version(conn) == SCHEMA_VERSION and not found.stale:
                    refuse(schema_findings(found), self.where)
                    warn(found, self.where)
                    return
            async with conn.transaction():
                await conn.execute(PIN_SQL, (self.search_path,))
                await conn.execute(CREATE_LOCK_SQL)
                version = await self._version(conn)
                for script in schema_scripts(version, create, self.where):
                    await conn.execute(script)
                found = await self._verdict(conn)
                if found.stale:
                    for statement in refresh_statements(self.schema, found.stale):
                        await conn.execute(statement.encode())
                    found = await self._verdict(conn)
                # Before COMMIT: a refused upgrade leaves the database as it was.
                refuse(schema_findings(found), self.where)
            warn(found, self.where)

    async def _verdict(self, conn: psycopg.AsyncConnection[Any]) -> Verdict:
        """The verification (postgresql_trust.py), in one round trip."""
        rows = await _AsyncPgTx(self, conn, None).raw_many(verification_reads(self.schema))
        return verdict(self.schema, rows)

    async def _version(self, conn: psycopg.AsyncConnection[Any]) -> int | None:
        tables = {row[0] for row in await (await conn.execute(TABLES_SQL)).fetchall()}
        meta: dict[str, str] = {}
        if "flowdrop_meta" in tables:
            meta = dict(await (await conn.execute(META_SQL)).fetchall())
        return version_of(tables, meta, self.where)

    # ------------------------------------------------------------------ lifecycle

    @property
    def closed(self) -> bool:
        return self._closed

    def ensure_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"the store {self.where!r} is closed")

    async def close(self) -> None:
        """Release the pool (when it is ours) and end exports in progress. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in list(self._exporting):
            with contextlib.suppress(psycopg.Error):
                await conn.close()
        if self._owns_pool:
            await self._pool.close()

    # ------------------------------------------------------------- transactions

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            conn = await self._pool.getconn()
        except (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as error:
            raise no_connection(self.where, error) from None
        try:
            yield conn
        finally:
            # Shielded: a cancellation arriving now must not lose the connection.
            await asyncio.shield(self._pool.putconn(conn))

    async def transact(self, make_plan: Callable[[], Plan]) -> Any:
        """Run a fresh plan from ``make_plan`` in one write transaction; again on a conflict.

        A deadlock or serialisation failure runs the whole transaction again, up to
        the sync backend's bound, with the same backoff.
        """
        for attempt in range(RETRIES):
            try:
                return await self._write(make_plan())
            except RETRIED_ERRORS as error:
                if attempt == RETRIES - 1:
                    raise translated(error, self.where, self.lock_timeout) from None
                await asyncio.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise AssertionError("unreachable")

    async def _write(self, plan: Plan) -> Any:
        self.ensure_open()
        async with self._connection() as conn:
            tx = _AsyncPgTx(self, conn, "BEGIN")
            tx._queued = write_begin(self.lock_timeout)
            try:
                result = await run_plan_async(plan, tx)
                await tx.commit()
            except BaseException as error:
                await _rollback(conn)
                if isinstance(error, RETRIED_ERRORS):
                    raise
                raise translated(error, self.where, self.lock_timeout) from None
            return result

    async def read(self, plan: Plan, *, snapshot: bool = True) -> Any:
        """Run ``plan`` in one read transaction (one statement alone needs no BEGIN)."""
        self.ensure_open()
        async with self._connection() as conn:
            tx = _AsyncPgTx(self, conn, READ_SNAPSHOT if snapshot else None)
            try:
                return await run_plan_async(plan, tx)
            except psycopg.Error as error:
                raise translated(error, self.where) from None
            finally:
                await _rollback(conn)

    async def snapshot_rows(self, reads: list[tuple[str, Any]]) -> AsyncIterator[tuple[int, Any]]:
        """``(i, row)`` for each read in turn, from one REPEATABLE READ snapshot on a
        connection of its own, through server-side cursors (as the sync backend)."""
        self.ensure_open()
        async with self._connection() as conn:
            self._exporting.add(conn)
            try:
                await conn.execute(READ_SNAPSHOT)
                await conn.execute(PIN_SQL, (self.search_path,))
                for i, (statement, params) in enumerate(reads):
                    async with conn.cursor(name=f"flowdrop_export_{i}") as cursor:
                        cursor.itersize = _EXPORT_CHUNK
                        await cursor.execute(SQL[statement], statement_params(statement, params))
                        async for row in cursor:
                            self.ensure_open()
                            yield i, row
            except psycopg.Error as error:
                self.ensure_open()
                raise FlowdropError(f"cannot export {self.where}: {redacted(error)}") from None
            finally:
                self._exporting.discard(conn)
                await _rollback(conn)

    async def check(self) -> list[Violation]:
        """Every broken invariant; the same queries and judgement as the sync backend."""
        self.ensure_open()
        async with self._connection() as conn:
            tx = _AsyncPgTx(self, conn, READ_SNAPSHOT)
            try:
                found = verdict(self.schema, await tx.raw_many(verification_reads(self.schema)))
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
                raise translated(error, self.where) from None
            finally:
                await _rollback(conn)


async def _rollback(conn: psycopg.AsyncConnection[Any]) -> None:
    """End a transaction the library began; a connection that cannot is closed (the
    pool replaces it)."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        await conn.execute("ROLLBACK")
    except psycopg.Error:
        with contextlib.suppress(psycopg.Error):
            await conn.close()

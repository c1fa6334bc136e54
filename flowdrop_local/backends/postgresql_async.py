"""The PostgreSQL backend, natively async: psycopg's ``AsyncConnectionPool``.

The async face of the PostgreSQL backend: the pool, ``transact`` and its
retries. The I/O both backends share (the transaction, preparing the schema, the
check, the export) is written once, async, in :mod:`.postgresql_io_async`, and
the blocking one is generated from it. The buffer rules are not here: the
handles' plans (the append engine's among them) are driven on
:class:`.postgresql_io_async.AsyncPgTx` by :func:`plans.run_plan_async`.

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
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

import psycopg
import psycopg_pool

from ..check import Violation
from ..errors import InvalidArgument, StoreClosed
from ..plans import Plan, run_plan_async
from .postgresql_dialect import (
    READ_SNAPSHOT,
    RETRIED_ERRORS,
    RETRIES,
    connect_error,
    opening_error,
    redact,
    translated,
    write_begin,
)
from .postgresql_io_async import AsyncPgTx, borrowed, check, exported_rows, prepare, rollback


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
        async with self._pool.connection() as conn:
            await prepare(self, conn, create)

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

    def _connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        return borrowed(self._pool, self.where)

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
            tx = AsyncPgTx(self, conn, "BEGIN")
            tx.queued = write_begin(self.lock_timeout)
            try:
                result = await run_plan_async(plan, tx)
                await tx.commit()
            except BaseException as error:
                await rollback(conn)
                if isinstance(error, RETRIED_ERRORS):
                    raise
                raise translated(error, self.where, self.lock_timeout) from None
            return result

    async def read(self, plan: Plan, *, snapshot: bool = True) -> Any:
        """Run ``plan`` in one read transaction (one statement alone needs no BEGIN)."""
        self.ensure_open()
        async with self._connection() as conn:
            tx = AsyncPgTx(self, conn, READ_SNAPSHOT if snapshot else None)
            try:
                return await run_plan_async(plan, tx)
            except psycopg.Error as error:
                raise translated(error, self.where) from None
            finally:
                await rollback(conn)

    async def snapshot_rows(self, reads: list[tuple[str, Any]]) -> AsyncIterator[tuple[int, Any]]:
        """``(i, row)`` for each read in turn, from one REPEATABLE READ snapshot on a
        connection of its own, through server-side cursors (as the sync backend)."""
        self.ensure_open()
        async with self._connection() as conn:
            self._exporting.add(conn)  # close() ends it, with the snapshot it holds
            rows = cast(AsyncGenerator[tuple[int, Any], None], exported_rows(self, conn, reads))
            try:
                async for item in rows:
                    yield item
            finally:
                # Closed here, not left to the loop's finaliser: its cleanup (cursor,
                # ROLLBACK) must run before the connection goes back to the pool.
                await rows.aclose()
                self._exporting.discard(conn)

    async def check(self) -> list[Violation]:
        """Every broken invariant; the same queries and judgement as the sync backend."""
        self.ensure_open()
        async with self._connection() as conn:
            return await check(self, conn)

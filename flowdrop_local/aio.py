"""The async API: ``AsyncStore`` and ``AsyncBuffer``, for agent code on an event loop.

The same names, arguments, results and errors as :class:`~flowdrop_local.Store`
and :class:`~flowdrop_local.Buffer`, awaited. No rule lives here: every call runs
what the sync API runs.

* **SQLite**: the sync :class:`Store` runs on one worker thread of its own per
  ``AsyncStore`` (as aiosqlite does). The event loop never waits for SQLite, and
  the calls of one ``AsyncStore`` run one at a time in the order they were made.
* **PostgreSQL**: natively async (psycopg's ``AsyncConnectionPool``,
  :mod:`.backends.postgresql_async`). The handles' plans (the append engine's
  among them) are driven on an async transaction by :func:`plans.run_plan_async`.

Cancellation: a task cancelled during ``await buf.append(...)`` leaves the append
whole or absent, never half written, and the store usable. It may have committed
although the caller saw ``CancelledError`` (on SQLite the worker finishes what it
started; on PostgreSQL the ``COMMIT`` may have reached the server). Give each
message an ``id`` (:func:`new_message_id`) and retry with the same ids: a message
the buffer already holds is dropped (``dropped`` in the result), so the retry
stores nothing twice.

Not async: the sessions API (``Store.sessions``), access hooks, ``import_*``,
``backup``, ``vacuum`` and ``Store.db``. On SQLite, :meth:`AsyncStore.run_sync`
runs any of them on the worker thread, in turn with the other calls; on
PostgreSQL, open a sync :class:`Store` for them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from .access import ExecutionContext, resolve_address, resolve_scope
from .backends import Durability, is_postgresql_target
from .buffer import Buffer, valid_address_part
from .check import Violation
from .engine import new_message_id, validate_batch
from .errors import StoreClosed, UnsupportedOperation
from .export_import import export_reads, export_record
from .memory import MemoryRead, MemoryWrite, delete_op, get_op, set_op
from .model import AppendResult, BufferInfo, BufferRef, Message
from .plans import All, Plan
from .refused_buffer import buffer_of
from .store import Store, valid_lock_timeout, valid_seconds

__all__ = ["AsyncBuffer", "AsyncStore", "new_message_id"]

T = TypeVar("T")
_EXPORT_BATCH = 256  # records an export hands over from the worker thread at a time


class AsyncStore:
    """A flowdrop_local database for async code; see the module docstring.

    Args: as :class:`~flowdrop_local.Store` (``target`` may also be a
    ``psycopg_pool.AsyncConnectionPool``, used and left open).

    Open it with ``async with AsyncStore(target) as store`` or ``store = await
    AsyncStore(target)`` (then ``await store.close()``).

    Raises:
        FlowdropError: what ``Store(target)`` raises, when it is opened.
    """

    def __init__(
        self,
        target: Any,
        *,
        durability: Durability = "normal",
        lock_warning_after: float = 5.0,
        lock_timeout: float | None = None,
        read_only: bool = False,
        create: bool = True,
        shared_schema: bool = False,
    ) -> None:
        self._target = target
        self._options: dict[str, Any] = {
            "durability": durability,
            "lock_warning_after": valid_seconds("lock_warning_after", lock_warning_after),
            "lock_timeout": valid_lock_timeout(lock_timeout),
            "read_only": read_only,
            "create": create,
            "shared_schema": bool(shared_schema),
        }
        self._pg: Any = None  # AsyncPostgresBackend, once open on PostgreSQL
        self._sync: Store | None = None  # the worker's store, once open on SQLite
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._state = "new"  # new, open, closed
        self.path: str = "" if is_postgresql_target(target) else str(target)

    def __repr__(self) -> str:
        kind = "postgresql" if self._pg is not None else "sqlite"
        return f"<AsyncStore {self.path!r} ({kind if self._state == 'open' else self._state})>"

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> AsyncStore:
        """Open the database (idempotent); ``async with`` and ``await`` call it."""
        if self._state == "open":
            return self
        if self._state == "closed":
            raise StoreClosed(f"the store {self.path!r} is closed")
        if is_postgresql_target(self._target):
            from .backends.postgresql_async import AsyncPostgresBackend
            from .backends.postgresql_dialect import refuse_sqlite_settings

            refuse_sqlite_settings(self._options["durability"], self._options["read_only"])
            self._pg = await AsyncPostgresBackend.connect(
                self._target,
                lock_warning_after=self._options["lock_warning_after"],
                lock_timeout=self._options["lock_timeout"],
                create=self._options["create"],
                shared_schema=self._options["shared_schema"],
            )
            self.path = self._pg.where
        else:
            opening = self._start_worker()
            try:
                self._sync = await asyncio.wrap_future(opening)
            except BaseException:
                self._stop_worker()
                raise
            self.path = self._sync.path
        self._state = "open"
        return self

    def _start_worker(self) -> concurrent.futures.Future[Store]:
        """SQLite: the worker thread, and the sync Store opening on it."""
        self._worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="flowdrop-async-store"
        )
        return self._worker.submit(Store, self._target, **self._options)

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=False)
            self._worker = None

    def open_blocking(self) -> AsyncStore:
        """SQLite: open now, waiting in this thread (for sync code that hands the store
        to async code later, as the Agents SDK session does); idempotent.

        Raises:
            UnsupportedOperation: on PostgreSQL, whose async pool opens on an event loop.
        """
        if self._state == "open":
            return self
        if self._state == "closed":
            raise StoreClosed(f"the store {self.path!r} is closed")
        if is_postgresql_target(self._target):
            raise UnsupportedOperation("a PostgreSQL AsyncStore opens on its event loop: await it")
        try:
            self._sync = self._start_worker().result()
        except BaseException:
            self._stop_worker()
            raise
        self.path = self._sync.path
        self._state = "open"
        return self

    def close_blocking(self) -> None:
        """SQLite: close now, after the calls already made, waiting in this thread."""
        if self._state == "closed":
            return
        if self._pg is not None:
            raise UnsupportedOperation("a PostgreSQL AsyncStore closes on its event loop: await it")
        was_open, self._state = self._state == "open", "closed"
        if was_open and self._worker is not None and self._sync is not None:
            self._worker.submit(self._sync.close).result()
            self._stop_worker()

    def sync_store(self) -> Store:
        """SQLite: the worker's sync :class:`Store` (thread-safe: its backend serialises
        every call), for sync code beside the async calls.

        Raises:
            UnsupportedOperation: on PostgreSQL; StoreClosed: not open.
        """
        if self._pg is not None:
            raise UnsupportedOperation("a PostgreSQL AsyncStore has no sync store: open a Store")
        return self._open_sync()

    def __await__(self) -> Generator[Any, None, AsyncStore]:
        return self.open().__await__()

    async def __aenter__(self) -> AsyncStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the store after the calls already made (idempotent); later calls raise
        ``StoreClosed``."""
        if self._state == "closed":
            return
        was_open, self._state = self._state == "open", "closed"
        if not was_open:
            return
        if self._pg is not None:
            await self._pg.close()
        elif self._worker is not None and self._sync is not None:
            worker = self._worker
            await asyncio.wrap_future(worker.submit(self._sync.close))
            worker.shutdown(wait=False)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._state == "closed"

    @property
    def kind(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return "postgresql" if is_postgresql_target(self._target) else "sqlite"

    async def run_sync(self, function: Callable[[Store], T]) -> T:
        """SQLite: run ``function(store)`` with the worker's sync :class:`Store`, on the
        worker thread, in turn with every other call.

        For the parts of the sync API that have no async form (sessions, import, backup).

        Raises:
            UnsupportedOperation: on PostgreSQL (open a sync ``Store`` for those there).
        """
        if self.kind == "postgresql":
            raise UnsupportedOperation(
                "run_sync runs the SQLite worker's store; on PostgreSQL open a sync Store"
            )
        return await self._call(function, self._open_sync())

    # ------------------------------------------------------------------ plumbing

    def _ensure_open(self) -> None:
        if self._state != "open":
            raise StoreClosed(
                f"the store {self.path!r} is closed"
                if self._state == "closed"
                else f"the store {self.path!r} is not open yet: use 'async with AsyncStore(...)' "
                "or 'await AsyncStore(...)'"
            )

    def _open_sync(self) -> Store:
        self._ensure_open()
        assert self._sync is not None
        return self._sync

    async def _call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``function`` on the worker thread; calls run one at a time, in order.

        A caller cancelled before the worker starts the call cancels it; one
        cancelled after that lets it finish (a transaction is whole or absent).
        """
        self._ensure_open()
        assert self._worker is not None
        try:
            future = self._worker.submit(function, *args, **kwargs)
        except RuntimeError:  # shut down meanwhile
            raise StoreClosed(f"the store {self.path!r} is closed") from None
        return await asyncio.wrap_future(future)

    # ------------------------------------------------------------- maintenance

    async def check(self) -> list[Violation]:
        """Every broken invariant in the database (empty when sound)."""
        if self._pg is None:
            return await self._call(self._open_sync().check)
        self._ensure_open()
        violations: list[Violation] = await self._pg.check()
        return violations

    def export(
        self, address: tuple[str, str, str] | None = None, *, full: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        """Export records of every buffer, or of one (``async for``); see ``Store.export``.

        One snapshot, read as the caller iterates (a chunk at a time).

        Raises:
            InvalidAddress: ``address`` is not ``None`` or three strings (at the call).
            StoreClosed: the store is closed (at the call, or at the next record).
        """
        reads = export_reads(address, full=full)  # InvalidAddress at the call, as Store's
        self._ensure_open()
        if self._pg is None:
            return self._export_sqlite(address, full)
        return self._export_postgresql(reads, full)

    async def _export_sqlite(
        self, address: tuple[str, str, str] | None, full: bool
    ) -> AsyncIterator[dict[str, Any]]:
        store = self._open_sync()
        records: Iterator[dict[str, Any]] = await self._call(store.export, address, full=full)

        def batch() -> list[dict[str, Any]]:
            return [record for _, record in zip(range(_EXPORT_BATCH), records, strict=False)]

        try:
            while chunk := await self._call(batch):
                for record in chunk:
                    yield record
        finally:
            close = getattr(records, "close", None)
            if close is not None and not self.closed:
                await self._call(close)  # ends the export's snapshot on its own thread

    async def _export_postgresql(
        self, reads: list[tuple[str, Any]], full: bool
    ) -> AsyncIterator[dict[str, Any]]:
        from .export_import import FORMAT_VERSION

        if full:
            yield {"flowdrop_export": FORMAT_VERSION}
        rows = self._pg.snapshot_rows(reads)
        try:
            async for i, row in rows:
                yield export_record(self._pg.where, i, row, full=full)
        finally:
            await rows.aclose()

    # --------------------------------------------------------------- buffers

    def buffer(
        self, scope: str, scope_id: str, key: str, *, window: int | None = None
    ) -> AsyncBuffer:
        """The buffer at ``(scope, scope_id, key)``, as ``Store.buffer`` (no I/O).

        Raises:
            InvalidAddress: an address part is not a string, or scope or key is blank.
            StoreClosed: the store is not open.
        """
        self._ensure_open()
        valid_address_part("key", key, allow_empty=False)
        return AsyncBuffer(
            self, buffer_of(self._plans(), resolve_address(scope, scope_id), scope, key, window)
        )

    def buffer_for(
        self, context: ExecutionContext | None, scope: str, key: str, *, window: int | None = None
    ) -> AsyncBuffer:
        """The buffer of ``key`` in ``scope`` as ``context`` resolves it; see
        ``Store.buffer_for`` (a refused scope gives a refused buffer)."""
        self._ensure_open()
        valid_address_part("key", key, allow_empty=False)
        return AsyncBuffer(
            self, buffer_of(self._plans(), resolve_scope(context, scope), scope, key, window)
        )

    def _plans(self) -> Any:
        """The backend a sync handle is made on: SQLite's, or (PostgreSQL) none at all:
        there the async handle only asks the sync one for its plans."""
        if self._pg is None:
            return self._open_sync().backend
        return _NoSyncBackend(self._pg.where)

    async def buffers(self) -> list[BufferRef]:
        """The buffers that hold messages, ordered by address."""
        if self._pg is None:
            return await self._call(self._open_sync().buffers)
        self._ensure_open()
        rows: list[Any] = await self._pg.read(_all("list_buffers"), snapshot=False)
        return [BufferRef(*row) for row in rows]

    # ------------------------------------------------------------------- memory

    async def memory_get(
        self, context: ExecutionContext | None, scope: str, key: str, default: object = None
    ) -> MemoryRead:
        """As ``Store.memory_get``."""
        if self._pg is None:
            return await self._call(self._open_sync().memory_get, context, scope, key, default)
        self._ensure_open()
        op = get_op(context, scope, key, default)
        if isinstance(op, MemoryRead):
            return op
        read: MemoryRead = await self._pg.read(op)
        return read

    async def memory_set(
        self, context: ExecutionContext | None, scope: str, key: str, value: object
    ) -> MemoryWrite:
        """As ``Store.memory_set``."""
        if self._pg is None:
            return await self._call(self._open_sync().memory_set, context, scope, key, value)
        self._ensure_open()
        return await self._memory_write(lambda: set_op(context, scope, key, value))

    async def memory_delete(
        self, context: ExecutionContext | None, scope: str, key: str
    ) -> MemoryWrite:
        """As ``Store.memory_delete``."""
        if self._pg is None:
            return await self._call(self._open_sync().memory_delete, context, scope, key)
        self._ensure_open()
        return await self._memory_write(lambda: delete_op(context, scope, key))

    async def _memory_write(
        self, make: Callable[[], MemoryWrite | Generator[Any, Any, MemoryWrite]]
    ) -> MemoryWrite:
        op = make()  # input errors and a refusal come before any connection is used
        if isinstance(op, MemoryWrite):
            return op
        first: list[Any] = [op]

        def plan() -> Plan:  # a fresh one for each attempt of the transaction
            made = first.pop() if first else make()
            assert not isinstance(made, MemoryWrite)
            return made

        written: MemoryWrite = await self._pg.transact(plan)
        return written


class AsyncBuffer:
    """One conversation buffer, awaited; see :class:`~flowdrop_local.Buffer`.

    Obtained from :meth:`AsyncStore.buffer`. Every method has the sync one's
    arguments, result and errors. ``refused`` is True for a buffer whose identity
    scope refused (MEM-7): it reads as empty and drops every turn, without I/O.
    """

    def __init__(self, store: AsyncStore, buffer: Buffer) -> None:
        self._store = store
        self._buffer = buffer

    def __repr__(self) -> str:
        return "<Async" + repr(self._buffer)[1:]

    @property
    def refused(self) -> bool:
        return self._buffer.refused

    @property
    def scope(self) -> str:
        return self._buffer.scope

    @property
    def scope_id(self) -> str:
        return self._buffer.scope_id

    @property
    def key(self) -> str:
        return self._buffer.key

    @property
    def window(self) -> int | None:
        return self._buffer.window

    @property
    def address(self) -> tuple[str, str, str]:
        """``(scope, scope_id, key)``."""
        return self._buffer.address

    def _native(self) -> bool:
        """True when the call is driven here, on PostgreSQL's async transactions; False
        on SQLite (the worker runs the sync method) and for a refused buffer (no I/O)."""
        self._store._ensure_open()
        return self._store._pg is not None and not self._buffer.refused

    # ------------------------------------------------------------------ reads

    async def read(
        self, limit: int | None = None, *, before: str | None = None
    ) -> list[dict[str, Any]]:
        """As ``Buffer.read``: ``{"role", "content", "metadata"}`` dicts in order."""
        if not self._native():
            return await self._sync_call(self._buffer.read, limit, before=before)
        plan = self._buffer.read_plan(limit, before=before)
        rows: list[dict[str, Any]] = await self._store._pg.read(plan, snapshot=before is not None)
        return rows

    async def messages(
        self, limit: int | None = None, *, before: str | None = None
    ) -> list[Message]:
        """As ``Buffer.messages``: :class:`Message` records in order (``before``: page back)."""
        if not self._native():
            return await self._sync_call(self._buffer.messages, limit, before=before)
        plan = self._buffer.messages_plan(limit, before=before)
        messages: list[Message] = await self._store._pg.read(plan, snapshot=before is not None)
        return messages

    async def count(self) -> int:
        """How many messages the buffer holds (``Buffer.count``)."""
        if not self._native():
            return await self._sync_call(self._buffer.count)
        return int(await self._store._pg.read(self._buffer.count_plan(), snapshot=False))

    # ----------------------------------------------------------------- writes

    async def append(
        self, messages: Mapping[str, Any] | Message | Iterable[Mapping[str, Any] | Message]
    ) -> AppendResult:
        """As ``Buffer.append``: one message or a batch, in one transaction.

        A message may carry ``"id"`` (a UUID): one the buffer already holds is
        dropped, so retrying a cancelled append with the same ids is safe.

        Raises:
            InvalidMessage: a message is malformed; nothing was written.
            MessageIdTaken: a message's id names a message of another buffer.
        """
        if not self._native():
            return await self._sync_call(self._buffer.append, messages)
        batch = validate_batch(messages)
        if not batch:
            return AppendResult(count=await self.count(), appended=0)
        buffer = self._buffer
        try:
            result, _ = await self._store._pg.transact(lambda: buffer.append_plan(batch))
        except BaseException:
            buffer.forget_row()  # the rollback may have undone the buffer's row
            raise
        appended: AppendResult = result
        return appended

    async def pop(self) -> dict[str, Any] | None:
        """As ``Buffer.pop``: remove the last message and return it; ``None`` when empty."""
        if not self._native():
            return await self._sync_call(self._buffer.pop)
        popped: dict[str, Any] | None = await self._store._pg.transact(self._buffer.pop_plan)
        return popped

    async def clear(self) -> int:
        """As ``Buffer.clear``: delete every message; return how many."""
        if not self._native():
            return await self._sync_call(self._buffer.clear)
        return int(await self._store._pg.transact(self._buffer.clear_plan))

    # ---------------------------------------------------------- conversations

    async def info(self) -> BufferInfo:
        """As ``Buffer.info``: the title, metadata, timestamps and count (one read)."""
        if not self._native():
            return await self._sync_call(self._buffer.info)
        info: BufferInfo = await self._store._pg.read(self._buffer.info_plan(), snapshot=False)
        return info

    async def set_title(self, title: str) -> BufferInfo:
        """As ``Buffer.set_title``: name the conversation; returns :meth:`info`.

        Raises:
            InvalidArgument: ``title`` is not a storable title; nothing was written.
        """
        if not self._native():
            return await self._sync_call(self._buffer.set_title, title)
        buffer = self._buffer
        info: BufferInfo = await self._store._pg.transact(lambda: buffer.set_title_plan(title))
        return info

    async def update_metadata(self, changes: Mapping[str, Any]) -> BufferInfo:
        """As ``Buffer.update_metadata``: a shallow merge (``None`` removes a key);
        returns :meth:`info`.

        Raises:
            InvalidArgument: ``changes`` is not a mapping with string keys, a value is
                not JSON, or the result is too large; nothing was written.
        """
        if not self._native():
            return await self._sync_call(self._buffer.update_metadata, changes)
        buffer = self._buffer
        await self._store._pg.transact(lambda: buffer.update_metadata_plan(changes))
        return await self.info()

    async def delete(self) -> int:
        """As ``Buffer.delete``: the buffer's row, messages and ledger go; returns how
        many messages were deleted (0 when the buffer did not exist)."""
        if not self._native():
            return await self._sync_call(self._buffer.delete)
        return int(await self._store._pg.transact(self._buffer.delete_plan))

    async def fork(
        self,
        *,
        at: str,
        to: tuple[str, str, str],
        progress: Callable[[int, int], None] | None = None,
    ) -> AsyncBuffer:
        """As ``Buffer.fork``: copy the history through message ``at`` into the empty
        buffer ``to``, in one transaction; returns an :class:`AsyncBuffer` on it.

        ``progress(done, total)`` is called after each run of copied rows (on SQLite,
        on the store's worker thread).

        Raises:
            MessageNotFound: ``at`` is no message of this buffer.
            BufferNotEmpty: ``to`` already holds messages (or is this buffer).
            InvalidAddress: ``to`` is not a usable address.
        """
        if not self._native():
            target = await self._sync_call(self._buffer.fork, at=at, to=to, progress=progress)
        else:
            buffer = self._buffer
            target = await self._store._pg.transact(
                lambda: buffer.fork_plan(at=at, to=to, progress=progress)
            )
        return AsyncBuffer(self._store, target)

    # -------------------------------------------------------- provider payloads

    async def to_openai_chat(self, limit: int | None = None) -> list[dict[str, Any]]:
        """As ``Buffer.to_openai_chat``."""
        from .providers import to_openai_chat

        if not self._native():
            return await self._sync_call(self._buffer.to_openai_chat, limit)
        return to_openai_chat(await self._last_turns(limit))

    async def to_openai_responses(self, limit: int | None = None) -> list[dict[str, Any]]:
        """As ``Buffer.to_openai_responses``."""
        from .providers import to_openai_responses

        if not self._native():
            return await self._sync_call(self._buffer.to_openai_responses, limit)
        return to_openai_responses(await self._last_turns(limit))

    async def to_anthropic(self, limit: int | None = None) -> dict[str, Any]:
        """As ``Buffer.to_anthropic``."""
        from .providers import to_anthropic

        if not self._native():
            return await self._sync_call(self._buffer.to_anthropic, limit)
        return to_anthropic(await self._last_turns(limit))

    async def _last_turns(self, limit: int | None) -> list[dict[str, Any]]:
        """``Buffer.last_turns_plan``, driven natively in one read transaction."""
        window: list[dict[str, Any]] = await self._store._pg.read(
            self._buffer.last_turns_plan(limit), snapshot=True
        )
        return window

    async def _sync_call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._buffer.refused:  # no storage behind it: nothing to wait for
            return function(*args, **kwargs)
        return await self._store._call(function, *args, **kwargs)


class _NoSyncBackend:
    """What a sync handle holds on an async PostgreSQL store: nothing it may use.

    The async handle only takes plans from it; a sync method that reached for its
    backend would be a bug, and fails loudly.
    """

    def __init__(self, where: str) -> None:
        self.where = where

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"an async store's handle used its sync backend ({name})")


def _all(statement: str, params: Any = ()) -> Plan:
    """A plan of one named read."""
    rows = yield All(statement, params)
    return rows

"""The entry point: ``Store`` opens a backend and hands out handles on it.

``Store(target)`` picks the backend from ``target`` (a SQLite path or
``":memory:"``, or a ``postgresql://`` URL; :mod:`flowdrop_local.backends`) and
owns nothing else: connections and transactions live in the backend, the buffer
rules in :mod:`flowdrop_local.engine`, and the handles (:class:`Buffer`,
:class:`Sessions`, memory, export and import) work through the backend.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import sqlite_utils

from . import _files, engine, memory, search
from .access import (
    AccessHook,
    ExecutionContext,
    Principal,
    resolve_address,
    resolve_scope,
)
from .backends import Durability, open_backend
from .backends.base import Backend
from .buffer import Buffer, valid_address_part, valid_limit
from .check import Violation
from .errors import InvalidArgument, UnsupportedOperation, shown, stored_json
from .export_import import (
    ImportReport,
    export_records,
    import_records,
    number_records,
    parse_lines,
)
from .model import BufferInfo, BufferRef, Page, SearchHit
from .plans import run_plan
from .refused_buffer import buffer_of
from .sessions import Sessions

__all__ = ["Durability", "Store"]

# The first page starts after every timestamp (an ISO text that sorts last under
# any collation) and every row id.
_FIRST_PAGE: tuple[str, int] = ("9999-12-31T23:59:59.999Z", 2**63 - 1)
_MAX_PAGE = 10_000  # rows one page reads at most, whatever limit asks


def _make_cursor(updated_at: str, row_id: int) -> str:
    """The opaque cursor of the page after the row (updated_at, id)."""
    return base64.urlsafe_b64encode(f"{row_id}|{updated_at}".encode()).decode().rstrip("=")


def _read_cursor(cursor: object) -> tuple[str, int]:
    """(updated_at, id) from a cursor :func:`_make_cursor` made, or InvalidArgument."""
    bad = InvalidArgument(f"after={shown(cursor)} is not a cursor this listing made")
    if not isinstance(cursor, str) or len(cursor) > 200 or not cursor.isascii():
        raise bad
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        row_id, updated_at = text.split("|", 1)
        number = int(row_id)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise bad from None
    if not 0 <= number < 2**63 or not 0 < len(updated_at) <= 40 or not updated_at.isprintable():
        raise bad
    return updated_at, number


# The longest wait a setting may ask for: SQLite's busy timeout is a C int of
# milliseconds (about 24.8 days); this is well inside it.
MAX_SECONDS = 1_000_000.0


def valid_seconds(name: str, value: object) -> float:
    """A number of seconds as a float: positive, finite and at most :data:`MAX_SECONDS`.

    The one conversion of a time setting: ``10**5000`` (OverflowError as a float),
    ``inf``, NaN, ``True`` or ``0`` would otherwise reach SQLite's busy timeout or
    PostgreSQL's ``lock_timeout`` as garbage.

    Raises:
        InvalidArgument: anything else.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_SECONDS  # False for NaN; no float() of a huge int
    ):
        raise InvalidArgument(
            f"{name} must be a number of seconds above 0 and at most {MAX_SECONDS:,.0f}, "
            f"got {shown(value)}"
        )
    return float(value)


def valid_lock_warning_after(value: object) -> None:
    """``lock_warning_after`` is a positive number of seconds, or InvalidArgument."""
    valid_seconds("lock_warning_after", value)


def valid_lock_timeout(value: object) -> float | None:
    """``lock_timeout``: None (wait for ever, the default) or a number of seconds."""
    return None if value is None else valid_seconds("lock_timeout", value)


class Store:
    """A flowdrop_local database: a SQLite file, or a PostgreSQL database.

    Args:
        target: a file path (created with its schema on first open), ``":memory:"``,
            or a ``postgresql://`` / ``postgres://`` URL (or a ``psycopg_pool``
            ``ConnectionPool``).
        durability: SQLite only. ``"normal"`` (WAL, synchronous=NORMAL: a committed
            append survives any crash of the process) or ``"full"``
            (synchronous=FULL: it also survives a power loss or an OS crash).
        lock_warning_after: seconds an append waits for another writer before a
            warning is logged; it then goes on waiting (MEM-12), until ``lock_timeout``.
        lock_timeout: seconds a write waits for a lock another writer holds before
            it raises :class:`~flowdrop_local.errors.LockTimeout`, having written
            nothing. ``None`` (the default) waits for ever.
        read_only: SQLite only: open the file for reading.
        create: when false, a missing file (or an empty one) is refused instead of
            created: for callers that only read. The file is created mode 0600.
        shared_schema: PostgreSQL only (ignored for SQLite). By default a store whose
            schema lets other roles create objects in it is refused
            (:class:`~flowdrop_local.errors.SharedSchemaRefused`): what they create
            there would run inside the library's statements. True opens it anyway,
            with a warning, for a deployment that trusts every such role.

    Raises:
        NotADatabase, NotAFlowdropDatabase, SchemaTooNew: the database is not one
            this library can open; it is left untouched.
        SharedSchemaRefused: (a NotAFlowdropDatabase) other roles may create objects
            in the store's PostgreSQL schema, and ``shared_schema`` is false.
        ServerUnreachable: no connection to the PostgreSQL server could be made.
        InvalidArgument: a setting is out of range.
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
        lock_warning_after = valid_seconds("lock_warning_after", lock_warning_after)
        lock_timeout = valid_lock_timeout(lock_timeout)
        self._backend: Backend = open_backend(
            target,
            durability=durability,
            lock_warning_after=lock_warning_after,
            lock_timeout=lock_timeout,
            read_only=read_only,
            create=create,
            shared_schema=bool(shared_schema),
        )
        self.path = self._backend.where
        # Whether this store created its SQLite file (a caller whose work then fails
        # may remove it); always False on PostgreSQL.
        self.created: bool = getattr(self._backend, "created", False)
        self.durability = self._backend.durability
        self.read_only = self._backend.read_only
        self.lock_warning_after = lock_warning_after
        self.lock_timeout = lock_timeout

    @property
    def backend(self) -> Backend:
        """The storage backend (``.kind`` is ``"sqlite"`` or ``"postgresql"``)."""
        return self._backend

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the connection(s). Idempotent; the store is unusable afterwards."""
        self._backend.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._backend.closed else self._backend.kind
        return f"<Store {self.path!r} ({state})>"

    # ------------------------------------------------------------- maintenance

    def check(self) -> list[Violation]:
        """Every broken invariant in the database (empty when sound); see :mod:`.check`."""
        return self._backend.check()

    def vacuum(self) -> None:
        """SQLite: checkpoint the WAL into the file, truncate it, and compact the file.

        Raises:
            UnsupportedOperation: on PostgreSQL (use ``VACUUM`` / autovacuum there).
        """
        self._backend.vacuum()

    def backup(self, path: str | os.PathLike[str]) -> None:
        """Write a consistent copy of the database to ``path`` while writers go on.

        Uses SQLite's online backup API in one step, so the copy is one snapshot.

        Raises:
            BackupTargetExists (a FileExistsError): something is at ``path``; untouched.
            DatabaseNotFound: the folder of ``path`` does not exist.
            InvalidArgument: ``path`` is not a text path.
            UnsupportedOperation: on PostgreSQL (use ``pg_dump``, or
                ``flowdrop-local copy`` to a SQLite file).
        """
        target = _files.checked_path(path, "the backup target")
        if not self.read_only and self._backend.kind == "sqlite":
            with self._backend.write() as tx:  # what the copy must hold alike (sync's links)
                run_plan(engine.notify("copying"), tx)
        self._backend.backup(target)

    def export(
        self, address: tuple[str, str, str] | None = None, *, full: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Export records (see :mod:`.export_import`) of every buffer, or of one.

        ``full``: export format 2, a header line, then every session, granted
        viewer and memory value, then the messages (what ``copy`` moves).
        """
        return export_records(self._backend, address, full=full)

    def import_records(
        self, records: Iterable[Mapping[str, Any]], *, replace: bool = False
    ) -> ImportReport:
        """Import export records in one transaction, healing as appends would.

        Raises:
            InvalidImport: a bad record (numbered from 1), or a buffer that already
                holds messages while ``replace`` is false. Nothing is written.
        """
        return import_records(self._backend, number_records(records), replace=replace)

    def import_jsonl(self, lines: Iterable[str], *, replace: bool = False) -> ImportReport:
        """Import a JSON Lines export (``flowdrop-local import``); errors name the line."""
        return import_records(self._backend, parse_lines(lines), replace=replace)

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
        self._backend.ensure_open()
        valid_address_part("key", key, allow_empty=False)  # bad input is an error, not a refusal
        return buffer_of(self._backend, resolve_address(scope, scope_id), scope, key, window)

    def buffers(self) -> list[BufferRef]:
        """The buffers that hold messages, ordered by address."""
        with self._backend.read() as tx:
            return [BufferRef(*row) for row in tx.all("list_buffers")]

    # ---------------------------------------------- conversations and search

    def conversations(
        self,
        *,
        order: str = "recent",
        limit: int = 50,
        after: str | None = None,
        scope: str | None = None,
        scope_id: str | None = None,
    ) -> Page:
        """One page of conversations, most recently updated first (a sidebar).

        Every buffer that has a row is listed, empty ones included (a conversation
        titled before its first message, or cleared): skipping them would make a
        page walk past any number of them. ``after`` is the ``next`` cursor of the
        previous page (opaque). Unfiltered, and with ``scope`` alone, a page is a
        range of the recency index: its cost does not grow with the number of
        buffers (``scope`` alone skips the other scopes' rows it passes). With
        ``scope`` and ``scope_id``, one owner's buffers are read and sorted.
        ``updated_at`` is coarse (an append writes it at most once a minute), so
        buffers appended to within the same minute may list in either order.

        Raises:
            InvalidArgument: an unknown ``order``, a bad ``limit`` or a cursor this
                listing did not make.
            InvalidAddress: ``scope`` or ``scope_id`` is not a string.
        """
        if order != "recent":
            raise InvalidArgument(f"order must be 'recent', not {shown(order)}")
        limit = min(valid_limit(limit), _MAX_PAGE)
        if scope is not None:
            valid_address_part("scope", scope, allow_empty=False)
        if scope_id is not None:
            valid_address_part("scope_id", scope_id, allow_empty=True)
        updated_at, row_id = _FIRST_PAGE if after is None else _read_cursor(after)
        statement = (
            "conversations_of"
            if scope is not None and scope_id is not None
            else "conversations_recent"
        )
        with self._backend.read(snapshot=False) as tx:
            rows = tx.all(statement, (updated_at, row_id, scope, scope_id, limit + 1))
        page = rows[:limit]
        items = tuple(
            BufferInfo(
                scope_,
                sid,
                key,
                title,
                stored_json(meta, "the metadata of buffer {}/{}/{}", scope_, sid, key),
                created,
                updated,
                int(count),
            )
            for scope_, sid, key, title, meta, created, updated, count, _ in page
        )
        more = len(rows) > limit and bool(page)
        return Page(items, _make_cursor(page[-1][6], page[-1][8]) if more else None)

    def enable_search(self, progress: Callable[[int, int], None] | None = None) -> bool:
        """Build the full-text search index over every stored message and keep it from now on.

        One transaction; from then on every append indexes its messages in its own
        transaction (see :mod:`flowdrop_local.search`). ``progress(done, total)`` is
        called as runs of messages are indexed. Returns False when search was
        enabled already.
        """
        return search.enable(self._backend, progress)

    @property
    def search_enabled(self) -> bool:
        """Whether this store has its search index (:meth:`enable_search`)."""
        return search.enabled(self._backend)

    def search(
        self,
        query: str,
        *,
        scope: str | None = None,
        scope_id: str | None = None,
        key: str | None = None,
        limit: int = 20,
    ) -> list[SearchHit]:
        """Messages whose text holds every word of ``query``, best first.

        Each hit names its buffer, the message id and role, a snippet with every
        matched term between ``[`` and ``]``, and a score (higher is better). Only
        message text is searched, never JSON keys; a query without a letter or
        digit finds nothing. See :mod:`flowdrop_local.search`.

        Raises:
            SearchNotEnabled: :meth:`enable_search` was never run on this store.
        """
        return search.search(
            self._backend, query, scope=scope, scope_id=scope_id, key=key, limit=limit
        )

    @property
    def db(self) -> sqlite_utils.Database:
        """A sqlite-utils view of the same connection, for ad-hoc table work (SQLite only).

        Writes through it bypass the buffer rules (the schema's triggers still
        apply); the store notices them (``total_changes``) and re-reads what it
        cached of a buffer before the next append.

        Raises:
            UnsupportedOperation: on PostgreSQL.
        """
        from .backends.sqlite import SqliteBackend

        if not isinstance(self._backend, SqliteBackend):
            raise UnsupportedOperation("store.db is a sqlite-utils view: SQLite stores only")
        self._backend.forget_tails()
        return sqlite_utils.Database(self._backend.connection())

    # ------------------------------------------- identity scopes and sessions
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
        self._backend.ensure_open()
        valid_address_part("key", key, allow_empty=False)  # bad input is an error, not a refusal
        return buffer_of(self._backend, resolve_scope(context, scope), scope, key, window)

    def memory_get(
        self, context: ExecutionContext | None, scope: str, key: str, default: object = None
    ) -> memory.MemoryRead:
        """Read ``key`` in ``scope``: ``{value, found, scope, resolved_scope_id}`` (MEM-7).

        A refused scope returns ``default`` with ``found=False`` and
        ``resolved_scope_id=""``, without reading anything.

        Raises:
            InvalidAddress: an unknown scope, or a blank key.
        """
        self._backend.ensure_open()
        return memory.get(self._backend, context, scope, key, default)

    def memory_set(
        self, context: ExecutionContext | None, scope: str, key: str, value: object
    ) -> memory.MemoryWrite:
        """Store the JSON ``value`` under ``key`` in ``scope``; ``ok`` is False if it refused.

        Raises:
            InvalidAddress: an unknown scope, or a blank key.
            InvalidValue: ``value`` is not JSON; nothing was written.
        """
        self._backend.ensure_open()
        return memory.set_(self._backend, context, scope, key, value)

    def memory_delete(
        self, context: ExecutionContext | None, scope: str, key: str
    ) -> memory.MemoryWrite:
        """Delete ``key`` in ``scope``; ``ok`` is False if it refused, ``existed`` if removed.

        Raises:
            InvalidAddress: an unknown scope, or a blank key.
        """
        self._backend.ensure_open()
        return memory.delete(self._backend, context, scope, key)

    def sessions(self, principal: Principal) -> Sessions:
        """The sessions API acting as ``principal`` (MEM-8, MEM-9, MEM-15).

        Raises:
            InvalidContext: ``principal`` is not a :class:`Principal`.
        """
        self._backend.ensure_open()
        return Sessions(self._backend, principal, lambda: self.access_hooks)

    @functools.cached_property
    def _access_hook_list(self) -> list[AccessHook]:
        return []

    @property
    def access_hooks(self) -> tuple[AccessHook, ...]:
        """The registered extension hooks, in the order they are asked."""
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
        self._access_hook_list.append(hook)

    def remove_access_hook(self, hook: AccessHook) -> None:
        """Unregister a hook added with :meth:`add_access_hook` (no error if absent)."""
        if hook in self._access_hook_list:
            self._access_hook_list.remove(hook)

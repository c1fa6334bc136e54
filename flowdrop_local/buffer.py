"""A conversation buffer: the handle users append to and read from.

A :class:`Buffer` holds no rows and no connection. Reads run named statements in
one read transaction of the store's backend; every write runs a plan of the
append engine (:mod:`flowdrop_local.engine`, where the buffer rules are kept) in
one write transaction. So the same handle works on SQLite and PostgreSQL.
What each method reads and writes is a plan too (``*_plan``, driven by
:func:`plans.run_plan`), so :class:`~flowdrop_local.aio.AsyncBuffer` runs the very
same steps on an async transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any

from . import engine
from ._deprecated import renamed
from ._ids import id_blob
from .access import resolve_address, valid_scope_name
from .backends.base import Backend, Tx
from .engine import Placement, new_message_id, validate_batch
from .errors import (
    BufferNotEmpty,
    CorruptRow,
    InvalidAddress,
    InvalidArgument,
    MessageNotFound,
    has_lone_surrogate,
    shown,
    stored_json,
)
from .model import AppendResult, BufferInfo, Message, converter
from .plans import All, BufferState, One, Plan, Run, Step, Write, run_plan
from .rules.incoming import Incoming

__all__ = [
    "Buffer",
    "Placement",
    "new_message_id",
    "valid_address_part",
    "valid_limit",
    "validate_batch",
]


def valid_address_part(name: str, value: object, *, allow_empty: bool) -> str:
    """One part of a buffer address, or InvalidAddress before any SQL sees it.

    A scope is a name the application chooses (:func:`access.valid_scope_name`);
    ``scope_id`` and ``key`` are free text, but valid Unicode (stored as UTF-8).
    """
    if name == "scope":
        return valid_scope_name(value)
    if not isinstance(value, str):
        raise InvalidAddress(f"{name} must be a string, not {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise InvalidAddress(f"{name} must not be blank")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidAddress(f"{name} {shown(value)} contains a lone surrogate") from None
    return value


# A LIMIT binds a signed 64-bit integer; a larger limit asks for everything anyway.
_MAX_LIMIT = 2**63 - 1


def valid_limit(limit: object) -> int:
    """A row limit as the database can bind it: a non-negative int, capped at 2**63 - 1."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidArgument(f"limit must be a non-negative integer, got {shown(limit)}")
    return min(limit, _MAX_LIMIT)


_MAX_TITLE = 1000  # characters: a title is a line in a sidebar, not a document
# bytes of JSON: a conversation's metadata is read with every listed page.
_MAX_METADATA = 1_000_000
FORK_RUN = 5000  # rows a fork copies per statement (a progress step)


def valid_before(before: object) -> None:
    """``before`` as :meth:`Buffer.read` and :meth:`Buffer.messages` take it: None or an id."""
    if before is not None and not isinstance(before, str):
        raise InvalidArgument(f"before must be a message id (a string), not {shown(before)}")


def valid_title(title: object) -> str:
    """A conversation title as it can be stored, or InvalidArgument."""
    if not isinstance(title, str):
        raise InvalidArgument(f"a title must be a string, not {shown(title)}")
    if len(title) > _MAX_TITLE:
        raise InvalidArgument(f"a title must be at most {_MAX_TITLE:,} characters")
    if "\x00" in title:
        raise InvalidArgument("a title must not hold a NUL character")
    try:
        title.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"the title {shown(title)} contains a lone surrogate") from None
    return title


def checked_json(value: dict[str, Any]) -> str:
    """A metadata object as stored JSON text, or InvalidArgument (not JSON, or too large)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidArgument(f"metadata must be a JSON object: {error}") from None
    if len(text) > _MAX_METADATA or len(text.encode("utf-8")) > _MAX_METADATA:
        raise InvalidArgument(f"metadata takes more than {_MAX_METADATA:,} bytes as JSON")
    return text


def _fork_target(backend: Backend, to: object) -> Buffer:
    """The handle on a fork's target address, checked as ``Store.buffer`` checks one."""
    if not isinstance(to, tuple | list) or len(to) != 3:
        raise InvalidAddress(f"to must be (scope, scope_id, key), not {shown(to)}")
    scope, scope_id, key = to
    valid_address_part("key", key, allow_empty=False)
    resolution = resolve_address(scope, scope_id)
    if resolution.refused:
        raise InvalidAddress(f"cannot fork into {shown(tuple(to))}: {resolution.reason}")
    return Buffer(backend, scope, resolution.scope_id, key)


def _fork(
    source: tuple[str, str, str],
    at: str,
    target: tuple[str, str, str],
    progress: Callable[[int, int], None] | None,
) -> Generator[Any, Any, None]:
    """The fork as steps (run by plans.run_plan): check both ends, then copy in runs."""
    found = yield One("find_buffer", source)
    position = None if found is None else (yield One("position_of", (found[0], at)))
    if found is None or position is None:
        raise MessageNotFound(f"no message {at!r} in buffer {'/'.join(source)}")
    source_id, cut = found[0], position[0]
    yield One("lock_buffer", (source_id,))
    row = yield One("find_buffer", target)
    if row is None:
        yield Write("create_buffer", target)
        row = yield One("find_buffer", target)
    target_id = row[0]
    yield One("lock_buffer", (target_id,))
    held = yield One("count", (target_id,))
    if held is not None and held[0]:
        raise BufferNotEmpty(
            f"buffer {'/'.join(target)} holds {held[0]} message(s); fork into a new one"
        )
    total = (yield One("count_through", (source_id, cut)))[0]
    copied, last = 0, ""  # every position sorts after ""
    while copied < total:
        copied += yield Run("fork_messages", (target_id, source_id, last, copied, cut, FORK_RUN))
        last = (yield One("tail", (target_id,)))[0]
        if progress is not None:
            progress(copied, total)
    yield Write("fork_ledger", (target_id, source_id, cut))
    yield Write("touch_buffer", (target_id,))


def _row_to_dict(role: str, content: str, parts: int, metadata: str) -> dict[str, Any]:
    return {
        "role": role,
        "content": stored_json(content, _A_MESSAGE, role) if parts else content,
        "metadata": stored_json(metadata, _A_MESSAGE, role),
    }


_A_MESSAGE = "a stored {} message"


class Buffer:
    """One conversation buffer, addressed by ``(scope, scope_id, key)``.

    Obtained from :meth:`Store.buffer`. Holds no rows itself: every call reads or
    writes the database, so two ``Buffer`` objects for one address see the same data.

    ``window``: keep at most this many messages. An append that goes past it
    evicts the oldest in the same transaction, and then any tool results left
    leading the buffer (their calls went with the evicted turns). The window
    belongs to this handle, not to the stored buffer.
    """

    refused = False  # True on a RefusedBuffer: its identity scope refused (MEM-7)

    def __init__(
        self, backend: Backend, scope: str, scope_id: str, key: str, *, window: int | None = None
    ) -> None:
        if window is not None and (
            not isinstance(window, int) or isinstance(window, bool) or window < 1
        ):
            raise InvalidArgument(f"window must be a positive integer or None, got {shown(window)}")
        self.backend = backend
        self.window = window
        self.scope = valid_address_part("scope", scope, allow_empty=False)
        self.scope_id = valid_address_part("scope_id", scope_id, allow_empty=True)
        self.key = valid_address_part("key", key, allow_empty=False)
        self._id: int | None = None  # the buffers row last seen (a hint: rows can be deleted)

    @property
    def db(self) -> Backend:
        """Deprecated: :attr:`backend` (``Store.db`` is a sqlite-utils view; this was
        the backend). Goes in the next release."""
        renamed("Buffer.db is now Buffer.backend")
        return self.backend

    def __repr__(self) -> str:
        return f"<Buffer {self.scope!r} {self.scope_id!r} {self.key!r}>"

    @property
    def address(self) -> tuple[str, str, str]:
        """``(scope, scope_id, key)``."""
        return (self.scope, self.scope_id, self.key)

    def forget_row(self) -> None:
        """Drop the buffer's row id this handle last saw (a hint), so the next write
        looks it up again: after a failed write, whose rollback may have undone the row."""
        self._id = None

    # ------------------------------------------------------------------ reads

    def existing_id(self, tx: Tx) -> int | None:
        """The buffer's row id inside ``tx``, or None when it has no row."""
        found: int | None = run_plan(self.existing_id_plan(), tx)
        return found

    def existing_id_plan(self) -> Plan:
        """:meth:`existing_id` as a plan: looked up each time, since the row may have
        been deleted (:meth:`delete`) by any handle or process, and its id given to
        another buffer since."""
        row = yield One("find_buffer", self.address)
        self._id = None if row is None else row[0]
        return self._id

    def read(self, limit: int | None = None, *, before: str | None = None) -> list[dict[str, Any]]:
        """The messages as ``{"role", "content", "metadata"}`` dicts, in position order.

        ``limit``: only the last ``limit`` messages (still in order).
        ``before``: only messages placed before the message with this id, for
        paging back through a long history (``read(50, before=oldest_id)``).

        Raises:
            MessageNotFound: ``before`` names no message of this buffer.
        """
        valid_before(before)
        with self.backend.read(snapshot=before is not None) as tx:
            return self.read_in(tx, limit, before=before)

    def read_in(
        self, tx: Tx, limit: int | None = None, *, before: str | None = None
    ) -> list[dict[str, Any]]:
        """:meth:`read` inside an open transaction (the sessions API decides and reads in one)."""
        rows: list[dict[str, Any]] = run_plan(self.read_plan(limit, before=before), tx)
        return rows

    def read_plan(self, limit: int | None = None, *, before: str | None = None) -> Plan:
        """:meth:`read` as a plan (the arguments are checked when it starts)."""
        valid_before(before)
        if before is None:  # one statement, keyed by the address
            if limit is None:
                rows = yield All("read_all_at", self.address)
            else:
                rows = yield All("read_last_at", (*self.address, valid_limit(limit)))
                rows.reverse()
            return [_row_to_dict(*row) for row in rows]
        found = yield from self._position_of(before)
        buffer_id = self._id
        limit = _MAX_LIMIT if limit is None else valid_limit(limit)
        rows = yield All("read_before", (buffer_id, found[0], limit))
        rows.reverse()
        return [_row_to_dict(*row) for row in rows]

    def _position_of(self, message_id: str) -> Plan:
        """The position of one of this buffer's messages, or MessageNotFound."""
        buffer_id = yield from self.existing_id_plan()
        found = None
        if buffer_id is not None and id_blob(message_id.lower()) is not None:  # ids are UUIDs
            found = yield One("position_of", (buffer_id, message_id.lower()))
        if found is None:
            raise MessageNotFound(f"no message {shown(message_id)} in {self!r}")
        return found

    def messages(self, limit: int | None = None, *, before: str | None = None) -> list[Message]:
        """The stored messages as :class:`Message` records, in position order.

        ``limit`` and ``before`` page back as in :meth:`read`; the records carry the
        ids that the next ``before`` needs.

        Raises:
            MessageNotFound: ``before`` names no message of this buffer.
        """
        valid_before(before)
        with self.backend.read(snapshot=before is not None) as tx:
            return self.messages_in(tx, limit, before=before)

    def messages_in(
        self, tx: Tx, limit: int | None = None, *, before: str | None = None
    ) -> list[Message]:
        """:meth:`messages` inside an open transaction."""
        messages: list[Message] = run_plan(self.messages_plan(limit, before=before), tx)
        return messages

    def messages_plan(self, limit: int | None = None, *, before: str | None = None) -> Plan:
        """:meth:`messages` as a plan."""
        valid_before(before)
        if before is not None:
            found = yield from self._position_of(before)
            buffer_id = self._id
            bound = _MAX_LIMIT if limit is None else valid_limit(limit)
            rows = yield All("messages_before", (buffer_id, found[0], bound))
            rows.reverse()
        elif limit is None:
            rows = yield All("messages_all_at", self.address)
        else:
            rows = yield All("messages_last_at", (*self.address, valid_limit(limit)))
            rows.reverse()
        return [
            converter.structure(
                {
                    "id": id_,
                    "position": position,
                    "role": role,
                    "content": (stored_json(content, "message {}", id_) if parts else content),
                    "metadata": stored_json(metadata, "message {}", id_),
                    "created_at": created_at,
                },
                Message,
            )
            for id_, position, role, content, parts, metadata, created_at in rows
        ]

    def __len__(self) -> int:
        with self.backend.read(snapshot=False) as tx:
            return int(run_plan(self.count_plan(), tx))

    def count_plan(self) -> Plan:
        """:meth:`count` as a plan."""
        row = yield One("count_at", self.address)
        return 0 if row is None else int(row[0])

    def count(self) -> int:
        """How many messages the buffer holds (``len(buf)``)."""
        return len(self)

    # ----------------------------------------------------------------- writes

    def pop(self) -> dict[str, Any] | None:
        """Remove the last message and return it as :meth:`read` would; ``None`` when empty.

        One transaction. Removing a result un-answers its call (the next user turn
        heals it again); removing a turn removes the calls it declared.
        """
        # transact: PostgreSQL may pick a delete as a deadlock's victim (against a
        # sync holding the change numbers it needs): it runs again.
        popped: dict[str, Any] | None = self.backend.transact(
            lambda tx: run_plan(self.pop_plan(), tx)
        )
        return popped

    def pop_plan(self) -> Plan:
        """:meth:`pop` as a plan, for a write transaction."""
        buffer_id = yield from self.existing_id_plan()
        if buffer_id is None:
            return None
        row = yield from engine.pop(buffer_id)
        return None if row is None else _row_to_dict(*row)

    def clear(self) -> int:
        """Delete every message of this buffer in one transaction; return how many."""
        return int(self.backend.transact(lambda tx: run_plan(self.clear_plan(), tx)))

    def clear_plan(self) -> Plan:
        """:meth:`clear` as a plan, for a write transaction."""
        buffer_id = yield from self.existing_id_plan()
        if buffer_id is None:
            return 0
        yield One("lock_buffer", (buffer_id,))  # waits for an append in progress
        yield Write("clear_ledger", (buffer_id,))
        cleared: int = yield Run("clear_messages", (buffer_id,))
        yield from engine.edited(buffer_id)
        return cleared

    def append(
        self, messages: Mapping[str, Any] | Message | Iterable[Mapping[str, Any] | Message]
    ) -> AppendResult:
        """Append one message or a batch, keeping the buffer rules, in one transaction.

        Returns:
            An :class:`AppendResult` (MEM-14).

        Raises:
            InvalidMessage: a message is malformed; nothing was written.
        """
        batch = validate_batch(messages)
        if not batch:
            return AppendResult(count=len(self), appended=0)
        try:
            return self.backend.transact(lambda tx: self.append_in(tx, batch), keep_tails=True)
        except BaseException:
            self.forget_row()  # the rollback may have undone the buffer's row
            raise

    def append_in(
        self, tx: Tx, batch: list[Incoming], placements: list[Placement] | None = None
    ) -> AppendResult:
        """Run the append engine for a validated batch inside an open write transaction.

        ``placements`` (import only) gives each message its stored id, position and
        timestamp; positions must increase.
        """
        result: AppendResult
        state: BufferState
        result, state = run_plan(self.append_plan(batch, placements), tx)
        tx.remember(state)
        return result

    def append_plan(
        self, batch: list[Incoming], placements: list[Placement] | None = None
    ) -> Generator[Step, Any, tuple[AppendResult, BufferState]]:
        """The engine's append for this buffer; keeps the buffer's row id it learns."""
        result, state = yield from engine.append(
            self.address, self._id, batch, self.window, placements
        )
        self._id = state.id
        return result, state

    def _repr_html_(self) -> str:
        """The last messages as an HTML transcript for Jupyter (escaped; loads nothing remote)."""
        from .transcript import buffer_html

        return buffer_html(self)

    # ---------------------------------------------------------- conversations
    # The buffer as a conversation an application lists, names, deletes and forks.
    # Like clear(), these are the trusted tier: no access decision.

    def info(self) -> BufferInfo:
        """The conversation's title, metadata, timestamps and count (one read).

        A buffer without a row (nothing appended, titled or given metadata) reads
        as an empty :class:`BufferInfo` with ``created_at`` and ``updated_at`` None.
        """
        with self.backend.read(snapshot=False) as tx:
            info: BufferInfo = run_plan(self.info_plan(), tx)
        return info

    def info_plan(self) -> Plan:
        """:meth:`info` as a plan (one read)."""
        row = yield One("buffer_info", self.address)
        return self._info(row)

    def _info(self, row: Any) -> BufferInfo:
        """:meth:`info` from its row (a damaged metadata column: CorruptRow)."""
        if row is None:
            return BufferInfo(*self.address)
        title, metadata, created_at, updated_at, count = row
        return BufferInfo(
            *self.address,
            title,
            stored_json(metadata, "the metadata of buffer {}/{}/{}", *self.address),
            created_at,
            updated_at,
            int(count),
        )

    def set_title(self, title: str) -> BufferInfo:
        """Name the conversation (creating its row if need be); returns :meth:`info`.

        Raises:
            InvalidArgument: ``title`` is not a string, holds a lone surrogate or a
                NUL, or is longer than 1,000 characters; nothing was written.
        """
        plan = self.set_title_plan(title)  # the title is checked before the transaction
        with self.backend.write() as tx:
            info: BufferInfo = run_plan(plan, tx)
        return info

    def set_title_plan(self, title: str) -> Plan:
        """:meth:`set_title` as a plan, for a write transaction; ``title`` is checked
        when the plan is made (InvalidArgument before any transaction)."""
        return self._set_title(valid_title(title))

    def _set_title(self, text: str) -> Plan:
        buffer_id = yield from self._row_plan()
        yield Write("set_title", (text, buffer_id))
        # Read in the write: a row that cannot be shown rolls the title back.
        row = yield One("buffer_info", self.address)
        return self._info(row)

    def update_metadata(self, changes: Mapping[str, Any]) -> BufferInfo:
        """Merge ``changes`` into the conversation's metadata object; returns :meth:`info`.

        A shallow merge, read and written in one transaction: each key of
        ``changes`` replaces the stored one, and a key whose value is ``None`` is
        removed (as in a JSON merge patch). The metadata is the application's own.

        Raises:
            InvalidArgument: ``changes`` is not a mapping with string keys, a value
                is not JSON, or the result is too large; nothing was written.
        """
        plan = self.update_metadata_plan(changes)  # bad input: refused before the transaction
        with self.backend.write() as tx:
            run_plan(plan, tx)
        return self.info()

    def update_metadata_plan(self, changes: Mapping[str, Any]) -> Plan:
        """:meth:`update_metadata`'s write as a plan (then :meth:`info` is read on its
        own); ``changes`` are checked when the plan is made (InvalidArgument)."""
        if not isinstance(changes, Mapping):
            raise InvalidArgument(f"metadata changes must be a mapping, not {shown(changes)}")
        if not all(isinstance(k, str) for k in changes):
            raise InvalidArgument("metadata keys must be strings")
        checked_json(dict(changes))
        return self._update_metadata(dict(changes))

    def _update_metadata(self, changes: dict[str, Any]) -> Plan:
        buffer_id = yield from self._row_plan()
        row = yield One("buffer_metadata", (buffer_id,))
        stored = stored_json(row[0], "the metadata of buffer {}/{}/{}", *self.address)
        if not isinstance(stored, dict):
            raise CorruptRow(f"the metadata of buffer {'/'.join(self.address)} is no object")
        for name, value in changes.items():
            if value is None:
                stored.pop(name, None)
            else:
                stored[name] = value
        yield Write("set_metadata", (checked_json(stored), buffer_id))

    def _row_plan(self) -> Plan:
        """The buffer's row id, creating the row if it has none, locked for this write."""
        row = yield One("find_buffer", self.address)
        if row is None:
            yield Write("create_buffer", self.address)
            row = yield One("find_buffer", self.address)
        yield One("lock_buffer", (row[0],))
        self._id = row[0]
        return int(row[0])

    def delete(self) -> int:
        """Delete the buffer: its row, its messages and its ledger, in one transaction.

        Unlike :meth:`clear`, the buffer's title, metadata and timestamps go too. The
        handle stays usable: a later append creates the buffer afresh.

        Returns:
            How many messages were deleted (0 when the buffer did not exist).
        """
        return self.backend.transact(self.delete_in)

    def delete_in(self, tx: Tx) -> int:
        """:meth:`delete` inside an open write transaction (the sessions API's admin tier)."""
        return int(run_plan(self.delete_plan(), tx))

    def delete_plan(self) -> Plan:
        """:meth:`delete` as a plan, for a write transaction."""
        buffer_id = yield from self.existing_id_plan()
        if buffer_id is None:
            return 0
        yield One("lock_buffer", (buffer_id,))  # waits for an append in progress
        yield Write("clear_ledger", (buffer_id,))
        deleted: int = yield Run("clear_messages", (buffer_id,))
        yield from engine.edited(buffer_id)  # a buffer made again is not "grown"
        yield Write("delete_buffer", (buffer_id,))
        self.forget_row()
        return deleted

    def fork(
        self,
        *,
        at: str,
        to: tuple[str, str, str],
        progress: Callable[[int, int], None] | None = None,
    ) -> Buffer:
        """Copy the history up to and including message ``at`` into the buffer ``to``.

        "Edit an earlier message and continue" is a fork, then an append. The copy
        keeps positions, content, metadata and timestamps, gives every message a new
        id, and rebuilds the ledger for the copied rows: a call whose result lies
        after the cut is unanswered in the fork, and the fork's next user turn heals
        it (MEM-3). One transaction, copied inside the database.

        ``progress(done, total)`` is called after each run of copied rows.

        Returns:
            A handle on the new buffer.

        Raises:
            MessageNotFound: ``at`` is no message of this buffer.
            BufferNotEmpty: ``to`` already holds messages (or is this buffer).
            InvalidAddress: ``to`` is not a usable address (an identity scope whose
                id names nobody included).
        """
        plan = self.fork_plan(at=at, to=to, progress=progress)  # checked before the transaction
        with self.backend.write() as tx:
            target: Buffer = run_plan(plan, tx)
        return target

    def fork_plan(
        self,
        *,
        at: str,
        to: tuple[str, str, str],
        progress: Callable[[int, int], None] | None = None,
    ) -> Plan:
        """:meth:`fork` as a plan, for a write transaction; it returns the target's
        handle (on this handle's backend). ``at`` and ``to`` are checked when the plan
        is made (InvalidArgument, InvalidAddress, BufferNotEmpty for this buffer)."""
        if not isinstance(at, str) or has_lone_surrogate(at):
            raise InvalidArgument(f"at must be a message id (a string), not {shown(at)}")
        target = _fork_target(self.backend, to)
        if target.address == self.address:
            raise BufferNotEmpty(f"cannot fork {self!r} into itself")
        return self._fork_into(target, at, progress)

    def _fork_into(
        self, target: Buffer, at: str, progress: Callable[[int, int], None] | None
    ) -> Plan:
        yield from _fork(self.address, at, target.address, progress)
        return target

    # -------------------------------------------------------- provider payloads

    def head_plan(self, n: int) -> Plan:
        """The first ``n`` messages, as :meth:`read` gives them (a payload's system prompt)."""
        rows = yield All("read_first_at", (*self.address, valid_limit(n)))
        return [_row_to_dict(*row) for row in rows]

    def last_turns_plan(self, limit: int | None = None) -> Plan:
        """The provider payloads' window as one plan: about the last ``limit``
        messages, widened to whole turns, with the system messages that open the
        history (:func:`~flowdrop_local.providers.window`). It reads only what the
        window needs (:func:`~flowdrop_local.providers.read_last_turns`'s reads, as steps),
        in one transaction, so the reads see one state of the buffer."""
        from .providers._common import last_turns_reads

        reads = last_turns_reads(limit, with_head=True)
        answer: Any = None
        try:
            while True:
                kind, n = reads.send(answer)
                if kind == "read":
                    answer = yield from self.read_plan(n)
                else:
                    answer = yield from self.head_plan(n or 0)
        except StopIteration as done:
            window: list[dict[str, Any]] = done.value
            return window

    def _last_turns(self, limit: int | None) -> list[dict[str, Any]]:
        with self.backend.read(snapshot=True) as tx:
            window: list[dict[str, Any]] = run_plan(self.last_turns_plan(limit), tx)
        return window

    def to_openai_chat(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The history as OpenAI Chat Completions ``messages`` (see :mod:`.providers`).

        ``limit``: about the last ``limit`` messages, widened to whole turns; only
        that window is read (:meth:`last_turns_plan`).
        """
        from .providers import to_openai_chat

        return to_openai_chat(self._last_turns(limit))

    def to_openai_responses(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The history as OpenAI Responses ``input`` items (see :mod:`.providers`)."""
        from .providers import to_openai_responses

        return to_openai_responses(self._last_turns(limit))

    def to_anthropic(self, limit: int | None = None) -> dict[str, Any]:
        """The history as Anthropic ``{"system", "messages"}`` (see :mod:`.providers`)."""
        from .providers import to_anthropic

        return to_anthropic(self._last_turns(limit))

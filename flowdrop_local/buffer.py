"""A conversation buffer and its append path, where the buffer rules are kept.

One append (one message or a batch) is one write transaction. For each incoming
message, in order:

* ``user``: first heal (MEM-3), when a call may be unanswered. The ledger's
  partial index yields the buffer's unanswered calls; each gets a placeholder
  placed between the first turn declaring it and that turn's successor, so no
  other row moves. Then the message is appended.
* ``tool`` with an id: dropped if a result for the id is stored (MEM-1), unless
  the stored one is a healed placeholder and the incoming one is not, in which
  case it overwrites the placeholder in place (MEM-10). Otherwise appended, and
  the ledger records the call as answered wherever the result stands. An
  incoming message already marked healed (an imported placeholder, exactly the
  placeholder's shape) is placed in the tool run of its declaring turn, or
  dropped when no turn declares its call: a healed mark never stands elsewhere.
* ``assistant`` declaring calls: dropped when every id it declares is already in
  the ledger (MEM-2); otherwise appended and its new ids recorded.

A batch reads the stored pairing state of the call ids it names once (their
results, which are declared), keeps it up to date as it goes, and writes rows
and ledger entries with ``executemany``. Every statement is an index look-up: the
cost of an append does not depend on the length of the buffer, and healing costs
one insert per unanswered call. A window, when set, evicts the oldest messages in
the same transaction and heals what that leaves unanswered before a user turn.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from .access import check_scope_name
from .errors import InvalidAddress, InvalidArgument, InvalidMessage, MessageNotFound, shown
from .model import AppendResult, Message, converter
from .positions import key_between, keys_between
from .rules.incoming import Incoming, normalize
from .rules.pairing import PLACEHOLDER_CONTENT, declared_call_ids, plan_healing

if TYPE_CHECKING:
    import sqlite3

    from .store import Store

_FIND_BUFFER = "SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?"
_CREATE_BUFFER = "INSERT OR IGNORE INTO buffers (scope, scope_id, key) VALUES (?, ?, ?)"
_BUFFER_STATE = (
    "SELECT message_count, (SELECT max(position) FROM messages WHERE buffer_id = ?1), "
    "EXISTS (SELECT 1 FROM tool_calls INDEXED BY tool_calls_unanswered "
    "WHERE buffer_id = ?1 AND answered_by IS NULL) "
    "FROM buffers WHERE id = ?1"
)
_COUNT = "SELECT message_count FROM buffers WHERE id = ?"
_SET_COUNT = "UPDATE buffers SET message_count = ? WHERE id = ?"
_ADD_COUNT = "UPDATE buffers SET message_count = message_count + ? WHERE id = ?"
_INSERT = (
    "INSERT INTO messages (id, buffer_id, position, role, content, content_parts, metadata) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_PLACED = (
    "INSERT INTO messages "
    "(id, buffer_id, position, role, content, content_parts, metadata, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, coalesce(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"
)
_NON_TOOL_AFTER = (
    "SELECT 1 FROM messages WHERE buffer_id = ? AND position > ? AND role != 'tool' LIMIT 1"
)
_FIND_RESULTS = (
    "SELECT tool_call_id, id, healed FROM messages "
    "WHERE buffer_id = ? AND tool_call_id IN (SELECT value FROM json_each(?))"
)
_REPLACE_PLACEHOLDER = (
    "UPDATE messages SET content = ?, content_parts = ?, metadata = ? WHERE id = ?"
)
_MARK_ANSWERED = "UPDATE tool_calls SET answered_by = ? WHERE buffer_id = ? AND call_id = ?"
_KNOWN_DECLARED = (
    "SELECT DISTINCT call_id FROM tool_calls WHERE buffer_id = ? "
    "AND call_id IN (SELECT value FROM json_each(?))"
)
# One row per declaration (a turn naming an id twice keeps its first ordinal); a
# result stored earlier already answers it.
_DECLARE = (
    "INSERT OR IGNORE INTO tool_calls (buffer_id, call_id, declared_by, ordinal, answered_by) "
    "VALUES (?1, ?2, ?3, ?4, (SELECT id FROM messages WHERE buffer_id = ?1 AND tool_call_id = ?2))"
)
# INDEXED BY: the planner, without statistics, prefers the primary key, which
# walks every declared call of the buffer instead of the unanswered ones.
_UNANSWERED = (
    "SELECT m.position, t.call_id FROM tool_calls AS t INDEXED BY tool_calls_unanswered "
    "JOIN messages AS m ON m.id = t.declared_by "
    "WHERE t.buffer_id = ? AND t.answered_by IS NULL ORDER BY m.position, t.ordinal"
)
_DECLARING_MESSAGE = (  # the first declaration owns the pairing
    "SELECT t.declared_by FROM tool_calls AS t JOIN messages AS m ON m.id = t.declared_by "
    "WHERE t.buffer_id = ? AND t.call_id = ? ORDER BY m.position LIMIT 1"
)
_DECLARING_TURN = (
    "SELECT m.position FROM tool_calls AS t JOIN messages AS m ON m.id = t.declared_by "
    "WHERE t.buffer_id = ? AND t.call_id = ? ORDER BY m.position LIMIT 1"
)
_LAST_USER = (
    "SELECT position FROM messages WHERE buffer_id = ? AND role = 'user' "
    "ORDER BY position DESC LIMIT 1"
)
_TAIL = "SELECT max(position) FROM messages WHERE buffer_id = ?"
_SUCCESSOR = (
    "SELECT position FROM messages WHERE buffer_id = ? AND position > ? ORDER BY position LIMIT 1"
)
_READ_ALL = (
    "SELECT role, content, content_parts, metadata FROM messages "
    "WHERE buffer_id = ? ORDER BY position"
)
_READ_LAST = (
    "SELECT role, content, content_parts, metadata FROM messages "
    "WHERE buffer_id = ? ORDER BY position DESC LIMIT ?"
)
_READ_BEFORE = (
    "SELECT role, content, content_parts, metadata FROM messages "
    "WHERE buffer_id = ? AND position < ? ORDER BY position DESC LIMIT ?"
)
_POSITION_OF = "SELECT position FROM messages WHERE buffer_id = ? AND id = ?"
_MESSAGES_ALL = (
    "SELECT id, position, role, content, content_parts, metadata, created_at FROM messages "
    "WHERE buffer_id = ? ORDER BY position"
)
_MESSAGES_LAST = (
    "SELECT id, position, role, content, content_parts, metadata, created_at FROM messages "
    "WHERE buffer_id = ? ORDER BY position DESC LIMIT ?"
)
_EVICT_OLDEST = (
    "DELETE FROM messages WHERE id IN "
    "(SELECT id FROM messages WHERE buffer_id = ? ORDER BY position LIMIT ?)"
)
_FIRST = "SELECT id, role FROM messages WHERE buffer_id = ? ORDER BY position LIMIT 1"
_DELETE_ONE = "DELETE FROM messages WHERE id = ?"
_MESSAGE_FOR_REMOVAL = "SELECT buffer_id, role, metadata FROM messages WHERE id = ?"
_DELETE_PLACEHOLDER = "DELETE FROM messages WHERE buffer_id = ? AND tool_call_id = ? AND healed = 1"
_LAST_ROW = (
    "SELECT id, role, content, content_parts, metadata FROM messages "
    "WHERE buffer_id = ? ORDER BY position DESC LIMIT 1"
)
_CLEAR_LEDGER = "DELETE FROM tool_calls WHERE buffer_id = ?"
_CLEAR_MESSAGES = "DELETE FROM messages WHERE buffer_id = ?"
_PLACEHOLDER_METADATA = '{{"tool_call_id":{},"healed":true}}'


class Placement(NamedTuple):
    """An imported message's stored id, position (``None``: at the end) and timestamp."""

    id: str
    position: str | None
    created_at: str | None


class _RandomPool:
    """Random bytes drawn from os.urandom 4 KiB at a time (one syscall per ~400 ids).

    Thread-safe, and emptied in a forked child so parent and child never share bytes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._bytes, self._at = b"", 0

    def take(self, n: int) -> bytes:
        with self._lock:
            if self._at + n > len(self._bytes):
                self._bytes, self._at = os.urandom(4096), 0
            chunk = self._bytes[self._at : self._at + n]
            self._at += n
            return chunk


_random = _RandomPool()


def new_message_id() -> str:
    """A UUIDv7 (RFC 9562): time-ordered, so new rows land at the end of the id index."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(_random.take(10), "big")
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # RFC 4122 variant
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def check_address_part(name: str, value: object, *, allow_empty: bool) -> str:
    """One part of a buffer address, or InvalidAddress before any SQL sees it.

    A scope is a name the application chooses (:func:`access.check_scope_name`);
    ``scope_id`` and ``key`` are free text, but valid Unicode (SQLite stores UTF-8).
    """
    if name == "scope":
        return check_scope_name(value)
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


def validate_batch(messages: object) -> list[Incoming]:
    """Validate every message of an append before anything is written."""
    if isinstance(messages, Mapping):
        return [normalize(messages, 0)]
    if isinstance(messages, Message):
        return [normalize(messages.to_dict(), 0)]
    if isinstance(messages, str | bytes) or not isinstance(messages, Iterable):
        raise InvalidMessage(
            0,
            "message",
            f"expected a message or an iterable of them, not {type(messages).__name__}",
        )
    return [
        normalize(m.to_dict() if isinstance(m, Message) else m, i) for i, m in enumerate(messages)
    ]


def _row_to_dict(role: str, content: str, parts: int, metadata: str) -> dict[str, Any]:
    return {
        "role": role,
        "content": json.loads(content) if parts else content,
        "metadata": json.loads(metadata),
    }


class Buffer:
    """One conversation buffer, addressed by ``(scope, scope_id, key)``.

    Obtained from :meth:`Store.buffer`. Holds no rows itself: every call reads or
    writes the file, so two ``Buffer`` objects for one address see the same data.

    ``window``: keep at most this many messages. An append that goes past it
    evicts the oldest in the same transaction, and then any tool results left
    leading the buffer (their calls went with the evicted turns). The window
    belongs to this handle, not to the stored buffer.
    """

    refused = False  # True on a RefusedBuffer: its identity scope refused (MEM-7)

    def __init__(
        self, store: Store, scope: str, scope_id: str, key: str, *, window: int | None = None
    ) -> None:
        if window is not None and (
            not isinstance(window, int) or isinstance(window, bool) or window < 1
        ):
            raise InvalidArgument(f"window must be a positive integer or None, got {shown(window)}")
        self.store = store
        self.window = window
        self.scope = check_address_part("scope", scope, allow_empty=False)
        self.scope_id = check_address_part("scope_id", scope_id, allow_empty=True)
        self.key = check_address_part("key", key, allow_empty=False)
        self._id: int | None = None  # the buffers row, once it exists (never deleted)

    def __repr__(self) -> str:
        return f"<Buffer {self.scope!r} {self.scope_id!r} {self.key!r}>"

    # ------------------------------------------------------------------ reads

    def _existing_id(self, conn: sqlite3.Connection) -> int | None:
        if self._id is None:
            row = conn.execute(_FIND_BUFFER, (self.scope, self.scope_id, self.key)).fetchone()
            if row is not None:
                self._id = row[0]
        return self._id

    def read(self, limit: int | None = None, *, before: str | None = None) -> list[dict[str, Any]]:
        """The messages as ``{"role", "content", "metadata"}`` dicts, in position order.

        ``limit``: only the last ``limit`` messages (still in order).
        ``before``: only messages placed before the message with this id, for
        paging back through a long history (``read(50, before=oldest_id)``).

        Raises:
            MessageNotFound: ``before`` names no message of this buffer.
        """
        if before is not None and not isinstance(before, str):
            raise InvalidArgument(f"before must be a message id (a string), not {shown(before)}")
        with self.store._read() as conn:
            buffer_id = self._existing_id(conn)
            if before is not None:
                found = None
                if buffer_id is not None:
                    found = conn.execute(_POSITION_OF, (buffer_id, before)).fetchone()
                if found is None:
                    raise MessageNotFound(f"no message {before!r} in {self!r}")
                rows = conn.execute(
                    _READ_BEFORE,
                    (buffer_id, found[0], -1 if limit is None else check_limit(limit)),
                ).fetchall()
                rows.reverse()
                return [_row_to_dict(*row) for row in rows]
            if buffer_id is None:
                return []
            if limit is None:
                rows = conn.execute(_READ_ALL, (buffer_id,)).fetchall()
            else:
                rows = conn.execute(_READ_LAST, (buffer_id, check_limit(limit))).fetchall()
                rows.reverse()
        return [_row_to_dict(*row) for row in rows]

    def messages(self, limit: int | None = None) -> list[Message]:
        """The stored messages as :class:`Message` records, in position order."""
        with self.store._read() as conn:
            buffer_id = self._existing_id(conn)
            if buffer_id is None:
                return []
            if limit is None:
                rows = conn.execute(_MESSAGES_ALL, (buffer_id,)).fetchall()
            else:
                rows = conn.execute(_MESSAGES_LAST, (buffer_id, check_limit(limit))).fetchall()
                rows.reverse()
        return [
            converter.structure(
                {
                    "id": id_,
                    "position": position,
                    "role": role,
                    "content": json.loads(content) if parts else content,
                    "metadata": json.loads(metadata),
                    "created_at": created_at,
                },
                Message,
            )
            for id_, position, role, content, parts, metadata, created_at in rows
        ]

    def __len__(self) -> int:
        with self.store._read() as conn:
            buffer_id = self._existing_id(conn)
            if buffer_id is None:
                return 0
            return int(conn.execute(_COUNT, (buffer_id,)).fetchone()[0])

    # ----------------------------------------------------------------- writes

    def pop(self) -> dict[str, Any] | None:
        """Remove the last message and return it as :meth:`read` would; ``None`` when empty.

        One transaction. Removing a result un-answers its call (the next user turn
        heals it again); removing a turn removes the calls it declared.
        """
        with self.store._write() as conn:
            buffer_id = self._existing_id(conn)
            row = None if buffer_id is None else conn.execute(_LAST_ROW, (buffer_id,)).fetchone()
            if row is None:
                return None
            conn.execute(_DELETE_ONE, (row[0],))
        return _row_to_dict(*row[1:])

    def clear(self) -> int:
        """Delete every message of this buffer in one transaction; return how many."""
        with self.store._write() as conn:
            buffer_id = self._existing_id(conn)
            if buffer_id is None:
                return 0
            conn.execute(_CLEAR_LEDGER, (buffer_id,))
            return conn.execute(_CLEAR_MESSAGES, (buffer_id,)).rowcount

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
        store = self.store
        # Store._write, inlined for the hot path: it also keeps the cached tail.
        with store._lock:
            conn = store._connection()
            store._begin_immediate(conn)
            try:
                result, state = self._append(conn, batch)
                conn.execute("COMMIT")
                store._changes = conn.total_changes
            except BaseException as error:
                store._abort(conn)
                self._id = None  # the rollback may have undone the buffer's row
                raise store._translated(error) from None
            store._tails[self._id] = state  # type: ignore[index]
        return result

    def _append(
        self,
        conn: sqlite3.Connection,
        batch: list[Incoming],
        placements: list[Placement] | None = None,
    ) -> tuple[AppendResult, tuple[int, str | None, bool]]:
        """The append rules, inside the caller's transaction.

        ``placements`` (import only) gives each message its stored id, position and
        timestamp; positions must increase. Returns the result and the buffer's
        new (count, last position, may hold unanswered calls).
        """
        buffer_id = self._existing_id(conn)
        if buffer_id is None:
            conn.execute(_CREATE_BUFFER, (self.scope, self.scope_id, self.key))
            self._id = None
            buffer_id = self._existing_id(conn)
            assert buffer_id is not None
        state = self.store._tails.get(buffer_id)
        if state is None:
            state = conn.execute(_BUFFER_STATE, (buffer_id,)).fetchone()
        count, tail, dangling = state
        execute = conn.execute
        new_ids: list[str] = []
        healed_ids: list[str] = []
        replaced_ids: list[str] = []
        dropped = 0
        # What the batch needs to know of the stored buffer, read once: the stored
        # result (and whether it is a placeholder) for each call id it answers,
        # and which of the ids it declares are declared already. From there on the
        # batch keeps both up to date itself, so most messages need no look-up.
        answering = {m.tool_call_id for m in batch if m.tool_call_id is not None}
        declaring = {call_id for m in batch for call_id in m.declared}
        results: dict[str, tuple[str, bool]] = {}
        if answering or declaring:  # a result stored before its call answers it too
            ids = json.dumps(list(answering | declaring))
            rows = execute(_FIND_RESULTS, (buffer_id, ids))
            results = {call_id: (id_, bool(healed)) for call_id, id_, healed in rows}
        known: set[str] = set()
        if declaring:
            rows = execute(_KNOWN_DECLARED, (buffer_id, json.dumps(list(declaring))))
            known = {row[0] for row in rows}
        open_calls: set[str] = set()  # declared by this batch, no result yet
        # Writes wait here and go in with executemany: rows first, then the ledger
        # rows that reference them (immediate foreign keys).
        pending: list[tuple[str, int, str, str, str, int, str, str | None]] = []
        declarations: list[tuple[int, str, str, int]] = []
        answers: list[tuple[str, int, str]] = []

        def flush() -> None:
            nonlocal dangling
            if pending:
                conn.executemany(_INSERT_PLACED, pending)
                pending.clear()
            if declarations:
                conn.executemany(_DECLARE, declarations)
                declarations.clear()
            if answers:
                conn.executemany(_MARK_ANSWERED, answers)
                answers.clear()
            # Calls this batch declared and left open are now unanswered in the file.
            dangling = dangling or bool(open_calls)

        for index, message in enumerate(batch):
            place = None if placements is None else placements[index]
            role = message.role
            call_id = message.tool_call_id
            if role == "user":
                if dangling or open_calls:
                    flush()
                    limit = (
                        None
                        if place is None or place.position is None
                        else _checked_position(place, tail, index)
                    )
                    tail = _heal(conn, buffer_id, tail, healed_ids, limit, answered=results)
                    dangling = False
                    open_calls.clear()
            elif role == "tool" and call_id is not None:
                found = results.get(call_id)
                if found is not None:
                    if found[1] and not message.healed:  # MEM-10
                        flush()
                        execute(
                            _REPLACE_PLACEHOLDER,
                            (message.content, message.content_parts, message.metadata, found[0]),
                        )
                        replaced_ids.append(found[0])
                        results[call_id] = (found[0], False)
                    else:  # MEM-1
                        dropped += 1
                    continue
                if message.healed:
                    # A placeholder only ever stands in the tool run right after the
                    # turn that declared its call: at the end while the buffer still
                    # ends in that run (in order, at its own position if an import
                    # gives one), else right after the turn; dropped when no turn
                    # declares the call.
                    flush()
                    turn = execute(_DECLARING_TURN, (buffer_id, call_id)).fetchone()
                    if turn is None:
                        dropped += 1
                        continue
                    if _extends_tool_run(conn, buffer_id, turn[0]):
                        position, at_end = _checked_position(place, tail, index), True
                    else:
                        (position,), at_end = _positions_after(conn, buffer_id, turn[0], 1)
                    message_id = _insert(conn, buffer_id, position, message, place)
                    execute(_MARK_ANSWERED, (message_id, buffer_id, call_id))
                    new_ids.append(message_id)
                    results[call_id] = (message_id, True)
                    open_calls.discard(call_id)
                    if at_end:
                        tail = position
                    continue
            elif message.declared:
                unique = list(dict.fromkeys(message.declared))
                if known.issuperset(unique):  # MEM-2
                    dropped += 1
                    continue
            tail = _checked_position(place, tail, index)
            message_id = new_message_id() if place is None else place.id
            pending.append(
                (
                    message_id,
                    buffer_id,
                    tail,
                    role,
                    message.content,
                    message.content_parts,
                    message.metadata,
                    None if place is None else place.created_at,
                )
            )
            new_ids.append(message_id)
            if call_id is not None:
                answers.append((message_id, buffer_id, call_id))
                results[call_id] = (message_id, False)
                open_calls.discard(call_id)
            elif message.declared:
                for ordinal, declared in enumerate(message.declared):
                    declarations.append((buffer_id, declared, message_id, ordinal))
                    if declared not in results:
                        open_calls.add(declared)
                known.update(message.declared)
        flush()
        count += len(new_ids) + len(healed_ids)
        if new_ids or healed_ids:
            execute(_SET_COUNT, (count, buffer_id))
        evicted = 0
        if self.window is not None and count > self.window:
            evicted = self._evict(conn, buffer_id, count - self.window)
            tail = execute(_TAIL, (buffer_id,)).fetchone()[0]
            # An evicted result (or first declaring turn) can leave a call unanswered
            # with user turns after it: heal those now, so no stored user turn ever
            # follows an unanswered call (MEM-3). Those placeholders may exceed the window.
            healed_before = len(healed_ids)
            tail = _heal(conn, buffer_id, tail, healed_ids, before_users_only=True)
            count += len(healed_ids) - healed_before - evicted  # the trigger took the evicted
            if len(healed_ids) > healed_before:
                execute(_SET_COUNT, (count, buffer_id))
            dangling = True
        result = AppendResult(
            count=count,
            appended=len(new_ids),
            message_ids=tuple(new_ids),
            healed_ids=tuple(healed_ids),
            replaced_ids=tuple(replaced_ids),
            dropped=dropped,
            evicted=evicted,
        )
        return result, (count, tail, dangling)

    @staticmethod
    def _evict(conn: sqlite3.Connection, buffer_id: int, excess: int) -> int:
        """Delete the ``excess`` oldest messages, then tool results left leading."""
        evicted = conn.execute(_EVICT_OLDEST, (buffer_id, excess)).rowcount
        while (first := conn.execute(_FIRST, (buffer_id,)).fetchone()) and first[1] == "tool":
            evicted += conn.execute(_DELETE_ONE, (first[0],)).rowcount
        return int(evicted)

    # -------------------------------------------------------- provider payloads

    def to_openai_chat(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The history as OpenAI Chat Completions ``messages`` (see :mod:`.providers`).

        ``limit``: about the last ``limit`` messages, widened to whole turns.
        """
        from .providers import to_openai_chat

        return to_openai_chat(self.read(), limit=limit)

    def to_openai_responses(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The history as OpenAI Responses ``input`` items (see :mod:`.providers`)."""
        from .providers import to_openai_responses

        return to_openai_responses(self.read(), limit=limit)

    def to_anthropic(self, limit: int | None = None) -> dict[str, Any]:
        """The history as Anthropic ``{"system", "messages"}`` (see :mod:`.providers`)."""
        from .providers import to_anthropic

        return to_anthropic(self.read(), limit=limit)


def remove_message(conn: sqlite3.Connection, message_id: str) -> bool:
    """Delete one message inside the caller's transaction, keeping the buffer rules.

    Deleting the turn that first declared a call also deletes the placeholder
    standing in its tool run (a placeholder of a call an earlier turn owns stays,
    so a real result can still replace it in place); deleting a result un-answers
    its call. Calls left unanswered before a user turn (the next turn declaring
    the id now owns it) are healed at once, so no stored user turn follows an
    unanswered call. Returns False if no such message.
    """
    row = conn.execute(_MESSAGE_FOR_REMOVAL, (message_id,)).fetchone()
    if row is None:
        return False
    buffer_id, role, metadata = row
    owned: list[tuple[int, str]] = []
    if role == "assistant":
        for call_id in dict.fromkeys(declared_call_ids(json.loads(metadata))):
            first = conn.execute(_DECLARING_MESSAGE, (buffer_id, call_id)).fetchone()
            if first is not None and first[0] == message_id:
                owned.append((buffer_id, call_id))
    conn.execute(_DELETE_ONE, (message_id,))
    conn.executemany(_DELETE_PLACEHOLDER, owned)
    healed: list[str] = []
    _heal(conn, buffer_id, None, healed, before_users_only=True)
    if healed:
        conn.execute(_ADD_COUNT, (len(healed), buffer_id))
    return True


def _heal(
    conn: sqlite3.Connection,
    buffer_id: int,
    tail: str | None,
    healed_ids: list[str],
    limit: str | None = None,
    *,
    before_users_only: bool = False,
    answered: dict[str, tuple[str, bool]] | None = None,
) -> str | None:
    """Answer every unanswered call of the buffer with a placeholder (MEM-3).

    ``limit``: the position the coming message will take (import), which the
    placeholders must stay below. ``before_users_only``: heal only calls that a
    stored user turn follows (after a deletion). ``answered`` records each healed
    call id's placeholder, for the append's batch view. Returns the new last position.
    """
    unanswered = conn.execute(_UNANSWERED, (buffer_id,)).fetchall()
    if before_users_only and unanswered:
        last_user = conn.execute(_LAST_USER, (buffer_id,)).fetchone()
        unanswered = [row for row in unanswered if last_user and row[0] < last_user[0]]
    for turn_position, call_ids in plan_healing(unanswered):
        positions, at_end = _positions_after(conn, buffer_id, turn_position, len(call_ids), limit)
        rows = []
        for position, call_id in zip(positions, call_ids, strict=True):
            message_id = new_message_id()
            metadata = _PLACEHOLDER_METADATA.format(json.dumps(call_id, ensure_ascii=False))
            rows.append((message_id, buffer_id, position, "tool", PLACEHOLDER_CONTENT, 0, metadata))
            healed_ids.append(message_id)
            if answered is not None:
                answered[call_id] = (message_id, True)
        conn.executemany(_INSERT, rows)
        conn.executemany(
            _MARK_ANSWERED,
            [(row[0], buffer_id, call_id) for row, call_id in zip(rows, call_ids, strict=True)],
        )
        if at_end:
            tail = positions[-1]
    return tail


def _positions_after(
    conn: sqlite3.Connection,
    buffer_id: int,
    turn_position: str,
    n: int,
    limit: str | None = None,
) -> tuple[list[str], bool]:
    """``n`` positions between a turn and its successor (or ``limit``, if lower).

    Also says whether they end the buffer (the turn had no successor).
    """
    successor = conn.execute(_SUCCESSOR, (buffer_id, turn_position)).fetchone()
    upper = None if successor is None else successor[0]
    if limit is not None and (upper is None or limit < upper):
        return keys_between(turn_position, limit, n), upper is None
    return keys_between(turn_position, upper, n), upper is None


def _extends_tool_run(conn: sqlite3.Connection, buffer_id: int, turn_position: str) -> bool:
    """True when only tool messages follow the turn: the end is still its tool run."""
    return conn.execute(_NON_TOOL_AFTER, (buffer_id, turn_position)).fetchone() is None


def _checked_position(place: Placement | None, tail: str | None, index: int) -> str:
    """The import's own position (after the tail, or refused), else the next at the end."""
    if place is None or place.position is None:
        return key_between(tail, None)
    if tail is not None and place.position <= tail:
        raise InvalidMessage(index, "position", f"{place.position!r} does not come after {tail!r}")
    return place.position


def _insert(
    conn: sqlite3.Connection,
    buffer_id: int,
    position: str,
    message: Incoming,
    place: Placement | None,
) -> str:
    message_id = new_message_id() if place is None else place.id
    conn.execute(
        _INSERT_PLACED,
        (
            message_id,
            buffer_id,
            position,
            message.role,
            message.content,
            message.content_parts,
            message.metadata,
            None if place is None else place.created_at,
        ),
    )
    return message_id


# SQLite's LIMIT takes a signed 64-bit integer; a larger limit asks for everything anyway.
_MAX_LIMIT = 2**63 - 1


def check_limit(limit: object) -> int:
    """A row limit as SQLite can bind it: a non-negative int, capped at 2**63 - 1."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidArgument(f"limit must be a non-negative integer, got {shown(limit)}")
    return min(limit, _MAX_LIMIT)

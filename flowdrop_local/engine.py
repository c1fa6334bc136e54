"""The append engine: the buffer rules as a plan, free of I/O.

The engine never touches a connection: each procedure here is a plan
(:mod:`flowdrop_local.plans`), a generator that asks for what it needs and says what
to write, one typed step at a time; a driver answers the steps on a real
transaction. So the rules are written once and run unchanged on SQLite and
PostgreSQL, blocking or async.

One append, for each incoming message in order (a message whose caller-supplied
``id`` the buffer already holds is dropped first: a retried append stores nothing
twice; an id another buffer holds refuses the whole append):

* ``user``: first heal (MEM-3) when a call may be unanswered. The ledger's partial
  index yields the buffer's unanswered calls; each gets a placeholder placed
  between the first turn declaring it and that turn's successor, so no other row
  moves. Then the message is appended.
* ``tool`` with an id: dropped if a result for the id is stored (MEM-1), unless the
  stored one is a healed placeholder and the incoming one is not: then it
  overwrites the placeholder in place (MEM-10). Otherwise appended, and the
  ledger records the call as answered wherever the result stands. An incoming
  message already marked healed (an imported placeholder) is placed in the tool
  run of its declaring turn, or dropped when no turn declares its call.
* ``assistant`` declaring calls: dropped when every id it declares is already in
  the ledger (MEM-2); otherwise appended and its new ids recorded.

A batch reads the stored pairing state of the call ids it names once, keeps it
up to date as it goes, and writes rows and ledger entries in runs (``many``).
Every statement is an index look-up keyed by the buffer: the cost of an append
does not depend on the length of the buffer, and healing costs one insert per
unanswered call. A window evicts the oldest messages in the same transaction and
heals what that leaves unanswered before a user turn.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, NamedTuple

from .errors import InvalidMessage, MessageIdTaken
from .model import AppendResult, Message
from .plans import All, BufferState, Many, One, OpenBuffer, Plan, Run, Step, Write
from .positions import key_between, keys_between
from .rules.incoming import Incoming, incoming
from .rules.pairing import (
    PLACEHOLDER_CONTENT,
    declared_call_ids,
    judge_result,
    placeholder_metadata_text,
    plan_healing,
    repeats_known_calls,
)


class MessageRow(NamedTuple):
    """A ``messages`` row as ``insert_message`` takes it, in its column order. Every
    writer of message rows (an append, healing, an import, a sync's merge) builds
    this one type. ``created_at`` None: the time of the write."""

    id: str
    buffer_id: int
    position: str
    role: str
    content: str
    content_parts: int
    metadata: str
    created_at: str | None
    tally: int


# buffers.updated_at is coarse: an append writes it only when it is older than this,
# so most appends leave the buffer's row (and its recency index) alone.
UPDATED_AT_GRANULARITY = 60


class Placement(NamedTuple):
    """An imported message's stored id, position (``None``: at the end) and timestamp."""

    id: str
    position: str | None
    created_at: str | None


# ----------------------------------------------------------------- ids, input


_ID_MASK = ~(0xF << 76) & ~(0x3 << 62)
_ID_BITS = 0x7 << 76 | 0x2 << 62  # version 7, RFC 4122 variant


class _IdSource:
    """The 128-bit values of new ids: random bits drawn from os.urandom 4 KiB at a
    time (one syscall per ~400 ids), under one lock with the last value made.

    Thread-safe, and reset in a forked child so parent and child never share bytes.
    """

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 4096
        self._last = 0  # ids only increase (RFC 9562 6.2)

    def next(self) -> int:
        with self._lock:
            at = self._at
            if at > 4086:
                self._pool, at = os.urandom(4096), 0
            self._at = at + 10
            random_bits = int.from_bytes(self._pool[at : at + 10], "big")
            value = ((time.time_ns() // 1_000_000) << 80 | random_bits) & _ID_MASK | _ID_BITS
            if value <= self._last:
                value = self._last + 1  # carries into the timestamp only after 2**62 ids
            self._last = value
            return value


_ids = _IdSource()


def new_message_id() -> str:
    """A UUIDv7 (RFC 9562): time-ordered, so new rows land at the end of the id index.

    Monotonic within the process: an id made in the same millisecond as the last
    one is the last one plus one (in its random bits), so ids also sort in the
    order they were made, as creation order needs.
    """
    h = f"{_ids.next():032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_message_id_bytes() -> bytes:
    """:func:`new_message_id` as its 16 bytes (SQLite's stored form; a fork's SQL function)."""
    return _ids.next().to_bytes(16, "big")


def validate_batch(messages: object) -> list[Incoming]:
    """Validate every message of an append before anything is written.

    A caller-supplied ``id`` may appear once in a batch (a second is InvalidMessage).
    """
    if isinstance(messages, Mapping):
        return [incoming(messages, 0)]
    if isinstance(messages, Message):
        return [incoming(messages.to_dict(), 0)]
    if isinstance(messages, str | bytes) or not isinstance(messages, Iterable):
        raise InvalidMessage(
            0,
            "message",
            f"expected a message or an iterable of them, not {type(messages).__name__}",
        )
    batch = [
        incoming(m.to_dict() if isinstance(m, Message) else m, i) for i, m in enumerate(messages)
    ]
    seen: dict[str, int] = {}
    for index, message in enumerate(batch):
        if message.id is not None:
            first = seen.setdefault(message.id, index)
            if first != index:
                raise InvalidMessage(
                    index, "id", f"{message.id!r} appears twice in the batch (message {first})"
                )
    return batch


# ------------------------------------------------------------------- append


class _Writes:
    """Rows waiting to be written with ``many``, flushed before every read.

    Reads go through :meth:`read`, which flushes first, so no read can see a
    buffer without the rows the batch has already decided on. ``may_hold_unanswered`` says
    whether the buffer may hold an unanswered call once the flushed rows are in:
    calls the batch declared and left open (``open_calls``) at any flush are.
    """

    def __init__(self, may_hold_unanswered: bool) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.declarations: list[tuple[int, str, str, int]] = []
        self.answers: list[tuple[str, int, str]] = []
        self.open_calls: set[str] = set()  # declared by this batch, no result yet
        self.may_hold_unanswered = may_hold_unanswered

    def flush(self) -> Plan:
        self.may_hold_unanswered = self.may_hold_unanswered or bool(self.open_calls)
        if self.rows:
            yield Many("insert_message", self.rows)
            self.rows = []
        if self.declarations:
            yield Many("declare_call", self.declarations)
            self.declarations = []
        if self.answers:
            yield Many("mark_answered", self.answers)
            self.answers = []

    def read(self, step: One | All) -> Plan:
        yield from self.flush()
        return (yield step)


def append(
    address: tuple[str, str, str],
    known_id: int | None,
    batch: list[Incoming],
    window: int | None = None,
    placements: list[Placement] | None = None,
) -> Generator[Step, Any, tuple[AppendResult, BufferState]]:
    """The append rules for one batch, inside the driver's transaction.

    ``placements`` (import only) gives each message its stored id, position and
    timestamp; positions must increase. Returns the report and the buffer's state
    after the append (for the backend's cache of buffer tails).
    """
    state: BufferState = yield OpenBuffer(*address, known_id)
    buffer_id, count, tail, may_hold_unanswered, updated, clock = state
    if (
        placements is None
        and not may_hold_unanswered
        and (window is None or count + len(batch) <= window)
        and all(m.tool_call_id is None and not m.declared and m.id is None for m in batch)
    ):
        # The common case, kept short: messages without tool data on a buffer with
        # no unanswered call. No rule applies; the rows go in at the end.
        return (yield from _append_plain(buffer_id, count, tail, updated, clock, batch))
    # Every row carries the count as it stands once the row is in (its tally);
    # the last row's is the buffer's count. tail_tally tracks the last row's.
    tail_tally = count
    new_ids: list[str] = []
    healed_ids: list[str] = []
    replaced_ids: list[str] = []
    dropped = 0
    # What the batch needs to know of the stored buffer, read once: the stored
    # result (and whether it is a placeholder) for each call id it answers, and
    # which of the ids it declares are declared already. From there on the batch
    # keeps both up to date itself, so most messages need no look-up.
    answering = {m.tool_call_id for m in batch if m.tool_call_id is not None}
    declaring = {call_id for m in batch for call_id in m.declared}
    results: dict[str, tuple[str, bool]] = {}
    known: set[str] = set()
    if answering or declaring:  # a result stored before its call answers it too
        # One statement: (1, call id, its result, healed) and (0, a declared call id).
        rows = yield All(
            "pairing_state",
            (buffer_id, list(answering | declaring), list(declaring)),
        )
        for is_result, call_id, id_, healed in rows:
            if is_result:
                results[call_id] = (id_, bool(healed))
            else:
                known.add(call_id)
    # Caller-supplied ids already in the buffer (a retried append): those messages
    # are dropped. An id another buffer holds is refused (ids are store-wide keys).
    stored_ids: set[str] = set()
    given = {m.id: i for i, m in enumerate(batch) if m.id is not None}
    if given:
        for id_, owner, *_ in (yield All("used_ids", (list(given),))):
            if owner != buffer_id:
                raise MessageIdTaken(
                    given[id_], "id", f"{id_!r} is the id of a message in another buffer"
                )
            stored_ids.add(id_)
    writes = _Writes(may_hold_unanswered)
    placed_inside = False  # a placeholder placed before the last row
    healed_inside: list[str] = []  # turns healing placed placeholders after, inside
    open_calls = writes.open_calls

    for index, message in enumerate(batch):
        place = None if placements is None else placements[index]
        role = message.role
        call_id = message.tool_call_id
        if message.id is not None and message.id in stored_ids:  # an earlier try stored it
            dropped += 1
            continue
        if role == "user":
            if writes.may_hold_unanswered or open_calls:
                yield from writes.flush()
                limit = (
                    None
                    if place is None or place.position is None
                    else _checked_position(place, tail, index)
                )
                healed_before = len(healed_ids)
                tail, tail_tally = yield from heal(
                    buffer_id,
                    tail,
                    tail_tally,
                    count,
                    healed_ids,
                    limit,
                    answered=results,
                    inside=healed_inside,
                )
                count += len(healed_ids) - healed_before
                writes.may_hold_unanswered = False
                open_calls.clear()
        elif role == "tool" and call_id is not None:
            found = results.get(call_id)
            verdict = judge_result(None if found is None else found[1], message.healed)
            if found is not None and verdict == "replaces":  # MEM-10
                yield from writes.flush()
                yield Write(
                    "replace_placeholder",
                    (
                        message.content,
                        message.content_parts,
                        message.metadata,
                        buffer_id,
                        found[0],
                    ),
                )
                replaced_ids.append(found[0])
                results[call_id] = (found[0], False)
                continue
            if verdict == "duplicate":  # MEM-1
                dropped += 1
                continue
            if message.healed:
                # A placeholder only ever stands in the tool run right after the
                # turn that declared its call: at the end while the buffer still
                # ends in that run (in order, at its own position if an import
                # gives one), else right after the turn; dropped when no turn
                # declares the call.
                turn = yield from writes.read(One("declaring_turn", (buffer_id, call_id)))
                if turn is None:
                    dropped += 1
                    continue
                non_tool_after = yield One("non_tool_after", (buffer_id, turn[0]))
                if non_tool_after is None:
                    position, at_end = _checked_position(place, tail, index), True
                else:
                    (position,), at_end = yield from _positions_after(buffer_id, turn[0], 1)
                message_id = _message_id(message, place)
                count += 1
                row = _row(message_id, buffer_id, position, message, place, count)
                yield Write("insert_message", row)
                yield Write("mark_answered", (message_id, buffer_id, call_id))
                new_ids.append(message_id)
                results[call_id] = (message_id, True)
                open_calls.discard(call_id)
                if at_end:
                    tail, tail_tally = position, count
                else:
                    placed_inside = True
                continue
        elif repeats_known_calls(message.declared, known):  # MEM-2
            dropped += 1
            continue
        tail = _checked_position(place, tail, index)
        message_id = _message_id(message, place)
        count += 1
        tail_tally = count
        writes.rows.append(_row(message_id, buffer_id, tail, message, place, count))
        new_ids.append(message_id)
        if call_id is not None:
            writes.answers.append((message_id, buffer_id, call_id))
            results[call_id] = (message_id, False)
            open_calls.discard(call_id)
        elif message.declared:
            for ordinal, declared in enumerate(message.declared):
                writes.declarations.append((buffer_id, declared, message_id, ordinal))
                if declared not in results:
                    open_calls.add(declared)
            known.update(message.declared)
    yield from writes.flush()
    may_hold_unanswered = writes.may_hold_unanswered
    if tail is not None and tail_tally != count:
        # A row placed before the last one (a placeholder) changed the count.
        yield Write("set_tally", (count, buffer_id, tail))
    evicted = 0
    if window is not None and count > window:
        evicted = yield from _evict(buffer_id, count - window)
        count -= evicted  # the delete trigger keeps the tally
        # An evicted result (or first declaring turn) can leave a call unanswered
        # with user turns after it: heal those now, so no stored user turn ever
        # follows an unanswered call (MEM-3). Those placeholders may exceed the window.
        healed_before = len(healed_ids)
        yield from heal(buffer_id, None, 0, count, healed_ids, before_users_only=True)
        if len(healed_ids) > healed_before:
            count += len(healed_ids) - healed_before
            yield from _settle_tally(buffer_id, count)
        row = yield One("tail", (buffer_id,))
        tail = row[0]
        may_hold_unanswered = True
    now = clock = max(int(time.time()), clock)
    if replaced_ids or evicted or placed_inside or healed_inside:  # not only at the end
        yield from edited(buffer_id)
        updated = now
    elif (new_ids or healed_ids) and now - updated >= UPDATED_AT_GRANULARITY:
        yield Write("touch_buffer", (buffer_id,))
        updated = now
    result = AppendResult(
        count=count,
        appended=len(new_ids),
        message_ids=tuple(new_ids),
        healed_ids=tuple(healed_ids),
        replaced_ids=tuple(replaced_ids),
        dropped=dropped,
        evicted=evicted,
    )
    return result, BufferState(buffer_id, count, tail, may_hold_unanswered, updated, clock)


def _append_plain(
    buffer_id: int,
    count: int,
    tail: str | None,
    updated: int,
    clock: int,
    batch: list[Incoming],
) -> Generator[Step, Any, tuple[AppendResult, BufferState]]:
    """Append messages no buffer rule applies to: one INSERT each, nothing read."""
    rows = []
    new_ids = []
    for message in batch:
        tail = key_between(tail, None)
        message_id = new_message_id()
        count += 1
        rows.append(
            MessageRow(
                message_id,
                buffer_id,
                tail,
                message.role,
                message.content,
                message.content_parts,
                message.metadata,
                None,
                count,
            )
        )
        new_ids.append(message_id)
    if len(rows) == 1:
        yield Write("insert_message", rows[0])
    else:
        yield Many("insert_message", rows)
    now = clock = max(int(time.time()), clock)  # the store's clock (BufferState.clock)
    if now - updated >= UPDATED_AT_GRANULARITY:
        yield Write("touch_buffer", (buffer_id,))
        updated = now
    result = AppendResult(count=count, appended=len(new_ids), message_ids=tuple(new_ids))
    return result, BufferState(buffer_id, count, tail, False, updated, clock)


def _message_id(message: Incoming, place: Placement | None) -> str:
    """The stored id: an import's, else the caller's, else a new one."""
    if place is not None:
        return place.id
    return new_message_id() if message.id is None else message.id


def _row(
    message_id: str,
    buffer_id: int,
    position: str,
    message: Incoming,
    place: Placement | None,
    tally: int,
) -> MessageRow:
    created_at = None if place is None else place.created_at
    return MessageRow(
        message_id,
        buffer_id,
        position,
        message.role,
        message.content,
        message.content_parts,
        message.metadata,
        created_at,
        tally,
    )


def _settle_tally(buffer_id: int, count: int) -> Plan:
    """Write ``count`` on the buffer's last row, after placeholders went in before it."""
    row = yield One("tail", (buffer_id,))
    if row is not None and row[0] is not None:
        yield Write("set_tally", (count, buffer_id, row[0]))


def _evict(buffer_id: int, excess: int) -> Generator[Step, Any, int]:
    """Delete the ``excess`` oldest messages, then tool results left leading."""
    evicted: int = yield Run("evict_oldest", (buffer_id, excess))
    while True:
        first = yield One("first_message", (buffer_id,))
        if first is None or first[1] != "tool":
            return evicted
        evicted += yield Run("delete_message", (buffer_id, first[0]))


def heal(
    buffer_id: int,
    tail: str | None,
    tail_tally: int,
    count: int,
    healed_ids: list[str],
    limit: str | None = None,
    *,
    before_users_only: bool = False,
    answered: dict[str, tuple[str, bool]] | None = None,
    inside: list[str] | None = None,
) -> Generator[Step, Any, tuple[str | None, int]]:
    """Answer every unanswered call of the buffer with a placeholder (MEM-3).

    ``limit``: the position the coming message will take (import), which the
    placeholders must stay below. ``before_users_only``: heal only calls that a
    stored user turn follows (after a deletion). ``answered`` records each healed
    call id's placeholder, for the append's batch view. ``inside`` gets the turns
    whose placeholders went before the last row (not at the end). ``count`` is the
    buffer's count before healing. Returns the new last position and its tally.
    """
    unanswered = yield All("unanswered_calls", (buffer_id,))
    if before_users_only and unanswered:
        first = min(row[0] for row in unanswered)
        last_user = yield One("last_user_after", (buffer_id, first))
        unanswered = [row for row in unanswered if last_user and row[0] < last_user[0]]
    # Each row carries its turn's successor: no look-up per declaring turn.
    anchors = [((position, successor), call_id) for position, call_id, successor in unanswered]
    for (turn_position, successor), call_ids in plan_healing(anchors):
        positions = _between(turn_position, successor, len(call_ids), limit)
        at_end = successor is None
        rows = []
        answers = []
        for position, call_id in zip(positions, call_ids, strict=True):
            message_id = new_message_id()
            count += 1
            rows.append(
                MessageRow(
                    message_id,
                    buffer_id,
                    position,
                    "tool",
                    PLACEHOLDER_CONTENT,
                    0,
                    placeholder_metadata_text(call_id),
                    None,
                    count,
                )
            )
            answers.append((message_id, buffer_id, call_id))
            healed_ids.append(message_id)
            if answered is not None:
                answered[call_id] = (message_id, True)
        yield Many("insert_message", rows)
        yield Many("mark_answered", answers)
        if at_end:
            tail, tail_tally = positions[-1], count
        elif inside is not None:
            inside.append(turn_position)
    return tail, tail_tally


def _positions_after(
    buffer_id: int, turn_position: str, n: int, limit: str | None = None
) -> Generator[Step, Any, tuple[list[str], bool]]:
    """``n`` positions between a turn and its successor (or ``limit``, if lower).

    Also says whether they end the buffer (the turn had no successor).
    """
    successor = yield One("successor", (buffer_id, turn_position))
    upper = None if successor is None else successor[0]
    return _between(turn_position, upper, n, limit), upper is None


def _between(turn_position: str, upper: str | None, n: int, limit: str | None) -> list[str]:
    """``n`` keys after a turn, below its successor ``upper`` and below ``limit`` if lower."""
    if limit is not None and (upper is None or limit < upper):
        return keys_between(turn_position, limit, n)
    return keys_between(turn_position, upper, n)


def _checked_position(place: Placement | None, tail: str | None, index: int) -> str:
    """The import's own position (after the tail, or refused), else the next at the end."""
    if place is None or place.position is None:
        return key_between(tail, None)
    if tail is not None and place.position <= tail:
        raise InvalidMessage(index, "position", f"{place.position!r} does not come after {tail!r}")
    return place.position


# ------------------------------------------------------------------ removal


# ----------------------------------------------------------- change notices
# A part of the library that keeps its own record of the store (offline sync,
# flowdrop_local/sync) hears of the changes it cannot see in the rows through these,
# without the engine naming it: each listener is a plan, run in the transaction
# that made the change.
#   "edited" (buffer_id): a buffer changed other than by an append at the end;
#   "restored" (message ids): an import with replace wrote these messages back;
#   "registers_imported" (kinds): an import wrote memory values or viewer grants
#   ("memory", "viewer") with the stamps they had;
#   "copying" (): the whole store is about to be copied (backup): what a listener
#   would otherwise make later, and could make apart on the two copies, it makes now.
_LISTENERS: dict[str, list[Callable[..., Plan]]] = {
    "edited": [],
    "restored": [],
    "registers_imported": [],
    "copying": [],
}


def listen(change: str, listener: Callable[..., Plan]) -> None:
    """Run ``listener(*args)`` inside every transaction that makes ``change``."""
    _LISTENERS[change].append(listener)


def notify(change: str, *args: Any) -> Plan:
    """The listeners of ``change``, one after the other (a plan: ``yield from``)."""
    for listener in _LISTENERS[change]:
        yield from listener(*args)


def edited(buffer_id: int) -> Plan:
    """After a change that is not a plain append at the end (a delete, an edit in
    place, a row placed before the last one): ``updated_at`` moves strictly later
    and the listeners hear of it (offline sync then reads the buffer whole at its
    next sync instead of only what was appended since)."""
    yield Write("touch_edited", (buffer_id,))
    yield from notify("edited", buffer_id)


def pop(buffer_id: int) -> Generator[Step, Any, tuple[Any, ...] | None]:
    """Remove the buffer's last message; return its ``(role, content, parts, metadata)``.

    Removing a result un-answers its call (the next user turn heals it again);
    removing a turn removes the calls it declared (the ledger's foreign keys).
    """
    yield One("lock_buffer", (buffer_id,))  # waits for an append in progress
    row = yield One("last_message", (buffer_id,))
    if row is None:
        return None
    yield Run("delete_message", (buffer_id, row[0]))  # the delete trigger keeps the tally
    yield from edited(buffer_id)
    return tuple(row[1:])


def remove_message(message_id: str, *, heal_now: bool = True) -> Generator[Step, Any, bool]:
    """Delete one message, keeping the buffer rules; False if there is no such message.

    Deleting the turn that first declared a call also deletes the placeholder
    standing in its tool run (a placeholder of a call an earlier turn owns stays,
    so a real result can still replace it in place); deleting a result un-answers
    its call. Calls left unanswered before a user turn (the next turn declaring
    the id now owns it) are healed at once, so no stored user turn follows an
    unanswered call. ``heal_now=False``: a sync removing what the other side
    deleted, whose merge in the same transaction heals afterwards (the other side
    may hold the call's result).
    """
    row = yield One("message_for_removal", (message_id,))
    if row is None:
        return False
    yield One("lock_buffer", (row[0],))  # waits for an append in progress, then reads again
    row = yield One("message_for_removal", (message_id,))
    if row is None:
        return False
    buffer_id, role, metadata = row
    counted = yield One("count", (buffer_id,))
    count: int = counted[0]
    owned: list[tuple[int, str]] = []
    if role == "assistant":
        for call_id in dict.fromkeys(declared_call_ids(json.loads(metadata))):
            first = yield One("declaring_message", (buffer_id, call_id))
            # Ids compare in one spelling: the caller may give another case.
            if first is not None and first[0].lower() == message_id.lower():
                owned.append((buffer_id, call_id))
    # The delete trigger keeps the tally.
    count -= yield Run("delete_message", (buffer_id, message_id))
    for owner in owned:
        count -= yield Run("delete_placeholder", owner)
    healed: list[str] = []
    if heal_now:
        yield from heal(buffer_id, None, 0, count, healed, before_users_only=True)
    if healed:
        yield from _settle_tally(buffer_id, count + len(healed))
    yield from edited(buffer_id)
    return True

"""Every kind of operation a user's call runs on one buffer, for the cost tests.

``tests/test_append_work.py`` runs each on a short and a long buffer of the same
shape (an agent's history: user, declaring turn, result, reply) and compares the
work the database did (SQLite's VM instructions; PostgreSQL's rows examined). A
kind is a function that prepares, untimed and unmeasured, what its operation
needs, and returns the operation itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from flowdrop_local import Store, engine
from flowdrop_local.buffer import Buffer
from flowdrop_local.plans import run_plan
from flowdrop_local.rules.pairing import placeholder_message

ADDRESS = ("global", "", "agent")
Operation = Callable[[], object]
_ids = itertools.count()


def agent_message(i: int) -> dict[str, Any]:
    """The ``i``-th message of an agent's history: a call declared and answered every four."""
    turn = i % 4
    text = f"message {i}: " + "the agent weighs the request and writes a reply " * 3
    if turn == 0:
        return {"role": "user", "content": text}
    if turn == 1:
        return {"role": "assistant", "content": "", "tool_calls": [{"id": f"h{i}"}]}
    if turn == 2:
        return {"role": "tool", "tool_call_id": f"h{i - 1}", "content": text}
    return {"role": "assistant", "content": text}


def fill(store: Store, size: int) -> Buffer:
    """The buffer at :data:`ADDRESS` with ``size`` messages of :func:`agent_message`,
    plus a few other buffers so no table holds one buffer only."""
    buffer = store.buffer(*ADDRESS)
    history = [agent_message(i) for i in range(size)]
    for start in range(0, size, 2000):
        buffer.append(history[start : start + 2000])
    for other in range(3):
        store.buffer("global", "", f"other{other}").append([agent_message(i) for i in range(40)])
    return buffer


def _new(prefix: str) -> str:
    return f"{prefix}{next(_ids)}"


def _declare(buffer: Buffer, *call_ids: str) -> None:
    buffer.append({"role": "assistant", "content": "", "tool_calls": [{"id": c} for c in call_ids]})


def plain_user(store: Store, buffer: Buffer) -> Operation:
    return lambda: buffer.append({"role": "user", "content": "a plain turn"})


def plain_reply(store: Store, buffer: Buffer) -> Operation:
    buffer.append({"role": "user", "content": "q"})
    return lambda: buffer.append({"role": "assistant", "content": "a plain reply"})


def declaring_turn(store: Store, buffer: Buffer) -> Operation:
    buffer.append({"role": "user", "content": "q"})
    call = _new("d")
    return lambda: _declare(buffer, call)


def tool_result(store: Store, buffer: Buffer) -> Operation:
    call = _new("r")
    _declare(buffer, call)
    return lambda: buffer.append({"role": "tool", "tool_call_id": call, "content": "result"})


def healing_user_turn(store: Store, buffer: Buffer) -> Operation:
    _declare(buffer, _new("u"), _new("u"), _new("u"))
    return lambda: buffer.append({"role": "user", "content": "heals three calls"})


def late_result(store: Store, buffer: Buffer) -> Operation:
    """MEM-10: the real result replaces the placeholder healing put in its place."""
    call = _new("l")
    _declare(buffer, call)
    buffer.append({"role": "user", "content": "heals it"})
    return lambda: buffer.append({"role": "tool", "tool_call_id": call, "content": "late"})


def duplicate_result(store: Store, buffer: Buffer) -> Operation:
    """MEM-1: a second result for an answered call is dropped."""
    call = _new("p")
    _declare(buffer, call)
    buffer.append({"role": "tool", "tool_call_id": call, "content": "first"})
    return lambda: buffer.append({"role": "tool", "tool_call_id": call, "content": "again"})


def repeated_declaration(store: Store, buffer: Buffer) -> Operation:
    """MEM-2: a turn declaring only known calls is dropped."""
    call = _new("k")
    _declare(buffer, call)
    buffer.append({"role": "tool", "tool_call_id": call, "content": "r"})
    return lambda: _declare(buffer, call)


def placeholder_placed_inside(store: Store, buffer: Buffer) -> Operation:
    """An imported placeholder goes into its turn's tool run, before the last row."""
    call = _new("i")
    _declare(buffer, call)
    buffer.append({"role": "assistant", "content": "meanwhile"})
    return lambda: buffer.append(placeholder_message(call))


def caller_id_retried(store: Store, buffer: Buffer) -> Operation:
    """An append retried with the id it was first given stores nothing twice."""
    message = {"role": "user", "content": "once", "id": engine.new_message_id()}
    buffer.append(message)
    return lambda: buffer.append(message)


def windowed_append(store: Store, buffer: Buffer) -> Operation:
    """A window at the buffer's length: each append evicts the oldest message."""
    windowed = store.buffer(*ADDRESS, window=len(buffer))
    return lambda: windowed.append({"role": "user", "content": "evicts one"})


def read_last(store: Store, buffer: Buffer) -> Operation:
    return lambda: buffer.read(limit=50)


def read_before(store: Store, buffer: Buffer) -> Operation:
    before = buffer.messages(limit=200)[0].id
    return lambda: buffer.read(limit=20, before=before)


def messages_before(store: Store, buffer: Buffer) -> Operation:
    """The viewer's paging: a page of full messages before a known one."""
    before = buffer.messages(limit=200)[0].id
    return lambda: buffer.messages(limit=20, before=before)


def count(store: Store, buffer: Buffer) -> Operation:
    return lambda: len(buffer)


def info(store: Store, buffer: Buffer) -> Operation:
    return buffer.info


def set_title(store: Store, buffer: Buffer) -> Operation:
    return lambda: buffer.set_title(_new("title "))


def update_metadata(store: Store, buffer: Buffer) -> Operation:
    """A merge of one key: reads the stored object, writes it back, then reads info."""
    return lambda: buffer.update_metadata({"tag": _new("v"), "gone": None})


def openai_chat_tail(store: Store, buffer: Buffer) -> Operation:
    """The last turns in the provider's shape (reads the head too, for a system prompt)."""
    return lambda: buffer.to_openai_chat(limit=10)


def pop_result(store: Store, buffer: Buffer) -> Operation:
    """Popping a result un-answers its call."""
    call = _new("o")
    _declare(buffer, call)
    buffer.append({"role": "tool", "tool_call_id": call, "content": "r"})
    return buffer.pop


def remove_answered_result(store: Store, buffer: Buffer) -> Operation:
    """An admin's delete of a result a user turn follows: the call is healed at once."""
    call = _new("x")
    _declare(buffer, call)
    result = buffer.append({"role": "tool", "tool_call_id": call, "content": "r"})
    buffer.append({"role": "user", "content": "after"})

    def remove() -> None:
        with store.backend.write() as tx:
            run_plan(engine.remove_message(result.message_ids[0]), tx)

    return remove


def remove_declaring_turn(store: Store, buffer: Buffer) -> Operation:
    """An admin's delete of the turn that declared a healed call: its placeholder goes too."""
    call = _new("t")
    turn = buffer.append(
        {"role": "assistant", "content": "", "tool_calls": [{"id": call}]}
    ).message_ids[0]
    buffer.append({"role": "user", "content": "heals it"})

    def remove() -> None:
        with store.backend.write() as tx:
            run_plan(engine.remove_message(turn), tx)

    return remove


def fork_early(store: Store, buffer: Buffer) -> Operation:
    """A fork near the start copies a few rows, whatever follows them."""
    at = buffer.messages()[9].id  # untimed preparation
    return lambda: buffer.fork(at=at, to=("global", "", _new("fork")))


def conversations_page(store: Store, buffer: Buffer) -> Operation:
    return lambda: store.conversations(limit=5)


KINDS: dict[str, Callable[[Store, Buffer], Operation]] = {
    f.__name__: f
    for f in (
        plain_user,
        plain_reply,
        declaring_turn,
        tool_result,
        healing_user_turn,
        late_result,
        duplicate_result,
        repeated_declaration,
        placeholder_placed_inside,
        caller_id_retried,
        windowed_append,
        read_last,
        read_before,
        messages_before,
        count,
        info,
        set_title,
        update_metadata,
        openai_chat_tail,
        pop_result,
        remove_answered_result,
        remove_declaring_turn,
        fork_early,
        conversations_page,
    )
}
"""Every kind, by name."""

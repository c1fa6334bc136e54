"""The OpenAI Agents SDK session, against the real SDK, offline.

Model calls go to the SDK's own scripted test model (``agents.testing.ScriptedModel``),
which records the input of every call, so the tests read what a provider would
have been sent. Where the protocol leaves room, the session is compared with the
SDK's ``SQLiteSession`` side by side.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled  # noqa: E402
from agents.memory import Session as SessionProtocol  # noqa: E402
from agents.memory import SessionSettings  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from flowdrop_local import InvalidAddress, Store, StoreClosed  # noqa: E402
from flowdrop_local.integrations.openai_agents import Session  # noqa: E402
from flowdrop_local.providers import (  # noqa: E402
    validate_anthropic,
    validate_openai_chat,
    validate_openai_responses,
)
from flowdrop_local.rules import PLACEHOLDER_CONTENT  # noqa: E402

set_tracing_disabled(True)
GUIDE = Path(__file__).parent.parent / "docs" / "frameworks.md"

USER = {"role": "user", "content": "delete a.txt"}
CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "delete_file",
    "arguments": '{"path":"a.txt"}',
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "deleted a.txt"}
ITEMS: list[dict[str, Any]] = [
    {"role": "developer", "content": "Be careful."},
    USER,
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "ok"}]},
    CALL,
    OUTPUT,
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Done.", "annotations": [], "logprobs": []}],
    },
    {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
]


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


@pytest.fixture
def session(target: str) -> Any:
    s = Session("conv-1", target)
    yield s
    s.close()


# ------------------------------------------------------------------ docs


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' "Use with the OpenAI Agents SDK" code runs as written, against a temp file."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text[text.index("## Use with the OpenAI Agents SDK") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    for _ in range(2):  # runs again in the same folder: each run is a new conversation
        exec(compile(match.group(1), "docs/frameworks.md", "exec"), namespace)
    assert (tmp_path / "chat.db").exists()
    validate_anthropic(namespace["payload"])
    with Store(tmp_path / "chat.db") as store:
        conversations = store.buffers()
        assert len(conversations) == 2 and all(ref.count == 4 for ref in conversations)


# -------------------------------------------------------------- the protocol


def test_implements_the_sdk_protocol(session: Session) -> None:
    """The SDK's Session protocol recognises it; settings default as SQLiteSession's."""
    assert isinstance(session, SessionProtocol)
    assert session.session_settings == SessionSettings()
    assert session.session_id == "conv-1"


def test_items_round_trip_exactly(session: Session) -> None:
    """Every item kind comes back as added, in order (developer, reasoning, fc_ ids)."""
    run(session.add_items(ITEMS))
    assert run(session.get_items()) == ITEMS
    assert [m["role"] for m in session.buffer.read()] == [
        "system",
        "user",
        "assistant",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]


def test_call_id_pairs_not_the_item_id(session: Session) -> None:
    """A function_call's call id is call_id: its output answers it, so a user item heals nothing."""
    run(session.add_items([USER, CALL, OUTPUT]))
    stored = session.buffer.read()
    assert stored[1]["metadata"]["tool_calls"][0]["tool_call_id"] == "call_1"
    result = session.buffer.append({"role": "user", "content": "next"})
    assert result.healed_ids == ()
    # An output naming the item id answers nothing: the call is still call_1's.
    run(session.add_items([{"type": "function_call_output", "call_id": "fc_1", "output": "x"}]))
    validate_openai_responses(session.buffer.to_openai_responses())
    assert [i.get("call_id") for i in session.buffer.to_openai_responses()][1:3] == [
        "call_1",
        "call_1",
    ]


def test_repeated_items_are_dropped_by_the_buffer_rules(session: Session) -> None:
    """MEM-2 drops a function_call stored again, MEM-1 a second output for its call."""
    run(session.add_items([USER, CALL, OUTPUT]))
    run(session.add_items([CALL, {**OUTPUT, "output": "again"}]))
    assert run(session.get_items()) == [USER, CALL, OUTPUT]


@pytest.mark.parametrize("bad_id", ["", "  ", "0", "-3"])
def test_an_unusable_session_id_is_refused(target: str, bad_id: str) -> None:
    """A session buffer needs a real identity (MEM-6, MEM-13); SQLiteSession would store these."""
    with pytest.raises(InvalidAddress):
        Session(bad_id, target)
    sqlite = SQLiteSession(bad_id)
    run(sqlite.add_items([USER]))
    assert run(sqlite.get_items()) == [USER]
    sqlite.close()


# ------------------------------------------------- like SQLiteSession does it


@pytest.mark.parametrize("limit", [None, 0, 1, 3, 7, 100, -1])
@pytest.mark.parametrize("settings_limit", [None, 2, 0])
def test_limits_read_as_sqlite_session_reads_them(
    target: str, limit: int | None, settings_limit: int | None
) -> None:
    """get_items(limit) gives what SQLiteSession gives: last N in order, 0 none, negative all."""
    settings = {"limit": settings_limit}
    ours = Session("conv-1", target, session_settings=settings)
    theirs = SQLiteSession("conv-1", session_settings=settings)
    try:
        for s in (ours, theirs):
            run(s.add_items(ITEMS))
        assert run(ours.get_items(limit)) == run(theirs.get_items(limit))
        assert ours.session_settings == theirs.session_settings
    finally:
        ours.close()
        theirs.close()


def test_pop_item_and_clear_as_sqlite_session(session: Session) -> None:
    """pop_item returns the latest item (None when empty); clear_session empties."""
    theirs = SQLiteSession("conv-1")
    try:
        for s in (session, theirs):
            run(s.add_items(ITEMS))
        for _ in range(3):
            assert run(session.pop_item()) == run(theirs.pop_item())
        assert run(session.get_items()) == run(theirs.get_items())
        for s in (session, theirs):
            run(s.clear_session())
            assert run(s.get_items()) == []
            assert run(s.pop_item()) is None
    finally:
        theirs.close()


def test_popping_a_result_unanswers_its_call(session: Session) -> None:
    """The ledger follows a pop: the next user item heals the call again."""
    run(session.add_items([USER, CALL, OUTPUT]))
    assert run(session.pop_item()) == OUTPUT
    run(session.add_items([{"role": "user", "content": "hm?"}]))
    items = run(session.get_items())
    assert items[2] == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": PLACEHOLDER_CONTENT,
    }


def test_several_sessions_share_one_file(target: str) -> None:
    """Sessions are isolated by id, in one file or one Store; clearing one leaves others."""
    a, b = Session("a", target), Session("b", target)
    with Store(target) as store:
        c = Session("c", store)
        run(a.add_items([USER]))
        run(b.add_items([OUTPUT | {"call_id": "other"}, USER]))
        run(c.add_items([CALL]))
        run(a.clear_session())
        assert run(a.get_items()) == []
        assert run(b.get_items())[-1] == USER
        assert run(c.get_items()) == [CALL]
        c.close()
        assert len(store.buffer("session", "b", "openai-agents")) == 2  # shared store left open
    a.close()
    b.close()


def test_closed_session_refuses_everything(session: Session) -> None:
    """After close() every call raises StoreClosed (a RuntimeError), empty input too."""
    session.close()
    session.close()  # idempotent
    for call in (
        session.get_items(),
        session.add_items([]),
        session.pop_item(),
        session.clear_session(),
    ):
        with pytest.raises(StoreClosed):
            run(call)
        assert issubclass(StoreClosed, RuntimeError)


# --------------------------------------------------- approval, healing, MEM-10


@function_tool(needs_approval=True)
def delete_file(path: str) -> str:
    """Delete a file (needs a human's approval)."""
    return f"deleted {path}"


def responses_pairs_adjacent(items: list[dict[str, Any]], call_id: str) -> bool:
    kinds = [(i.get("type"), i.get("call_id")) for i in items]
    at = kinds.index(("function_call", call_id))
    return kinds[at + 1] == ("function_call_output", call_id)


@pytest.mark.parametrize("write_ahead", [False, True])
def test_unapproved_call_is_healed_then_replaced_by_the_approved_output(
    session: Session, write_ahead: bool
) -> None:
    """A pending approval dangles, later runs send valid input, approval replaces the placeholder.
    The same with the write-ahead hooks wired (``hooks=session.hooks``).

    Run 2 (the user moves on) reads history before its user item is stored: the
    SDK leaves the dangling call out. From run 3 on, the call and its placeholder
    stand side by side. Resuming run 1 with the approval stores the real output
    in the placeholder's place: one output for call_1, the real one.
    """
    model = ScriptedModel(
        [
            [function_call("delete_file", {"path": "a.txt"}, call_id="call_1", item_id="fc_1")],
            [assistant_message("Fine, I won't.")],
            [assistant_message("Sure.")],
            [assistant_message("Deleted after all.")],
        ]
    )
    agent = Agent(name="files", model=model, tools=[delete_file])
    hooks = session.hooks if write_ahead else None
    first = run(Runner.run(agent, "delete a.txt", session=session, hooks=hooks))
    assert [i.raw_item.call_id for i in first.interruptions] == ["call_1"]  # type: ignore[union-attr]

    run(Runner.run(agent, "never mind", session=session, hooks=hooks))
    second_input = model.last_call.input
    validate_openai_responses(second_input)
    assert all(i.get("type") != "function_call" for i in second_input)

    run(Runner.run(agent, "something else", session=session, hooks=hooks))
    third_input = model.last_call.input
    validate_openai_responses(third_input)
    assert responses_pairs_adjacent(third_input, "call_1")
    assert third_input[2]["output"] == PLACEHOLDER_CONTENT

    state = first.to_state()
    state.approve(first.interruptions[0])
    resumed = run(Runner.run(agent, state, session=session, hooks=hooks))
    assert resumed.final_output == "Deleted after all."
    validate_openai_responses(model.last_call.input)

    items = run(session.get_items())
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert outputs == [
        {"call_id": "call_1", "output": "deleted a.txt", "type": "function_call_output"}
    ]
    assert responses_pairs_adjacent(items, "call_1")
    assert [m["metadata"].get("healed") for m in session.buffer.read()].count(True) == 0
    for export, validate in (
        (session.buffer.to_openai_chat, validate_openai_chat),
        (session.buffer.to_openai_responses, validate_openai_responses),
        (session.buffer.to_anthropic, validate_anthropic),
    ):
        validate(export())
    model.assert_complete()


def test_sqlite_session_leaves_the_output_far_from_its_call() -> None:
    """Peer behaviour: SQLiteSession appends the approved output at the end, after later turns."""
    model = ScriptedModel(
        [
            [function_call("delete_file", {"path": "a.txt"}, call_id="call_1", item_id="fc_1")],
            [assistant_message("Fine.")],
            [assistant_message("Deleted.")],
        ]
    )
    agent = Agent(name="files", model=model, tools=[delete_file])
    sqlite = SQLiteSession("peer")
    try:
        first = run(Runner.run(agent, "delete a.txt", session=sqlite))
        run(Runner.run(agent, "never mind", session=sqlite))
        state = first.to_state()
        state.approve(first.interruptions[0])
        run(Runner.run(agent, state, session=sqlite))
        items = run(sqlite.get_items())
        assert not responses_pairs_adjacent(items, "call_1")
    finally:
        sqlite.close()


# ------------------------------------------- placeholders, pops, limits (issue 10)


def test_a_placeholder_copied_to_another_session_stays_a_placeholder(target: str) -> None:
    """get_items() of a healed call, added to a second session, keeps the healed mark there:
    the real output arriving later replaces it (MEM-10) instead of being dropped (MEM-1)."""
    first, second = Session("a", target), Session("b", target)
    try:
        run(first.add_items([USER, CALL, {"role": "user", "content": "moving on"}]))
        copied = run(first.get_items())
        assert copied[2]["output"] == PLACEHOLDER_CONTENT
        run(second.add_items(copied))
        assert second.buffer.read()[2]["metadata"] == {"tool_call_id": "call_1", "healed": True}
        run(second.add_items([OUTPUT]))
        items = run(second.get_items())
        assert items[2] == OUTPUT and len(items) == 4
        validate_openai_responses(items)
    finally:
        first.close()
        second.close()


def test_the_placeholder_item_sends_no_extra_field(session: Session) -> None:
    """The item form of a placeholder holds type, call_id and output only (the API is strict)."""
    run(session.add_items([USER, CALL, {"role": "user", "content": "moving on"}]))
    placeholder = run(session.get_items())[2]
    assert placeholder == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": PLACEHOLDER_CONTENT,
    }


def test_pop_item_removes_only_the_item_it_returns(session: Session) -> None:
    """A message that maps to two items (text and a call, appended outside the session) loses
    only the call pop_item returns; the text stays (before: both went, only the call came back)."""
    session.buffer.append(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [{"id": "c1", "name": "f"}],
            },
        ]
    )
    before = run(session.get_items())
    assert len(before) == 3
    popped = run(session.pop_item())
    assert popped == before[-1] and popped["type"] == "function_call"
    assert run(session.get_items()) == before[:-1]


def test_pop_item_skips_entries_that_show_no_item(session: Session) -> None:
    """An empty assistant entry shows as no item: pop_item returns the item before it and
    removes that item (before: it removed the entry and returned None)."""
    session.buffer.append([{"role": "user", "content": "go"}, {"role": "assistant", "content": ""}])
    assert run(session.get_items()) == [{"role": "user", "content": "go"}]
    assert run(session.pop_item()) == {"role": "user", "content": "go"}
    assert run(session.get_items()) == []
    assert run(session.pop_item()) is None


def test_pop_item_with_nothing_to_show_removes_nothing(session: Session) -> None:
    """Only entries that show no item: pop_item returns None and the buffer keeps them."""
    session.buffer.append({"role": "assistant", "content": ""})
    assert run(session.pop_item()) is None
    assert len(session.buffer) == 1


@pytest.mark.parametrize("limit", [2**63, 10**40])
def test_get_items_with_a_limit_beyond_64_bits_gives_everything(
    session: Session, limit: int
) -> None:
    """get_items(2**63) reads every item (before: OverflowError)."""
    run(session.add_items([USER]))
    assert run(session.get_items(limit)) == run(session.get_items())


def test_a_file_session_runs_on_the_async_store_not_a_thread_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session on a file uses AsyncStore (one worker thread, calls in order): no
    asyncio.to_thread hop per call; a URL or a shared sync Store still hops (documented)."""
    import threading

    from flowdrop_local import AsyncStore
    from flowdrop_local.backends import sqlite as sqlite_backend

    def no_hop(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("asyncio.to_thread was called")

    seen: set[str] = set()
    real_write = sqlite_backend.SqliteBackend.write

    def write(self: Any, **kwargs: Any) -> Any:
        seen.add(threading.current_thread().name)
        return real_write(self, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", no_hop)
    monkeypatch.setattr(sqlite_backend.SqliteBackend, "write", write)
    session = Session("conv-1", tmp_path / "s.db")
    try:
        assert isinstance(session.store, AsyncStore)
        run(session.add_items([USER, CALL, OUTPUT]))
        assert run(session.get_items()) == [USER, CALL, OUTPUT]
        assert run(session.pop_item()) == OUTPUT
        run(session.clear_session())
        assert run(session.get_items()) == []
    finally:
        session.close()
    assert seen and all(name.startswith("flowdrop-async-store") for name in seen), seen
    with pytest.raises(StoreClosed):
        run(session.get_items())

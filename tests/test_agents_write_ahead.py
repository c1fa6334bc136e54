"""Crash-safe Agents SDK runs: the model's output is stored before its tools run.

A real child process runs an agent whose tool blocks and is killed with SIGKILL
while the tool runs; this process then opens the same file and carries on. Runs
that are not killed store every item exactly once, as the SDK's own
``SQLiteSession`` does without write-ahead.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import (  # noqa: E402
    Agent,
    ModelResponse,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
    SQLiteSession,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.lifecycle import RunHooksBase  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from flowdrop_local import Store  # noqa: E402
from flowdrop_local.integrations.openai_agents import Session, WriteAheadHooks  # noqa: E402
from flowdrop_local.providers import validate_openai_responses  # noqa: E402
from flowdrop_local.rules import PLACEHOLDER_CONTENT  # noqa: E402
from tests.workers.agent_script import first_turn  # noqa: E402

set_tracing_disabled(True)
ROOT = Path(__file__).parent.parent
MODES = ["run", "streamed"]


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def run_agent(mode: str, agent: Agent[Any], text: str, session: Any, **kwargs: Any) -> Any:
    """``Runner.run``, or ``Runner.run_streamed`` drained to its end."""
    if mode == "streamed":
        result = Runner.run_streamed(agent, text, session=session, **kwargs)
        async for _ in result.stream_events():
            pass
        return result
    return await Runner.run(agent, text, session=session, **kwargs)


def kinds(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(i.get("type", "message"), i.get("role"), i.get("call_id")) for i in items]


@function_tool
def lookup(query: str) -> str:
    """Look a word up."""
    return f"{query}: found"


# ------------------------------------------------------------------ docs


def test_readme_crash_safe_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' "Crash-safe runs" code runs as written: both wirings, each item once."""
    text = (ROOT / "docs" / "frameworks.md").read_text(encoding="utf-8")
    section = text[text.index("**Crash-safe runs.**") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), "docs/frameworks.md", "exec"), namespace)
    with Store(tmp_path / "chat.db") as store:
        (conversation,) = store.buffers()
        assert conversation.count == 6


# ------------------------------------------------------------ killed in the tool


def kill_during_the_tool(db: Path, mode: str) -> float:
    """Run tests.workers.agent_run on ``db``; SIGKILL it once its tool runs. Seconds waited."""
    ready = db.parent / "tool-started"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.agent_run", str(db), "s1", mode, str(ready)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    try:
        while not ready.exists():
            if child.poll() is not None:
                raise AssertionError(f"the child ended early: {child.stderr.read()}")  # type: ignore[union-attr]
            if time.monotonic() - started > 60:
                raise AssertionError("the tool never started")
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    return time.monotonic() - started


@pytest.mark.parametrize("mode", MODES)
def test_a_run_killed_in_its_tool_leaves_its_call_and_heals_at_the_next_turn(
    db_path: Path, mode: str
) -> None:
    """SIGKILL during the tool: the reasoning, message and call are stored (once each); the
    next user turn stands its placeholder right after the call; both later model inputs are
    valid Responses input (every function_call answered exactly once)."""
    kill_during_the_tool(db_path, mode)
    session = Session("s1", db_path)
    try:
        model = ScriptedModel(
            [[assistant_message("Sorry, it failed.")], [assistant_message("Ok.")]]
        )
        agent = Agent(name="a", model=model, tools=[lookup])
        stored = run(session.get_items())
        assert kinds(stored) == [
            ("message", "user", None),
            ("reasoning", None, None),
            ("message", "assistant", None),
            ("function_call", None, "call_1"),
        ]
        assert stored[3]["id"] == "fc_1" and stored[3]["arguments"] == '{"query":"x"}'

        run(run_agent(mode, agent, "never mind", session, hooks=session.hooks))
        validate_openai_responses(model.last_call.input)
        items = run(session.get_items())
        at = kinds(items).index(("function_call", None, "call_1"))
        assert items[at + 1] == {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": PLACEHOLDER_CONTENT,
        }
        assert kinds(items)[at + 2 :] == [
            ("message", "user", None),
            ("message", "assistant", None),
        ]

        run(run_agent(mode, agent, "and now?", session, hooks=session.hooks))
        sent = model.last_call.input
        validate_openai_responses(sent)
        assert ("function_call", None, "call_1") in kinds(sent)  # the call is sent, answered
        model.assert_complete()
    finally:
        session.close()


def test_without_the_hooks_a_killed_run_leaves_only_the_user_item(db_path: Path) -> None:
    """Peer behaviour (what issue 12 found): without the hooks the SDK stores the turn after
    its tools, so the killed run's call is lost and there is nothing to heal."""
    kill_during_the_tool(db_path, "bare")
    session = Session("s1", db_path)
    try:
        assert kinds(run(session.get_items())) == [("message", "user", None)]
    finally:
        session.close()


# ------------------------------------------------------------- nothing twice


def one_call_then(reply: str) -> ScriptedModel:
    """The model: one call of ``lookup`` (``call_1``), then ``reply``."""
    return ScriptedModel([first_turn(), [assistant_message(reply)]])


def script() -> list[list[Any]]:
    """Two tool turns whose messages are identical (same text, same item id), then a reply."""
    return [
        first_turn(),
        [
            assistant_message("Let me look."),
            function_call("lookup", {"query": "y"}, call_id="call_2"),
        ],
        [assistant_message("Done.")],
        [assistant_message("Done.")],
    ]


@pytest.mark.parametrize("mode", MODES)
def test_a_run_that_is_not_killed_stores_each_item_once(db_path: Path, mode: str) -> None:
    """With the hooks every item is stored once, in the order SQLiteSession (no write-ahead)
    stores it: a repeated identical reply, in one run and across runs, is kept."""
    during: list[list[Any]] = []
    session = Session("s1", db_path)
    theirs = SQLiteSession("peer")
    using: list[Any] = []

    @function_tool
    async def lookup(query: str) -> str:
        """Look a word up (records what is stored while it runs)."""
        during.append(await using[-1].get_items())
        return f"{query}: found"

    try:
        for s, hooks in ((session, session.hooks), (theirs, None)):
            using.append(s)
            agent = Agent(name="a", model=ScriptedModel(script()), tools=[lookup])
            run(run_agent(mode, agent, "look up x and y", s, hooks=hooks))
            run(run_agent(mode, agent, "thanks", s, hooks=hooks))
        ours = run(session.get_items())
        assert ours == run(theirs.get_items())
        assert [i.get("call_id") for i in ours].count("call_2") == 2  # call and output
        validate_openai_responses(ours)
        # Written ahead: each call was stored before its own tool ran.
        assert kinds(during[0])[-1] == ("function_call", None, "call_1")
        assert kinds(during[1])[-1] == ("function_call", None, "call_2")
        # SQLiteSession without write-ahead: only the user item while the tool runs.
        assert kinds(during[2]) == [("message", "user", None)]
    finally:
        session.close()
        theirs.close()


def test_reasoning_saved_without_its_id_is_still_recognised(db_path: Path) -> None:
    """reasoning_item_id_policy="omit": the SDK saves the reasoning item without its id; the
    written-ahead copy is matched by what it says, so it is not stored a second time."""
    session = Session("s1", db_path)
    try:
        agent = Agent(name="a", model=one_call_then("Ok"), tools=[lookup])
        config = RunConfig(reasoning_item_id_policy="omit")
        run(Runner.run(agent, "go", session=session, hooks=session.hooks, run_config=config))
        items = run(session.get_items())
        assert [i.get("type") for i in items].count("reasoning") == 1
    finally:
        session.close()


def test_hooks_write_nothing_for_a_run_without_the_session(db_path: Path) -> None:
    """session.hooks given to a run that uses another session (or none) store nothing here."""
    session = Session("s1", db_path)
    other = Session("s2", db_path)
    try:
        for used in (None, other):
            agent = Agent(name="a", model=one_call_then("k"), tools=[lookup])
            run(Runner.run(agent, "go", session=used, hooks=session.hooks))
        assert run(session.get_items()) == []
        assert len(run(other.get_items())) == 6
    finally:
        session.close()
        other.close()


def test_an_item_added_by_the_application_is_never_taken_for_a_written_ahead_one(
    db_path: Path,
) -> None:
    """add_items without a run context (the application's own call) stores every item, even
    one equal to an item a run wrote ahead."""
    session = Session("s1", db_path)
    try:
        agent = Agent(name="a", model=ScriptedModel([[assistant_message("Hi")]]))
        run(Runner.run(agent, "hello", session=session, hooks=session.hooks))
        reply = run(session.get_items())[-1]
        run(session.add_items([reply]))
        assert run(session.get_items())[-2:] == [reply, reply]
    finally:
        session.close()


# ---------------------------------------------------------- the application's hooks


EVENTS = sorted(name for name in vars(RunHooksBase) if name.startswith("on_"))


class Recording(RunHooks[Any]):
    """Application hooks that note each event they receive."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name in EVENTS:

            async def record(*args: Any) -> None:
                self.events.append(name)

            return record
        return super().__getattribute__(name)


def test_hooks_with_passes_every_event_to_the_application_hooks() -> None:
    """Each RunHooks event of the installed SDK reaches the application's hooks (a later SDK
    event that is not passed on fails here)."""
    app = Recording()
    session = Session("s1")
    hooks = session.hooks_with(app)
    try:
        for name in EVENTS:
            params = list(inspect.signature(getattr(RunHooksBase, name)).parameters)[1:]
            args: list[Any] = [None] * len(params)
            args[0] = RunContextWrapper(context=None)
            if name == "on_llm_end":
                args[2] = ModelResponse(output=[], usage=Usage(), response_id=None)
            run(getattr(hooks, name)(*args))
        assert app.events == EVENTS
        assert isinstance(hooks, WriteAheadHooks)
    finally:
        session.close()


def test_hooks_with_calls_the_application_first_then_writes_ahead(db_path: Path) -> None:
    """The application's on_llm_end runs before the write-ahead (it sees the call not yet
    stored); the tool sees it stored; every item is stored once."""
    session = Session("s1", db_path)
    stored_at: dict[str, int] = {}

    class App(RunHooks[Any]):
        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            stored_at.setdefault("llm_end", len(await session.get_items()))

        async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
            stored_at["tool_start"] = len(await session.get_items())

    try:
        agent = Agent(name="a", model=one_call_then("Ok"), tools=[lookup])
        run(Runner.run(agent, "go", session=session, hooks=session.hooks_with(App())))
        assert stored_at == {"llm_end": 1, "tool_start": 4}
        assert len(run(session.get_items())) == 6
    finally:
        session.close()

"""The Pydantic AI integration, against the real package, offline (FunctionModel).

A real child process is killed with SIGKILL inside a tool to show what
``Persist`` leaves stored; everything else runs in this process on real files.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    INTERRUPTED_TOOL_RETURN_CONTENT,
    BinaryContent,
    CompactionPart,
    FilePart,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
    RetryFeedbackPart,
    RetryInfo,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
    repair_messages,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from flowdrop_local import Buffer, Store
from flowdrop_local.integrations.pydantic_ai import (
    Persist,
    aload,
    asave,
    load,
    save,
)
from flowdrop_local.rules import PLACEHOLDER_CONTENT

ROOT = Path(__file__).parent.parent
T0 = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def dumped(messages: list[ModelMessage]) -> list[Any]:
    """Pydantic AI's own serialised form: what "lossless" is measured against."""
    result: list[Any] = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    return result


class Script:
    """A FunctionModel body: a prompt "look up ..." gets a call of ``lookup``, another prompt
    "ok: <prompt>", a request without a prompt (tool results) "Found it.". Keeps its inputs."""

    def __init__(self) -> None:
        self.sent: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.sent.append(list(messages))
        last = messages[-1].parts
        prompt = " ".join(str(p.content) for p in last if isinstance(p, UserPromptPart))
        if not prompt:
            return ModelResponse(parts=[TextPart("Found it.")])
        if prompt.startswith("look up"):
            call = ToolCallPart("lookup", {"query": prompt[8:]}, tool_call_id=f"c{len(self.sent)}")
            return ModelResponse(parts=[TextPart("Let me look."), call])
        return ModelResponse(parts=[TextPart(f"ok: {prompt}")])


def new_agent(script: Script) -> Agent[None, str]:
    agent = Agent(FunctionModel(script), system_prompt="Be brief.")

    @agent.tool_plain
    def lookup(query: str) -> str:
        """Look a word up."""
        return f"{query}: found"

    return agent


@pytest.fixture
def buf(db_path: Path) -> Any:
    with Store(db_path) as store:
        yield store.buffer("session", "s1", "pydantic-ai")


def roles(buffer: Buffer) -> list[str]:
    return [m["role"] for m in buffer.read()]


# ------------------------------------------------------------------ docs


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' "Use with Pydantic AI" code runs as written, against a temp file."""
    text = (ROOT / "docs" / "frameworks.md").read_text(encoding="utf-8")
    section = text[text.index("## Use with Pydantic AI") :]
    blocks = re.findall(r"```python\n(.*?)```", section.split("\n## ")[0], re.DOTALL)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    for block in blocks:
        exec(compile(block, "docs/frameworks.md", "exec"), namespace)
    with Store(tmp_path / "chat.db") as store:
        assert sorted(ref.count for ref in store.buffers()) == [4, 8]


# ------------------------------------------------------------- conversations


def test_a_multi_turn_conversation_with_tools_survives_a_reopen(db_path: Path) -> None:
    """Three turns saved with save(result.new_messages()), the file reopened: load gives the
    history Pydantic AI handed back, and the next run takes it and sends all of it."""
    script = Script()
    agent = new_agent(script)
    history: list[ModelMessage] = []
    for prompt in ("hi", "look up x", "thanks"):
        with Store(db_path) as store:
            buffer = store.buffer("session", "s1", "pydantic-ai")
            assert dumped(load(buffer)) == dumped(history)
            result = agent.run_sync(prompt, message_history=load(buffer))
            save(buffer, result.new_messages())
            history = result.all_messages()
    with Store(db_path) as store:
        buffer = store.buffer("session", "s1", "pydantic-ai")
        assert roles(buffer) == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
        ]
        loaded = load(buffer)
        assert dumped(loaded) == dumped(history)
        result = agent.run_sync("bye", message_history=loaded)
        assert result.output == "ok: bye"
        assert dumped(script.sent[-1][:-1]) == dumped(history)


def test_saving_again_stores_nothing_but_an_identical_new_turn_is_kept(buf: Buffer) -> None:
    """save(all_messages()) twice adds nothing; the same prompt and reply in a second run are
    new messages (their timestamps differ) and are stored."""
    agent = new_agent(Script())
    first = agent.run_sync("hi")
    assert save(buf, first.all_messages()).appended == 3
    assert save(buf, first.all_messages()).appended == 0
    assert save(buf, first.new_messages()).appended == 0
    second = agent.run_sync("hi", message_history=load(buf))
    assert save(buf, second.all_messages()).appended == 2
    assert save(buf, second.all_messages()).appended == 0
    assert [m["content"] for m in buf.read()] == ["Be brief.", "hi", "ok: hi", "hi", "ok: hi"]


# ------------------------------------------------------------------- parts


def request(*parts: Any) -> ModelRequest:
    return ModelRequest(parts=list(parts), timestamp=T0)


def response(*parts: Any) -> ModelResponse:
    return ModelResponse(parts=list(parts), timestamp=T0, model_name="m")


def legacy_retry(*args: Any, **kwargs: Any) -> RetryPromptPart:
    """A ``RetryPromptPart`` (deprecated in Pydantic AI 2; still accepted and stored)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RetryPromptPart(*args, **kwargs)


CALL = ToolCallPart("lookup", {"query": "x"}, tool_call_id="c1")
USER = UserPromptPart("hi", timestamp=T0)

# (name, history, stored roles, stored content of the part under test)
PARTS: list[tuple[str, list[ModelMessage], list[str], Any]] = [
    (
        "system",
        [request(SystemPromptPart("Be brief.", timestamp=T0), USER)],
        ["system", "user"],
        "Be brief.",
    ),
    ("user text", [request(USER)], ["user"], "hi"),
    (
        "user parts",
        [
            request(
                UserPromptPart(
                    [
                        "see",
                        ImageUrl("https://x.test/a.png"),
                        BinaryContent(b"\x00", media_type="image/png"),
                    ],
                    timestamp=T0,
                )
            )
        ],
        ["user"],
        [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
            {"type": "binary"},
        ],
    ),
    ("text", [request(USER), response(TextPart("Hello."))], ["user", "assistant"], "Hello."),
    (
        "thinking",
        [request(USER), response(ThinkingPart("hmm", signature="s"), TextPart("Hello."))],
        ["user", "assistant"],
        [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Hello."},
        ],
    ),
    (
        "call and return",
        [
            request(USER),
            response(CALL, ToolCallPart("lookup", '{"query":"y"}', tool_call_id="c2")),
            request(
                ToolReturnPart("lookup", {"found": True}, tool_call_id="c1", timestamp=T0),
                ToolReturnPart("lookup", "y: found", tool_call_id="c2", timestamp=T0),
            ),
        ],
        ["user", "assistant", "tool", "tool"],
        "y: found",
    ),
    (
        "tool retry",
        [
            request(USER),
            response(CALL),
            request(legacy_retry("bad query", tool_name="lookup", tool_call_id="c1", timestamp=T0)),
        ],
        ["user", "assistant", "tool"],
        None,
    ),
    (
        "validation retry",
        [
            request(USER),
            response(TextPart("x")),
            request(legacy_retry("not a number", timestamp=T0)),
        ],
        ["user", "assistant", "user"],
        None,
    ),
    (
        "tool retried",
        [
            request(USER),
            response(CALL),
            request(
                ToolReturnPart(
                    "lookup", "bad query", tool_call_id="c1", outcome="retried", timestamp=T0
                )
            ),
        ],
        ["user", "assistant", "tool"],
        None,
    ),
    (
        "retry feedback",
        [
            request(USER),
            response(TextPart("x")),
            request(
                RetryFeedbackPart(
                    "not a number", retry=RetryInfo(cause="validation_error"), timestamp=T0
                )
            ),
        ],
        ["user", "assistant", "user"],
        None,
    ),
    (
        "file and native tools",
        [
            request(USER),
            response(
                NativeToolCallPart("web_search", {"q": "x"}, tool_call_id="n1"),
                NativeToolReturnPart("web_search", {"hits": 1}, tool_call_id="n1", timestamp=T0),
                FilePart(BinaryContent(b"\x89PNG", media_type="image/png")),
                TextPart("Here."),
            ),
        ],
        ["user", "assistant"],
        "Here.",
    ),
    (
        "compaction in a request",
        [
            request(USER),
            response(TextPart("k")),
            request(CompactionPart(content="summary"), UserPromptPart("go on", timestamp=T0)),
        ],
        ["user", "assistant", "assistant", "user"],
        "",
    ),
]


@pytest.mark.parametrize(
    ("history", "stored", "content"), [p[1:] for p in PARTS], ids=[p[0] for p in PARTS]
)
def test_every_part_round_trips(
    buf: Buffer, history: list[ModelMessage], stored: list[str], content: Any
) -> None:
    """load gives back what was saved exactly as Pydantic AI's own serialisation does; each part
    is stored as the buffer message the table names (parts with no equivalent ride along)."""
    save(buf, history)
    assert dumped(load(buf)) == dumped(ModelMessagesTypeAdapter.validate_python(dumped(history)))
    assert roles(buf) == stored
    if content is not None:
        assert content in [m["content"] for m in buf.read()]
    assert save(buf, load(buf)).appended == 0


def test_calls_and_results_pair_in_the_ledger(buf: Buffer) -> None:
    """Tool calls are declared calls and returns answer them: a user turn heals nothing."""
    save(buf, next(p[1] for p in PARTS if p[0] == "call and return"))
    assert buf.append({"role": "user", "content": "next"}).healed_ids == ()
    assert buf.read()[1]["metadata"]["tool_calls"] == [
        {"tool_call_id": "c1", "name": "lookup", "arguments": '{"query":"x"}'},
        {"tool_call_id": "c2", "name": "lookup", "arguments": '{"query":"y"}'},
    ]


def test_native_tool_calls_are_not_declared_calls(buf: Buffer) -> None:
    """A provider-run (native) tool call is never healed: the provider answers it itself."""
    save(buf, next(p[1] for p in PARTS if p[0] == "file and native tools"))
    assert buf.append({"role": "user", "content": "next"}).healed_ids == ()


# ------------------------------------------------------------ placeholders


def test_a_user_prompt_after_an_unanswered_call_heals_it_and_load_gives_pydantic_ais_return(
    buf: Buffer,
) -> None:
    """The next user prompt heals the call (MEM-3); load gives the placeholder as the return
    Pydantic AI synthesises itself, and saving that history again adds nothing."""
    save(buf, [request(USER), response(CALL)])
    result = save(buf, [request(UserPromptPart("next", timestamp=T0))])
    assert len(result.healed_ids) == 1
    loaded = load(buf)
    assert dumped(loaded) == dumped(
        repair_messages(
            [request(USER), response(CALL), request(UserPromptPart("next", timestamp=T0))]
        )
    )
    ret = loaded[2].parts[0]
    assert isinstance(ret, ToolReturnPart) and ret.content == INTERRUPTED_TOOL_RETURN_CONTENT
    assert ret.tool_call_id == "c1" and ret.outcome == "interrupted"
    assert save(buf, loaded).appended == 0
    agent = new_agent(Script())
    assert agent.run_sync(message_history=loaded).output == "ok: next"


@pytest.mark.parametrize(
    "placeholder",
    [
        pytest.param(lambda history: repair_messages(history)[-1].parts[0], id="pydantic-ai's own"),
        pytest.param(
            lambda history: ToolReturnPart("lookup", PLACEHOLDER_CONTENT, tool_call_id="c1"),
            id="flowdrop's text",
        ),
    ],
)
def test_a_synthesised_return_is_stored_as_a_placeholder_and_a_real_result_replaces_it(
    buf: Buffer, placeholder: Any
) -> None:
    """Pydantic AI's return for an interrupted call (or flowdrop's placeholder text) is stored as
    a healed placeholder, and a real result later replaces it in place (MEM-10)."""
    history = [request(USER), response(CALL)]
    save(buf, [*history, request(placeholder(history))])
    assert buf.read()[2]["metadata"] == {"tool_call_id": "c1", "healed": True}
    real = ToolReturnPart("lookup", "x: found", tool_call_id="c1", timestamp=T0)
    result = save(buf, [request(real)])
    assert len(result.replaced_ids) == 1
    assert roles(buf) == ["user", "assistant", "tool"]
    assert load(buf)[2].parts == [real]


# ------------------------------------------------------ persistence in the run


def run_killed_in_the_tool(db: Path, mode: str) -> None:
    """Run tests.workers.pydantic_run on ``db``; SIGKILL it once its tool runs."""
    ready = db.parent / "tool-started"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.pydantic_run", str(db), str(ready), mode],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    try:
        while not ready.exists():
            if child.poll() is not None:
                raise AssertionError(f"the child ended early: {child.stderr.read()}")  # type: ignore[union-attr]
            assert time.monotonic() - started < 60, "the tool never started"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL


def test_a_run_killed_in_its_tool_leaves_its_call_and_the_next_runs_succeed(db_path: Path) -> None:
    """With Persist the killed run's call is stored; the next prompt (over Pydantic AI's own
    repair) stores a placeholder right after it, and that run and the one after succeed."""
    run_killed_in_the_tool(db_path, "persist")
    script = Script()
    agent = new_agent(script)
    with Store(db_path) as store:
        buffer = store.buffer("session", "s1", "pydantic-ai")
        assert roles(buffer) == ["user", "assistant"]
        assert buffer.read()[1]["metadata"]["tool_calls"][0]["tool_call_id"] == "c1"
        history = load(buffer)
        result = agent.run_sync(
            "never mind", message_history=repair_messages(history), capabilities=[Persist(buffer)]
        )
        assert result.output == "ok: never mind"
        stored = buffer.read()
        assert [m["role"] for m in stored] == ["user", "assistant", "tool", "user", "assistant"]
        assert stored[2]["metadata"] == {"tool_call_id": "c1", "healed": True}
        result = agent.run_sync(
            "and now?", message_history=load(buffer), capabilities=[Persist(buffer)]
        )
        assert result.output == "ok: and now?"
        sent = script.sent[-1]
        returns = [p for m in sent for p in m.parts if isinstance(p, ToolReturnPart)]
        assert [(r.tool_call_id, r.content) for r in returns] == [
            ("c1", INTERRUPTED_TOOL_RETURN_CONTENT)
        ]
        assert save(buffer, result.all_messages()).appended == 0


def test_without_persist_a_killed_run_leaves_nothing(db_path: Path) -> None:
    """Peer behaviour: save(result.new_messages()) after the run never runs when the process is
    killed in the tool, so not even the user's prompt is stored."""
    run_killed_in_the_tool(db_path, "bare")
    with Store(db_path) as store:
        assert roles(store.buffer("session", "s1", "pydantic-ai")) == []


def test_persist_stores_the_call_before_the_tool_runs(buf: Buffer) -> None:
    """While the tool runs, the run's prompt and the model's call are already stored; after the
    run save(result.all_messages()) finds nothing new."""
    seen: list[list[str]] = []
    agent = Agent(FunctionModel(Script()))

    @agent.tool_plain
    def lookup(query: str) -> str:
        """Look a word up (notes what is stored)."""
        seen.append(roles(buf))
        return "found"

    result = agent.run_sync("look up x", capabilities=[Persist(buf)])
    assert seen == [["user", "assistant"]]
    assert roles(buf) == ["user", "assistant", "tool", "assistant"]
    assert save(buf, result.all_messages()).appended == 0


# -------------------------------------------------------------------- async


def test_the_async_variant_inside_async_agent_code(buf: Buffer) -> None:
    """aload/asave and Persist inside ``async`` code with ``await agent.run``."""
    agent = new_agent(Script())

    async def chat() -> list[str]:
        outputs = []
        for prompt in ("hi", "look up y"):
            result = await agent.run(
                prompt, message_history=await aload(buf), capabilities=[Persist(buf)]
            )
            assert (await asave(buf, result.all_messages())).appended == 0
            outputs.append(result.output)
        return outputs

    assert asyncio.run(chat()) == ["ok: hi", "Found it."]
    assert roles(buf) == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]


def test_the_async_variant_on_an_async_buffer(tmp_path: Path) -> None:
    """aload/asave and Persist take an AsyncBuffer and await it (no thread hop): the
    same conversation as with a sync Buffer, stored once."""
    from flowdrop_local import AsyncStore

    agent = new_agent(Script())

    async def chat() -> list[str]:
        async with AsyncStore(tmp_path / "a.db") as store:
            abuf = store.buffer("session", "s1", "chat")
            outputs = []
            for prompt in ("hi", "look up y"):
                result = await agent.run(
                    prompt, message_history=await aload(abuf), capabilities=[Persist(abuf)]
                )
                assert (await asave(abuf, result.all_messages())).appended == 0
                outputs.append(result.output)
            return outputs

    assert asyncio.run(chat()) == ["ok: hi", "Found it."]
    with Store(tmp_path / "a.db") as store:
        assert roles(store.buffer("session", "s1", "chat")) == [
            "system", "user", "assistant", "user", "assistant", "tool", "assistant"
        ]

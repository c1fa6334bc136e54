"""Property tests: random append sequences against a list-based model of the rules.

After every append the stored buffer must equal what the model says, and after
every user append the healing invariants must hold. The file is reopened at the
end and must read the same.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import Store
from flowdrop_local.positions import is_valid_key
from flowdrop_local.rules import PLACEHOLDER_CONTENT

CALL_IDS = ["c1", "c2", "c3", "c4", "0"]


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    """One message in the stored shape (tool data under metadata)."""
    kind = draw(
        st.sampled_from(["user", "assistant", "calls", "tool", "orphan", "system", "forged"])
    )
    text = draw(st.sampled_from(["", "hi", "ok", "ünïcode ✓"]))
    if kind == "calls":
        ids = draw(st.lists(st.sampled_from(CALL_IDS), min_size=1, max_size=3))
        spelling = draw(st.sampled_from(["tool_call_id", "id"]))
        calls = [{spelling: i, "name": "f"} for i in ids]
        return {"role": "assistant", "content": text, "metadata": {"tool_calls": calls}}
    if kind == "tool":
        call_id = draw(st.sampled_from(CALL_IDS))
        return {"role": "tool", "content": f"result {text}", "metadata": {"tool_call_id": call_id}}
    if kind == "orphan":  # a tool message without an id: stored, never deduplicated
        return {"role": "tool", "content": text, "metadata": {}}
    if kind == "forged":  # an incoming placeholder (an import of one)
        call_id = draw(st.sampled_from(CALL_IDS))
        return {
            "role": "tool",
            "content": PLACEHOLDER_CONTENT,
            "metadata": {"tool_call_id": call_id, "healed": True},
        }
    role = "assistant" if kind == "assistant" else kind
    return {"role": role, "content": text, "metadata": {}}


def _declared(message: dict[str, Any]) -> list[str]:
    calls = message["metadata"].get("tool_calls") or []
    return [c.get("tool_call_id", c.get("id")) for c in calls]


class Model:
    """The buffer rules over a plain list, written from the rules' text."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def _result_for(self, call_id: str) -> int | None:
        for i, m in enumerate(self.items):
            if m["role"] == "tool" and m["metadata"].get("tool_call_id") == call_id:
                return i
        return None

    def _declared_ids(self) -> set[str]:
        return {i for m in self.items if m["role"] == "assistant" for i in _declared(m)}

    def append(self, message: dict[str, Any]) -> None:
        message = copy.deepcopy(message)
        role, metadata = message["role"], message["metadata"]
        if role == "user":
            self.heal()
        elif role == "tool" and "tool_call_id" in metadata:
            found = self._result_for(metadata["tool_call_id"])
            if found is not None:
                if (
                    self.items[found]["metadata"].get("healed") is True
                    and metadata.get("healed") is not True
                ):
                    self.items[found] = message  # MEM-10
                return  # MEM-1
            if metadata.get("healed") is True:
                # An incoming placeholder goes into the tool run of the first turn
                # declaring its call: at the end while the list ends in that run,
                # else right after the turn.
                for i, m in enumerate(self.items):
                    if m["role"] == "assistant" and metadata["tool_call_id"] in _declared(m):
                        if all(later["role"] == "tool" for later in self.items[i + 1 :]):
                            self.items.append(message)
                        else:
                            self.items.insert(i + 1, message)
                        return
                return
        elif (
            role == "assistant"
            and _declared(message)
            and set(_declared(message)) <= self._declared_ids()
        ):
            return  # MEM-2
        self.items.append(message)

    def evict(self, window: int) -> None:
        """Drop the oldest past the window, then leading tool messages, then heal before users."""
        excess = len(self.items) - window
        if excess <= 0:
            return
        del self.items[:excess]
        while self.items and self.items[0]["role"] == "tool":
            del self.items[0]
        users = [i for i, m in enumerate(self.items) if m["role"] == "user"]
        self.heal(before=users[-1] if users else 0)

    def heal(self, before: int | None = None) -> None:
        """Heal as MEM-3 does; with ``before``, only turns placed before that index."""
        seen: set[str] = set()
        index = 0
        while index < len(self.items):
            turn = self.items[index]
            placeholders = []
            if turn["role"] == "assistant" and (before is None or index < before):
                for call_id in _declared(turn):
                    if call_id in seen:
                        continue
                    seen.add(call_id)
                    if self._result_for(call_id) is None:
                        placeholders.append(
                            {
                                "role": "tool",
                                "content": PLACEHOLDER_CONTENT,
                                "metadata": {"tool_call_id": call_id, "healed": True},
                            }
                        )
            self.items[index + 1 : index + 1] = placeholders
            index += 1 + len(placeholders)
            if before is not None and placeholders:
                before += len(placeholders)


def check_healed(history: list[dict[str, Any]]) -> None:
    """No declared call is unanswered, and every placeholder is in its turn's tool run."""
    owner: dict[str, int] = {}
    for i, m in enumerate(history):
        if m["role"] == "assistant":
            for call_id in _declared(m):
                owner.setdefault(call_id, i)
    results = {
        m["metadata"]["tool_call_id"]: i
        for i, m in enumerate(history)
        if m["role"] == "tool" and "tool_call_id" in m["metadata"]
    }
    assert set(owner) <= set(results), "a declared call has no result after a user append"
    for call_id, where in results.items():
        if history[where]["metadata"].get("healed") is True and call_id in owner:
            turn = owner[call_id]
            assert where > turn
            assert all(m["role"] == "tool" for m in history[turn + 1 : where + 1]), (
                "a placeholder is not in the run of tool messages after its declaring turn"
            )


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], tuple[str, str]]:
    """A database and a buffer key no example used before, on each backend.

    SQLite: a new file per example. PostgreSQL: one schema for the test, and a new
    buffer key per example (a schema per example would cost more than the example).
    """
    if request.param == "sqlite":
        return lambda: (str(tmp_path_factory.mktemp("example") / "p.db"), "k")
    url: str = request.getfixturevalue("postgresql_url")
    return lambda: (url, uuid.uuid4().hex)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(st.tuples(st.lists(messages(), min_size=1, max_size=4), st.booleans()), max_size=14)
)
def test_random_sequences_match_the_model(
    fresh: Callable[[], tuple[str, str]], steps: list[tuple[list[dict[str, Any]], bool]]
) -> None:
    """Random batches and single appends give the model's buffer; healing invariants hold."""
    model = Model()
    path, key = fresh()
    with Store(path) as store:
        buffer = store.buffer("session", "s", key)
        for batch, as_batch in steps:
            if as_batch:
                result = buffer.append(batch)
            else:
                for message in batch:
                    result = buffer.append(message)
            for message in batch:
                model.append(message)
            history = buffer.read()
            assert history == model.items
            assert result.count == len(history) == len(buffer)
            if any(m["role"] == "user" for m in batch):
                last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
                check_healed(history[: last_user + 1])
            stored = buffer.messages()
            positions = [m.position for m in stored]
            assert positions == sorted(positions) and len(set(positions)) == len(positions)
            assert all(is_valid_key(p) for p in positions)
        final = buffer.read()
    with Store(path) as reopened:
        assert reopened.buffer("session", "s", key).read() == final


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(messages(), max_size=20))
def test_a_result_appended_right_after_its_call_stays_in_its_tool_run(
    fresh: Callable[[], tuple[str, str]], sequence: list[dict[str, Any]]
) -> None:
    """Results appended straight after their call, then a user turn: all stay adjacent."""
    path, key = fresh()
    with Store(path) as store:
        buffer = store.buffer("session", "s", key)
        for message in sequence:
            buffer.append(message)
        buffer.append(
            [
                {
                    "role": "assistant",
                    "content": "",
                    "metadata": {"tool_calls": [{"id": "n1"}, {"id": "n2"}, {"id": "n3"}]},
                },
                {"role": "tool", "content": "r2", "metadata": {"tool_call_id": "n2"}},
                {"role": "user", "content": "next"},
            ]
        )
        history = buffer.read()
        check_healed(history)
        turn = next(
            i
            for i, m in enumerate(history)
            if any(c.get("id") == "n1" for c in m["metadata"].get("tool_calls", []))
        )
        run = history[turn + 1 : turn + 4]
        assert {m["metadata"]["tool_call_id"] for m in run} == {"n1", "n2", "n3"}
        assert [m["metadata"].get("healed", False) for m in run] == [True, True, False]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.sampled_from([2, 3, 5]),
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.lists(messages(), min_size=1, max_size=4)),
            st.tuples(st.just("pop"), st.just([])),
        ),
        max_size=16,
    ),
)
def test_windows_and_pops_match_the_model(
    fresh: Callable[[], tuple[str, str]],
    window: int,
    steps: list[tuple[str, list[dict[str, Any]]]],
) -> None:
    """A windowed buffer evicts, pops and heals like the model; the checker stays clean."""
    model = Model()
    path, key = fresh()
    with Store(path) as store:
        buffer = store.buffer("session", "s", key, window=window)
        for action, batch in steps:
            if action == "pop":
                popped = buffer.pop()
                assert popped == (model.items.pop() if model.items else None)
            else:
                result = buffer.append(batch)
                for message in batch:
                    model.append(message)
                model.evict(window)
                assert result.count == len(model.items)
            assert buffer.read() == model.items
            assert store.check() == []

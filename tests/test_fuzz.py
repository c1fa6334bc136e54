"""Bad-input fuzzing: arbitrary JSON-like values thrown at append.

The only exceptions allowed are the library's typed errors, and a rejected append
changes no table. An accepted one leaves a file that passes the checker.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import FlowdropError, InvalidMessage, Store

from .conftest import snapshot

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(
        alphabet=st.characters(codec=None, exclude_categories=()), max_size=30
    ),  # NUL, lone surrogates
    st.sampled_from(
        ["", " ", "\x00", "\ud800", "c1", "0", "tool_use", "user", "assistant", "tool"]
    ),
    st.binary(max_size=8),
)
json_like = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(
            st.one_of(
                st.text(max_size=8), st.integers(), st.sampled_from(["type", "id", "tool_call_id"])
            ),
            children,
            max_size=4,
        ),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=20,
)
FIELDS = ["role", "content", "metadata", "tool_calls", "tool_call_id", "name", "id"]
messages = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), json_like, max_size=6),
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool", "system", "robot", None])},
        optional={
            "content": json_like,
            "metadata": json_like,
            "tool_calls": st.lists(
                st.dictionaries(
                    st.sampled_from(["id", "tool_call_id", "name", "function"]),
                    json_like,
                    max_size=3,
                ),
                max_size=3,
            ),
            "tool_call_id": json_like,
        },
    ),
    json_like,
)
appends = st.one_of(messages, st.lists(messages, max_size=6))


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "fuzz.db"


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(appends)
def test_fuzzed_appends_raise_only_typed_errors_and_change_nothing_when_refused(
    fuzz_db: Path, value: Any
) -> None:
    """Any value: either appended (and the file stays sound) or a FlowdropError with no change."""
    with Store(fuzz_db) as store:
        buffer = store.buffer("session", "fuzz", "chat")
        before = snapshot(fuzz_db)
        try:
            buffer.append(value)
        except FlowdropError:
            assert snapshot(fuzz_db) == before
        else:
            assert store.check() == []


def test_an_enormous_batch_with_one_bad_message_writes_nothing(tmp_path: Path) -> None:
    """20,000 good messages, one bad at the end: the error names index 20000, no row lands."""
    path = tmp_path / "big.db"
    with Store(path) as store:
        buffer = store.buffer("s", "", "k")
        batch: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(20_000)]
        batch.append({"role": "user", "content": "x", "metadata": {"n": math.inf}})
        before = snapshot(path)
        with pytest.raises(InvalidMessage) as caught:
            buffer.append(batch)
        assert (caught.value.index, caught.value.field) == (20_000, "metadata.n")
        assert snapshot(path) == before


def test_huge_and_strange_text_round_trips(tmp_path: Path) -> None:
    """A 10 MB string, NUL bytes and astral characters are stored and read back exactly."""
    with Store(tmp_path / "text.db") as store:
        buffer = store.buffer("s", "", "k")
        texts = [
            "x" * 10_000_000,
            "nul\x00inside",
            "emoji \U0001f600 and \u202e",
            '{"json": "lookalike"}',
        ]
        buffer.append([{"role": "user", "content": t, "metadata": {"t": t[:100]}} for t in texts])
        assert [m["content"] for m in buffer.read()] == texts


def test_nesting_ten_thousand_deep_is_refused_not_a_crash(tmp_path: Path) -> None:
    """Metadata nested 10,000 levels deep gives InvalidMessage, never a RecursionError."""
    deep: Any = "leaf"
    for _ in range(10_000):
        deep = {"d": deep}
    with Store(tmp_path / "deep.db") as store, pytest.raises(InvalidMessage, match="nested deeper"):
        store.buffer("s", "", "k").append({"role": "user", "content": "x", "metadata": deep})

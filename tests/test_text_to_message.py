"""MEM-16 text-to-message: the spec's examples, the three closed rules, and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowdrop_local import Store
from flowdrop_local.rules import text_to_message
from flowdrop_local.rules.normalize import coerce_content, normalize

from .conftest import spec_examples

MEM16 = spec_examples("MEM-16")
PAIRS = [(MEM16[i]["json"], MEM16[i + 1]) for i in range(0, len(MEM16), 2)]


@pytest.mark.parametrize(("given_", "expected"), PAIRS, ids=lambda v: v.get("verdict", "input"))
def test_spec_examples(given_: dict[str, Any], expected: dict[str, Any]) -> None:
    """MEM-16 examples: an unknown role becomes user; a pairing id off a tool row is discarded."""
    assert expected["verdict"] in ("normalized", "discarded")
    messages, message = text_to_message(given_["text"], given_["role"], given_.get("tool_call_id"))
    assert messages == [expected["json"]]
    assert message == expected["json"]


@pytest.mark.parametrize(
    ("role", "resolved"),
    [
        ("user", "user"),
        ("assistant", "assistant"),
        ("system", "system"),
        ("tool", "tool"),
        (None, "user"),
        ("", "user"),
        ("Assistant", "user"),
        (" tool ", "user"),
        ("developer", "user"),
        (3, "user"),
    ],
    ids=repr,
)
def test_the_role_set_is_closed(role: object, resolved: str) -> None:
    """Only the four roles pass, compared exactly; anything else, absent included, is user."""
    assert text_to_message("hi", role)[1]["role"] == resolved


@pytest.mark.parametrize(
    ("role", "tool_call_id", "expected"),
    [
        ("tool", "  call_1 ", "call_1"),
        ("tool", "0", "0"),
        ("tool", "   ", None),
        ("tool", "", None),
        ("tool", None, None),
        ("tool", 7, None),
        ("user", "call_1", None),
        ("assistant", "call_1", None),
        ("operator", "call_1", None),
    ],
    ids=repr,
)
def test_tool_call_id_only_on_tool_trimmed_and_omitted_when_blank(
    role: str, tool_call_id: object, expected: str | None
) -> None:
    """The pairing id lives on a tool row only, trimmed; blank or not a string is no id."""
    messages, message = text_to_message("result", role, tool_call_id)
    assert message.get("tool_call_id") == expected
    assert ("tool_call_id" in message) == (expected is not None)
    assert messages == [message]


@pytest.mark.parametrize("text", ["", "   \n", None, []], ids=repr)
@pytest.mark.parametrize("role", ["user", "tool", "assistant"])
def test_empty_content_emits_nothing(text: object, role: str) -> None:
    """Empty content gives an empty list and an empty object, a tool row with an id included."""
    assert text_to_message(text, role, "call_1") == ([], {})


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (42, "42"),
        (True, "true"),
        ({"a": 1}, '{"a": 1}'),
        ([{"type": "text", "text": "x"}], [{"type": "text", "text": "x"}]),
    ],
    ids=repr,
)
def test_content_is_coerced_as_normalisation_coerces_it(text: object, content: object) -> None:
    """A scalar is cast, a non-scalar serialised, content parts kept: the MEM-5 coercion."""
    assert text_to_message(text, "user")[1]["content"] == content == coerce_content(text)


@given(
    st.one_of(st.text(max_size=8), st.integers(), st.none(), st.booleans()),
    st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "x"]), st.none()),
    st.one_of(st.text(max_size=4), st.none()),
)
def test_output_is_a_message_normalisation_keeps(text: Any, role: Any, tool_call_id: Any) -> None:
    """Property: both outputs agree, and MEM-5 keeps the row (a tool row only when paired)."""
    messages, message = text_to_message(text, role, tool_call_id)
    assert messages == ([message] if message else [])
    if message and message["role"] not in ("tool",):
        normalized, dropped = normalize(messages)
        assert dropped == 0
        assert normalized[0]["content"] == message["content"]


def test_a_tool_row_answers_its_call_in_the_store(store: Store) -> None:
    """The emitted tool row is a shape the store accepts and pairs (MEM-1 then drops a repeat)."""
    buffer = store.buffer("session", "s1", "chat")
    buffer.append(
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "name": "f"}]}
    )
    messages, _ = text_to_message("found", "tool", " call_1 ")
    assert buffer.append(messages).appended == 1
    assert buffer.append(messages).dropped == 1
    assert buffer.append(text_to_message("next", "user")[0]).healed_ids == ()

"""MEM-4 assembly: the spec's examples, unwired inputs, and typed errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowdrop_local import InvalidMessage
from flowdrop_local.rules import assemble, text_to_message

from .conftest import spec_examples

MEM4 = spec_examples("MEM-4")
PAIRS = [(MEM4[i], MEM4[i + 1]["json"]) for i in range(0, len(MEM4), 2)]
PORTS = {0: ["b", "a"], 2: ["in_1", "in_2", "in_3"]}  # declared order, from the examples' prose


@pytest.mark.parametrize(
    ("example", "expected"),
    PAIRS,
    ids=lambda v: str(v.get("title", "out")) if isinstance(v, dict) else "out",
)
def test_spec_examples(example: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """MEM-4 examples: declared port order is message order; an unwired port adds nothing."""
    assert example["verdict"] == "assembled"
    wired = example["json"]
    inputs = [wired.get(port) for port in PORTS[example["index"]]]  # in_2 unwired: None
    assert assemble(*inputs) == expected


def test_declared_order_not_name_order() -> None:
    """Declaring a before b reverses the first example's output."""
    b, a = MEM4[0]["json"]["b"], MEM4[0]["json"]["a"]
    assert assemble(a, b) == a + b


@pytest.mark.parametrize("empty", [None, [], (), {}], ids=repr)
def test_an_input_without_value_adds_nothing(empty: object) -> None:
    """None, an empty list and MEM-16's empty object contribute nothing, no placeholder."""
    one = {"role": "user", "content": "x"}
    assert assemble(empty, one, empty) == [one]


def test_single_messages_lists_and_text_outputs_mix() -> None:
    """A single message adds one item, a list each of its items, a MEM-16 output its row."""
    listed, row = text_to_message("from text", "assistant")
    empty_list, empty_row = text_to_message("", "user")
    one = {"role": "system", "content": "sys"}
    many = [{"role": "user", "content": "1"}, {"role": "user", "content": "2"}, {}]
    assert assemble(one, many, listed, empty_list, empty_row) == [one, *many[:2], row]


@pytest.mark.parametrize(
    ("inputs", "index", "field"),
    [(("text",), 0, "input"), ((None, 3), 1, "input"), (([{"role": "user"}, "x"],), 0, "input[1]")],
    ids=["str", "int", "item"],
)
def test_non_messages_raise_a_typed_error(
    inputs: tuple[object, ...], index: int, field: str
) -> None:
    """Something that is no message, nor a list of them, is InvalidMessage naming input and item."""
    with pytest.raises(InvalidMessage) as raised:
        assemble(*inputs)
    assert (raised.value.index, raised.value.field) == (index, field)


MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=3)}
)


@given(st.lists(st.one_of(st.none(), MESSAGE, st.lists(MESSAGE, max_size=3)), max_size=6))
def test_assembly_is_concatenation(inputs: list[Any]) -> None:
    """Property: the output is the inputs' messages, flattened in order, nothing added."""
    expected: list[Any] = []
    for value in inputs:
        if isinstance(value, list):
            expected += value
        elif value:
            expected.append(value)
    assert assemble(*inputs) == expected

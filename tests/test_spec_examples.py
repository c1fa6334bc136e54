"""The spec's own examples for MEM-1, 2, 3, 10, 11 and 14, table-driven.

The example files are copied unchanged from the spec (spec_examples/README.md).
Each test builds the buffer the example's prose describes, appends the example's
message, and checks the verdict the example gives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import Buffer, InvalidMessage, Store
from flowdrop_local.plans import run_plan
from flowdrop_local.rules import PLACEHOLDER_CONTENT

from .conftest import spec_examples

C1_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"tool_call_id": "c1", "name": "search"}],
}
C1_RESULT = {"role": "tool", "content": "found it", "tool_call_id": "c1"}


def _buffer(store: Store, *setup: dict[str, Any], healed_c1: bool = False) -> Buffer:
    buffer = store.buffer("session", "s1", "chat")
    buffer.append(list(setup))
    if healed_c1:
        result = buffer.append({"role": "user", "content": "hello?"})
        assert len(result.healed_ids) == 1
    return buffer


# ----------------------------------------------------------------------- MEM-1

MEM1 = {e["index"]: e for e in spec_examples("MEM-1")}


@pytest.mark.parametrize(
    ("example", "appended"),
    [(MEM1[0], 0), (MEM1[1], 1)],
    ids=lambda v: v["verdict"] if isinstance(v, dict) else str(v),
)
def test_mem1_result_against_an_answered_call(
    store: Store, example: dict[str, Any], appended: int
) -> None:
    """MEM-1: a result for an id already answered is dropped; a new id is appended."""
    buffer = _buffer(store, C1_CALL, C1_RESULT)
    before = buffer.read()
    result = buffer.append(example["json"])
    assert result.appended == appended
    if example["verdict"] == "dropped":
        assert buffer.read() == before
        assert result.dropped == 1
    else:
        assert example["verdict"] == "appended"
        assert buffer.read()[-1]["content"] == example["json"]["content"]
        assert result.count == len(before) + 1


def test_mem1_placeholder_is_replaced_not_deduplicated(store: Store) -> None:
    """MEM-1 exception: an id held by a healed placeholder is replaced by the real result."""
    held, late = MEM1[2], MEM1[3]
    assert (held["verdict"], late["verdict"]) == ("held", "replaced")
    buffer = _buffer(store, C1_CALL, healed_c1=True)
    placeholder = buffer.read()[1]
    assert placeholder == held["json"]
    result = buffer.append(late["json"])
    assert (result.appended, result.appended_any, len(result.replaced_ids)) == (0, False, 1)
    assert buffer.read()[1] == {
        "role": "tool",
        "content": "Found 3 cats",
        "metadata": {"tool_call_id": "c1"},
    }


# ----------------------------------------------------------------------- MEM-2

MEM2 = spec_examples("MEM-2")


@pytest.mark.parametrize("example", MEM2, ids=lambda e: e["verdict"])
def test_mem2_assistant_dedup(store: Store, example: dict[str, Any]) -> None:
    """MEM-2: dropped only when every declared id is already declared."""
    buffer = _buffer(store, C1_CALL)
    result = buffer.append(example["json"])
    if example["verdict"] == "dropped":
        assert (result.appended, result.dropped, len(buffer)) == (0, 1, 1)
    else:
        assert example["verdict"] == "kept"
        assert (result.appended, len(buffer)) == (1, 2)
        assert buffer.read()[-1]["metadata"]["tool_calls"] == example["json"]["tool_calls"]


# ----------------------------------------------------------------------- MEM-3

MEM3 = spec_examples("MEM-3")
MEM3_BEFORE, MEM3_HEALED = MEM3[0]["json"], MEM3[1]["json"]
TRY_AGAIN = {"role": "user", "content": "try again", "metadata": {}}


@pytest.mark.parametrize("one_at_a_time", [True, False], ids=["one-at-a-time", "one-batch"])
def test_mem3_example_gives_the_healed_buffer(db_path: Path, one_at_a_time: bool) -> None:
    """MEM-3: the example, then "try again", gives exactly the healed buffer, reopened too."""
    assert (MEM3[0]["verdict"], MEM3[1]["verdict"]) == ("unhealed", "healed")
    with Store(db_path) as store:
        buffer = store.buffer("session", "s1", "chat")
        if one_at_a_time:
            for message in [*MEM3_BEFORE, TRY_AGAIN]:
                buffer.append(message)
        else:
            result = buffer.append([*MEM3_BEFORE, TRY_AGAIN])
            assert (result.count, result.appended, len(result.healed_ids)) == (5, 4, 1)
        assert buffer.read() == MEM3_HEALED
    with Store(db_path) as reopened:
        assert reopened.buffer("session", "s1", "chat").read() == MEM3_HEALED


def test_mem3_tool_append_never_heals(store: Store) -> None:
    """MEM-3: appending a tool message against another call leaves the dangling call unanswered."""
    buffer = _buffer(store, MEM3_BEFORE[0])
    result = buffer.append({"role": "tool", "content": "other", "tool_call_id": "c9"})
    assert result.healed_ids == ()
    assert [m["role"] for m in buffer.read()] == ["assistant", "tool"]
    assert buffer.read()[1]["metadata"] == {"tool_call_id": "c9"}
    result = buffer.append({"role": "assistant", "content": "still thinking"})
    assert result.healed_ids == ()
    assert all(m["metadata"].get("healed") is not True for m in buffer.read())


def test_mem3_placeholder_lands_next_to_its_call_not_at_the_end(store: Store) -> None:
    """MEM-3: turns appended after the dangling call stay after the placeholder."""
    buffer = store.buffer("session", "s1", "chat")
    buffer.append(
        [
            MEM3_BEFORE[0],
            {"role": "assistant", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
        ]
    )
    roles = [(m["role"], m["content"]) for m in buffer.read()]
    assert roles == [
        ("assistant", ""),
        ("tool", PLACEHOLDER_CONTENT),
        ("assistant", "one"),
        ("assistant", "two"),
        ("user", "three"),
    ]


# ---------------------------------------------------------------------- MEM-10

MEM10 = spec_examples("MEM-10")


def test_mem10_real_result_replaces_the_placeholder_in_place(store: Store) -> None:
    """MEM-10: same slot, healed mark gone, buffer no longer, reported as no append."""
    buffer = _buffer(store, C1_CALL, healed_c1=True)
    before = buffer.messages()
    assert before[1].to_dict() == MEM10[0]["json"]
    result = buffer.append(MEM10[1]["json"])
    after = buffer.messages()
    assert MEM10[1]["verdict"] == "replaced"
    assert after[1].to_dict() == MEM10[1]["json"]
    assert (after[1].id, after[1].position) == (before[1].id, before[1].position)
    assert [m.position for m in after] == [m.position for m in before]
    assert (len(after), result.appended, result.appended_any) == (len(before), 0, False)
    assert result.replaced_ids == (before[1].id,)
    # Once replaced, the entry is an ordinary result: a second copy is deduplicated.
    again = buffer.append(MEM10[1]["json"])
    assert (again.dropped, again.replaced_ids) == (1, ())
    assert buffer.messages() == after


def test_mem10_incoming_healed_message_never_replaces(store: Store) -> None:
    """MEM-10: an incoming message itself marked healed never replaces anything."""
    buffer = _buffer(store, C1_CALL, healed_c1=True)
    before = buffer.read()
    forged = {
        "role": "tool",
        "content": PLACEHOLDER_CONTENT,
        "metadata": {"tool_call_id": "c1", "healed": True},
    }
    result = buffer.append(forged)
    assert (result.dropped, result.replaced_ids) == (1, ())
    assert buffer.read() == before


@pytest.mark.parametrize(
    ("forged", "field"),
    [
        (
            {
                "role": "tool",
                "content": "real data",
                "metadata": {"tool_call_id": "c1", "healed": True},
            },
            "content",
        ),
        (
            {
                "role": "tool",
                "content": "",
                "metadata": {"tool_call_id": "c1", "healed": True, "x": 1},
            },
            "metadata",
        ),
        ({"role": "tool", "content": "", "metadata": {"healed": True}}, "metadata.healed"),
        ({"role": "user", "content": "", "metadata": {"healed": True}}, "metadata.healed"),
    ],
)
def test_mem10_a_healed_mark_is_only_accepted_on_an_exact_placeholder(
    store: Store, forged: dict[str, Any], field: str
) -> None:
    """MEM-10: only a placeholder is overwritten, so real content under a healed mark is refused."""
    buffer = _buffer(store, C1_CALL, healed_c1=True)
    before = buffer.read()
    with pytest.raises(InvalidMessage) as caught:
        buffer.append(forged)
    assert caught.value.field == field
    assert buffer.read() == before


# ---------------------------------------------------------------------- MEM-11

MEM11 = spec_examples("MEM-11")


def test_mem11_flat_id_is_healed_under_the_normalised_spelling(store: Store) -> None:
    """MEM-11: a call declared as {"id": ...} is healed with tool_call_id naming that id."""
    buffer = _buffer(store, MEM11[0]["json"])
    result = buffer.append({"role": "user", "content": "next"})
    assert MEM11[1]["verdict"] == "healed"
    placeholder = buffer.read()[1]
    expected = MEM11[1]["json"]
    assert placeholder["role"] == expected["role"]
    assert placeholder["metadata"] == expected["metadata"]
    assert placeholder["content"] == PLACEHOLDER_CONTENT
    assert len(result.healed_ids) == 1


@pytest.mark.parametrize(
    "declared",
    [
        {"tool_call_id": "c1", "name": "search"},
        {"id": "c1", "name": "search"},
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
    ],
    ids=["normalised", "flat", "openai"],
)
def test_mem11_every_guard_reads_both_spellings(store: Store, declared: dict[str, Any]) -> None:
    """MEM-11: dedup, answered-call detection and the ledger agree whatever the spelling."""
    buffer = store.buffer("session", "s1", "chat")
    buffer.append({"role": "assistant", "content": "", "metadata": {"tool_calls": [declared]}})
    # MEM-2 reads the id: the same call in the other spelling is a duplicate.
    other = {"id": "c1"} if "tool_call_id" in declared else {"tool_call_id": "c1"}
    assert buffer.append({"role": "assistant", "tool_calls": [other]}).dropped == 1
    # The answered-call check reads it: a result answers it, so the user turn heals nothing.
    buffer.append({"role": "tool", "content": "ok", "tool_call_id": "c1"})
    assert buffer.append({"role": "user", "content": "thanks"}).healed_ids == ()


# ---------------------------------------------------------------------- MEM-14

MEM14 = spec_examples("MEM-14")


def test_mem14_full_window_still_reports_the_append(store: Store) -> None:
    """MEM-14: at a full three-message window the count stays 3 but appended says 1."""
    buffer = store.buffer("session", "s1", "chat", window=3)
    buffer.append([{"role": "user", "content": str(i)} for i in range(3)])
    result = buffer.append({"role": "user", "content": "new"})
    expected = MEM14[0]["json"]
    assert MEM14[0]["verdict"] == "appended"
    assert {
        "count": result.count,
        "appended": result.appended,
        "appended_any": result.appended_any,
    } == expected
    assert result.evicted == 1
    assert [m["content"] for m in buffer.read()] == ["1", "2", "new"]


def test_mem14_refired_result_reports_nothing_new(store: Store) -> None:
    """MEM-14: a re-fired tool result reports count 2, appended 0."""
    buffer = _buffer(store, C1_CALL, C1_RESULT)
    result = buffer.append(C1_RESULT)
    expected = MEM14[1]["json"]
    assert MEM14[1]["verdict"] == "dropped"
    assert {
        "count": result.count,
        "appended": result.appended,
        "appended_any": result.appended_any,
    } == expected


def test_mem10_deleting_a_later_declaration_keeps_the_owners_placeholder(store: Store) -> None:
    """MEM-10: after the turn re-declaring a call is deleted, the real result still replaces
    the placeholder of the turn that owns the call, in place."""
    from flowdrop_local import engine

    buffer = store.buffer("session", "s1", "chat")
    buffer.append(
        [{"role": "user", "content": "q"}, C1_CALL, {"role": "assistant", "content": "text"}]
    )
    buffer.append({"role": "user", "content": "next"})  # heals c1 right after its turn
    redeclared = buffer.append(
        {"role": "assistant", "tool_calls": [{"tool_call_id": "c1"}, {"tool_call_id": "c2"}]}
    )
    with store.backend.write() as tx:
        assert run_plan(engine.remove_message(redeclared.message_ids[0]), tx)
    result = buffer.append({"role": "tool", "content": "REAL", "tool_call_id": "c1"})
    assert len(result.replaced_ids) == 1
    assert [m["content"] for m in buffer.read()] == ["q", "", "REAL", "text", "next"]
    assert store.check() == []

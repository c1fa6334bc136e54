"""MEM-5 normalisation: the spec's examples, each rule's cases, and properties.

The flat shape is the library's one message shape, ``{"role", "content",
"metadata"}``, with tool data in ``metadata`` (what ``Buffer.read`` returns), so
results are compared after lifting ``metadata.tool_calls`` / ``tool_call_id`` to
the top level, which is where the spec's examples write them.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import InvalidPayload, Store
from flowdrop_local.providers import to_openai_chat, validate_openai_chat
from flowdrop_local.rules import PLACEHOLDER_CONTENT
from flowdrop_local.rules.normalize import coerce_content, normalize, validate_pairing

from .conftest import spec_examples

MEM5 = {e["index"]: e for e in spec_examples("MEM-5")}


def spec_shape(message: dict[str, Any]) -> dict[str, Any]:
    """Our flat message in the spec examples' spelling: tool keys lifted to the top level."""
    lifted = {"role": message["role"], "content": message["content"]}
    for key in ("tool_calls", "tool_call_id"):
        if key in message["metadata"]:
            lifted[key] = message["metadata"][key]
    return lifted


def call(call_id: Any, name: str = "search") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"tool_call_id": call_id, "name": name}],
    }


def result(call_id: Any, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": call_id}


# ------------------------------------------------------------- spec examples


def test_spec_example_zero_id_is_kept_by_our_reading() -> None:
    """MEM-5 example 0: a "0" call and its result are a usable pair here, so nothing drops.

    The spec resolves the pair to ``[]`` (three drops) because PHP treats "0" as
    falsy. This library has one definition of a usable id, a non-blank string
    (``is_usable_call_id``), and local OpenAI-compatible servers do emit "0":
    the pair is kept unchanged (docs/providers.md).
    """
    assert (MEM5[0]["verdict"], MEM5[1]["verdict"], MEM5[1]["json"]) == ("unusable", "dropped", [])
    messages, dropped = normalize(MEM5[0]["json"])
    assert dropped == 0
    assert [spec_shape(m) for m in messages] == MEM5[0]["json"]
    validate_pairing(messages)


@pytest.mark.parametrize("unusable", [0, "", "   ", None, 0.0], ids=repr)
def test_a_really_unusable_id_costs_three_drops(unusable: Any) -> None:
    """The narrative's accounting, for ids this library finds unusable: turn, call and result."""
    messages, dropped = normalize([call(unusable), result(unusable)])
    assert (messages, dropped) == ([], 3)


def test_spec_example_result_before_its_call_keeps_the_real_result() -> None:
    """MEM-5 example 2: by our reading the early result is placed after its call, not replaced.

    The spec resolves it to example 3, the call answered by a placeholder (one
    drop). This library reads MEM-3's "no matching tool result *anywhere* in the
    buffer" as the one meaning of answered: the store already counts that result
    as the call's answer and never heals the call, so dropping it would replace a
    real answer with an invented interruption, and ``normalize(buf.read())`` would
    disagree with the buffer it reads. The result moves to right after its call
    (docs/providers.md).
    """
    assert (MEM5[2]["verdict"], MEM5[3]["verdict"]) == ("misordered", "repaired")
    assert MEM5[3]["json"][1]["content"] == PLACEHOLDER_CONTENT  # the spec's reading
    messages, dropped = normalize(MEM5[2]["json"])
    assert dropped == 0
    assert [spec_shape(m) for m in messages] == [MEM5[2]["json"][1], MEM5[2]["json"][0]]
    assert messages == [
        {
            "role": "assistant",
            "content": "",
            "metadata": {"tool_calls": [{"tool_call_id": "c1", "name": "search"}]},
        },
        {"role": "tool", "content": "out of order", "metadata": {"tool_call_id": "c1"}},
    ]
    validate_pairing(messages)


# ------------------------------------------------------------- rule 1: coerce


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("text", "text"),
        ("", ""),
        (None, ""),
        (3, "3"),
        (2.5, "2.5"),
        (True, "true"),
        (False, "false"),
        ({"a": [1, "é"]}, '{"a": [1, "é"]}'),
        ([1, 2], "[1, 2]"),
        ([{"type": "text", "text": "hi"}], [{"type": "text", "text": "hi"}]),
        ([], []),
        ([{"type": "tool_use", "id": "x"}], '[{"type": "tool_use", "id": "x"}]'),
        ({"n": float("nan")}, ""),
        ({1j}, ""),
    ],
    ids=repr,
)
def test_content_is_coerced_never_blanked(content: Any, expected: Any) -> None:
    """Rule 1: scalars cast, parts kept, other values serialised, unserialisable ones empty."""
    assert coerce_content(content) == expected


@pytest.mark.parametrize(
    "entry",
    [
        "text",
        3,
        None,
        ["role", "user"],
        {"content": "no role"},
        {"role": "operator", "content": "x"},
    ],
    ids=repr,
)
def test_entries_that_are_not_messages_are_dropped(entry: Any) -> None:
    """Rule 1: a non-mapping entry, or one without a usable role, is dropped and counted."""
    assert normalize([entry, {"role": "user", "content": "kept"}]) == (
        [{"role": "user", "content": "kept", "metadata": {}}],
        1,
    )


def test_all_three_input_shapes_coerce_to_the_stored_shape() -> None:
    """Rule 1: flat, OpenAI and metadata spellings meet in metadata; extra keys follow them."""
    openai_call = {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages, dropped = normalize(
        [
            {"role": "developer", "content": "be brief"},
            {"role": "assistant", "content": None, "tool_calls": [openai_call], "name": "bot"},
            {"role": "tool", "content": "2", "tool_call_id": "c2"},
            {"role": "assistant", "content": "", "metadata": {"tool_calls": [{"id": "c3"}]}},
            {"role": "tool", "content": "3", "metadata": {"tool_call_id": "c3"}},
        ]
    )
    assert dropped == 0
    assert messages == [
        {"role": "system", "content": "be brief", "metadata": {}},
        {
            "role": "assistant",
            "content": "",
            "metadata": {"tool_calls": [openai_call], "name": "bot"},
        },
        {"role": "tool", "content": "2", "metadata": {"tool_call_id": "c2"}},
        {"role": "assistant", "content": "", "metadata": {"tool_calls": [{"id": "c3"}]}},
        {"role": "tool", "content": "3", "metadata": {"tool_call_id": "c3"}},
    ]


def test_pairing_keys_on_the_wrong_role_are_removed() -> None:
    """Rule 1: only an assistant declares (its calls count as drops); only a tool answers."""
    messages, dropped = normalize(
        [{"role": "user", "content": "hi", "tool_call_id": "c1", "tool_calls": [{"id": "c1"}]}]
    )
    assert (messages, dropped) == ([{"role": "user", "content": "hi", "metadata": {}}], 1)


# ------------------------------------------------------- rule 2: system first


def test_system_messages_move_first_and_both_groups_keep_their_order() -> None:
    """Rule 2: a stable partition; a system message is never dropped."""
    entries = [
        {"role": "user", "content": "u1"},
        {"role": "system", "content": "s1"},
        {"role": "assistant", "content": "a1"},
        {"role": "system", "content": ""},
        {"role": "user", "content": "u2"},
    ]
    messages, dropped = normalize(entries)
    assert [m["content"] for m in messages] == ["s1", "", "u1", "a1", "u2"]
    assert dropped == 0


# ----------------------------------------------------- rule 3: repair pairing


@pytest.mark.parametrize(
    ("entries", "expected", "dropped"),
    [
        pytest.param(
            [call("c1")],
            [("assistant", None), ("tool", "c1*")],
            0,
            id="unanswered call healed",
        ),
        pytest.param(
            [result("c9"), {"role": "user", "content": "u"}],
            [("user", None)],
            1,
            id="orphan result dropped",
        ),
        pytest.param(
            [call("c1"), result("c1"), result("c1", "again")],
            [("assistant", None), ("tool", "c1")],
            1,
            id="duplicate result dropped",
        ),
        pytest.param(
            [result("c1"), {"role": "user", "content": "u"}, call("c1")],
            [("user", None), ("assistant", None), ("tool", "c1")],
            0,
            id="early result placed right after its call",
        ),
        pytest.param(
            [
                result("b"),
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "a"}, {"id": "b"}, {"id": "c"}],
                },
                result("c"),
            ],
            [("assistant", None), ("tool", "a*"), ("tool", "b"), ("tool", "c")],
            0,
            id="early and late results in list order, after the placeholders",
        ),
        pytest.param(
            [result("c1", "first"), call("c1"), result("c1", "second")],
            [("assistant", None), ("tool", "c1")],
            1,
            id="first result in list order wins, early or not",
        ),
        pytest.param(
            [call("c1"), result("c1"), call("c1")],
            [("assistant", None), ("tool", "c1")],
            2,
            id="redeclared empty turn dropped: call and turn",
        ),
        pytest.param(
            [call("c1"), result("c1"), {**call("c1"), "content": "again"}],
            [("assistant", None), ("tool", "c1"), ("assistant", None)],
            1,
            id="redeclared call dropped from a turn with text",
        ),
        pytest.param(
            [call("c1"), {"role": "assistant", "content": "between"}, result("c1")],
            [("assistant", None), ("tool", "c1"), ("assistant", None)],
            0,
            id="late result placed right after its call",
        ),
        pytest.param(
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "a"}, {"id": "b"}, {"id": "c"}],
                },
                result("b"),
            ],
            [("assistant", None), ("tool", "a*"), ("tool", "c*"), ("tool", "b")],
            0,
            id="placeholders first, as the store places them",
        ),
        pytest.param(
            [{"role": "assistant", "content": "", "tool_calls": [{"id": "a"}, {"id": "a"}]}],
            [("assistant", None), ("tool", "a*")],
            1,
            id="id twice in one turn",
        ),
    ],
)
def test_repair(entries: list[Any], expected: list[tuple[str, str | None]], dropped: int) -> None:
    """Rule 3, case by case (``c1*`` is a placeholder answering c1)."""
    messages, count = normalize(entries)
    shape = []
    for m in messages:
        call_id = m["metadata"].get("tool_call_id")
        mark = "*" if m["metadata"].get("healed") else ""
        shape.append((m["role"], None if call_id is None else f"{call_id}{mark}"))
    assert shape == expected
    assert count == dropped
    validate_pairing(messages)


def test_placeholders_are_the_stores_own() -> None:
    """Rule 3 heals with the MEM-3 placeholder: same content, same metadata."""
    messages, _ = normalize([call("c1")])
    assert messages[1] == {
        "role": "tool",
        "content": PLACEHOLDER_CONTENT,
        "metadata": {"tool_call_id": "c1", "healed": True},
    }


def test_normalizing_a_buffer_right_after_a_user_append_changes_nothing(store: Store) -> None:
    """Repair and the store's healing agree: the healed buffer is already normal."""
    buffer = store.buffer("session", "s1", "chat")
    buffer.append(
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "find cats and dogs"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "s", "arguments": "{}"}},
                    {"tool_call_id": "c2", "name": "s"},
                    {"id": "c3", "name": "s"},
                ],
            },
            result("c2", "dogs"),
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c4"}]},
            {"role": "user", "content": [{"type": "text", "text": "hello?"}]},
        ]
    )
    stored = buffer.read()
    assert sum(1 for m in stored if m["metadata"].get("healed")) == 3
    assert normalize(stored) == (stored, 0)


def test_normalizing_a_buffer_with_a_result_stored_before_its_call_keeps_it(
    store: Store,
) -> None:
    """The store counts a result stored first as its call's answer; so does repair.

    ``normalize(buf.read())`` drops nothing and invents nothing: the same
    messages, the early result moved to right after its call, no placeholder.
    """
    buffer = store.buffer("session", "s1", "early")
    buffer.append(
        [
            {"role": "tool", "tool_call_id": "c1", "content": "real"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},
            {"role": "user", "content": "next"},
        ]
    )
    assert store.check() == []
    stored = buffer.read()
    assert not any(m["metadata"].get("healed") for m in stored)
    messages, dropped = normalize(stored)
    assert dropped == 0
    assert messages == [stored[1], stored[0], stored[2]]
    assert normalize(messages) == (messages, 0)


# ------------------------------------------------- rule 4 and the properties

IDS = st.sampled_from(["c1", "c2", "c3", "0", "", " ", 0, None])
CONTENT = st.one_of(
    st.text(max_size=5),
    st.none(),
    st.integers(),
    st.booleans(),
    st.just([{"type": "text", "text": "part"}]),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
CALLS = st.lists(
    st.one_of(
        st.builds(lambda i: {"tool_call_id": i, "name": "f"}, IDS),
        st.builds(lambda i: {"id": i, "type": "function", "function": {"name": "f"}}, IDS),
        st.just("not a call"),
    ),
    max_size=3,
)
ENTRY = st.one_of(
    st.builds(
        lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "system", "x"]), CONTENT
    ),
    st.builds(lambda c, k: {"role": "assistant", "content": c, "tool_calls": k}, CONTENT, CALLS),
    st.builds(
        lambda c, k: {"role": "assistant", "content": c, "metadata": {"tool_calls": k}},
        CONTENT,
        CALLS,
    ),
    st.builds(lambda c, i: {"role": "tool", "content": c, "tool_call_id": i}, CONTENT, IDS),
    st.builds(
        lambda c, i: {"role": "tool", "content": c, "metadata": {"tool_call_id": i}}, CONTENT, IDS
    ),
    st.sampled_from([None, "junk", 7, {"content": "no role"}]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ENTRY, max_size=10))
def test_normalize_is_idempotent_and_its_output_pairs(entries: list[Any]) -> None:
    """Properties: a second pass changes nothing and drops nothing; pairing always validates.

    The output also leads with no tool message (rule 4) and exports to a Chat
    payload the Chat validator accepts.
    """
    messages, _ = normalize(entries)
    assert normalize(messages) == (messages, 0)
    validate_pairing(messages)
    first = next((m for m in messages if m["role"] != "system"), None)
    assert first is None or first["role"] != "tool"
    validate_openai_chat(to_openai_chat(messages))


@settings(max_examples=300, deadline=None)
@given(st.lists(ENTRY, max_size=10))
def test_a_placeholder_answers_only_a_call_with_no_result_anywhere(entries: list[Any]) -> None:
    """Property: a call with a result anywhere in the input gets that result, not a placeholder.

    Before its turn or after it (MEM-3's "anywhere"): the generator puts results
    on either side of the calls they answer.
    """
    given_results = set()
    for entry in entries:
        if isinstance(entry, dict) and entry.get("role") == "tool":
            spelled = entry.get("tool_call_id", entry.get("metadata", {}).get("tool_call_id"))
            given_results.add(spelled)
    messages, _ = normalize(entries)
    for m in messages:
        if m["role"] == "tool" and m["metadata"]["tool_call_id"] in given_results:
            assert not m["metadata"].get("healed"), m


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.sampled_from(["user", "call", "calls", "answer", "late", "early", "declare", "text"]),
        max_size=14,
    )
)
def test_a_healed_store_buffer_is_already_normal(store: Store, steps: list[str]) -> None:
    """Property: after any agent loop ends in a user append, ``normalize(read())`` drops nothing.

    Results arrive right after their turn, or late for a healed call (MEM-10
    replaces the placeholder in place), as an agent loop delivers them, or
    early: stored before the turn that declares their call, which the store
    counts as answered (MEM-3) and never heals. Normalising keeps every message
    and invents none; it is the identity unless an early result has to move to
    right after its call.
    """
    buffer = store.buffer("session", "prop", "chat")
    buffer.clear()
    unanswered: list[str] = []  # declared, no result yet
    healed: list[str] = []  # answered by a placeholder
    open_calls: list[str] = []  # the last turn's calls, answerable right after it
    early: list[str] = []  # stored results whose call is not declared yet
    moved = False  # an early result's call was declared after it
    for n, step in enumerate(steps):
        if step == "user":
            buffer.append({"role": "user", "content": f"u{n}"})
            healed += unanswered
            unanswered, open_calls = [], []
        elif step in ("call", "calls"):
            ids = [f"c{n}"] if step == "call" else [f"c{n}a", f"c{n}b"]
            buffer.append(
                {"role": "assistant", "content": "", "tool_calls": [{"id": i} for i in ids]}
            )
            unanswered += ids
            open_calls = list(ids)
        elif step == "answer" and open_calls:
            call_id = open_calls.pop()
            unanswered.remove(call_id)
            buffer.append(result(call_id))
        elif step == "late" and healed:
            buffer.append(result(healed.pop(n % len(healed)), "late"))
        elif step == "early":
            buffer.append(result(f"e{n}", "early"))
            early.append(f"e{n}")
        elif step == "declare" and early:
            # A turn declaring an early-answered call and a fresh one.
            ids = [early.pop(0), f"c{n}"]
            buffer.append(
                {"role": "assistant", "content": "", "tool_calls": [{"id": i} for i in ids]}
            )
            unanswered.append(ids[1])
            open_calls = [ids[1]]
            moved = True
        else:
            buffer.append({"role": "assistant", "content": f"a{n}"})
            open_calls = []
    if early:  # declare the rest: a result whose call is declared nowhere is an orphan
        buffer.append(
            {"role": "assistant", "content": "", "tool_calls": [{"id": i} for i in early]}
        )
        moved = True
    buffer.append({"role": "user", "content": "end"})
    stored = buffer.read()
    messages, dropped = normalize(stored)
    assert dropped == 0
    assert sorted(map(repr, messages)) == sorted(map(repr, stored))
    assert moved or messages == stored
    validate_pairing(messages)


# ------------------------------------------------------------ the validator


@pytest.mark.parametrize(
    ("messages", "index", "problem"),
    [
        ([{"role": "robot"}], 0, "not a message with a known role"),
        (
            [
                {"role": "user", "content": "", "metadata": {"tool_call_id": "c1"}},
                {"role": "tool", "metadata": {"tool_call_id": "c1"}},
            ],
            1,
            "tool result for 'c1' does not follow the turn that declares it",
        ),
        (
            [{"role": "assistant", "metadata": {"tool_calls": [{"id": "c1"}]}}, {"role": "user"}],
            0,
            "tool calls ['c1'] are not answered right after their turn",
        ),
        (
            [{"role": "assistant", "metadata": {"tool_calls": [{"id": " "}]}}],
            0,
            "unusable tool call id ' '",
        ),
        (
            [
                {"role": "assistant", "metadata": {"tool_calls": [{"id": "c1"}]}},
                {"role": "tool", "metadata": {"tool_call_id": "c1"}},
                {"role": "assistant", "metadata": {"tool_calls": [{"id": "c1"}]}},
            ],
            2,
            "tool call 'c1' declared twice",
        ),
        (
            [{"role": "user", "metadata": {"tool_calls": [{"id": "c1"}]}}],
            0,
            "a user message declares tool calls",
        ),
    ],
    ids=["role", "orphan", "unanswered", "unusable", "twice", "user declares"],
)
def test_validate_pairing_names_the_first_offending_message(
    messages: list[dict[str, Any]], index: int, problem: str
) -> None:
    """The pairing validator raises InvalidPayload with the message index and the rule."""
    with pytest.raises(InvalidPayload) as raised:
        validate_pairing(messages)
    assert (raised.value.format, raised.value.index, raised.value.problem) == (
        "pairing",
        index,
        problem,
    )
    assert isinstance(raised.value, ValueError)

"""Provider payloads: exports, imports, windows, validators, and the ``show --format`` command.

Every history here is built through the real store (``:memory:`` or a temp
file); exports are checked against exact payloads, and random histories against
each format's validator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import Buffer, InvalidPayload, Store
from flowdrop_local.cli import cli
from flowdrop_local.providers import (
    OPENING_USER_TEXT,
    UNNAMED_TOOL,
    from_anthropic,
    from_openai_chat,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
    validate_anthropic,
    validate_openai_chat,
    validate_openai_responses,
)
from flowdrop_local.rules import PLACEHOLDER_CONTENT

PNG = "iVBORw0KGgo="


def weather_call(call_id: str = "call_1") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_forecast", "arguments": '{"city": "Lisbon"}'},
    }


@pytest.fixture
def buffer(store: Store) -> Buffer:
    """A healed agent conversation: system, a user question with an image, a call, a result."""
    buf = store.buffer("session", "s1", "chat")
    buf.append(
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Umbrella?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [weather_call(), weather_call("call_2")],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
            {"role": "user", "content": "Hello?"},
            {"role": "assistant", "content": "Take one."},
        ]
    )
    return buf


# ------------------------------------------------------------------- exports


def test_to_openai_chat(buffer: Buffer) -> None:
    """Chat: tool_calls with type function, tool messages by tool_call_id, parts kept as parts."""
    payload = buffer.to_openai_chat()
    assert payload == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Umbrella?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [weather_call(), weather_call("call_2")],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": PLACEHOLDER_CONTENT},
        {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "Take one."},
    ]
    validate_openai_chat(payload)


def test_to_openai_responses(buffer: Buffer) -> None:
    """Responses: function_call / function_call_output pairs by call_id, input parts mapped."""
    payload = buffer.to_openai_responses()
    assert payload == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Umbrella?"},
                {
                    "type": "input_image",
                    "image_url": f"data:image/png;base64,{PNG}",
                    "detail": "auto",
                },
            ],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_forecast",
            "arguments": '{"city": "Lisbon"}',
        },
        {
            "type": "function_call",
            "call_id": "call_2",
            "name": "get_forecast",
            "arguments": '{"city": "Lisbon"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": PLACEHOLDER_CONTENT},
        {"type": "function_call_output", "call_id": "call_2", "output": "Rain"},
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": "Take one."},
    ]
    validate_openai_responses(payload)


def test_to_anthropic(buffer: Buffer) -> None:
    """Anthropic: system apart, tool_use in the assistant turn, tool_result first after it."""
    payload = buffer.to_anthropic()
    assert payload == {
        "system": "Be brief.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Umbrella?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "get_forecast",
                        "input": {"city": "Lisbon"},
                    },
                    {
                        "type": "tool_use",
                        "id": "call_2",
                        "name": "get_forecast",
                        "input": {"city": "Lisbon"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_1",
                        "content": PLACEHOLDER_CONTENT,
                    },
                    {"type": "tool_result", "tool_use_id": "call_2", "content": "Rain"},
                    {"type": "text", "text": "Hello?"},
                ],
            },
            {"role": "assistant", "content": "Take one."},
        ],
    }
    validate_anthropic(payload)


def test_a_result_stored_before_its_call_is_placed_right_after_it(store: Store) -> None:
    """MEM-3 lets an earlier result answer a later call; every export puts it after the call."""
    buf = store.buffer("session", "s1", "early")
    buf.append(
        [
            {"role": "user", "content": "go"},
            {"role": "tool", "tool_call_id": "c1", "content": "early"},
            {"role": "assistant", "content": "thinking"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f"}]},
            {"role": "user", "content": "next"},
        ]
    )
    assert [m["role"] for m in buf.read()] == ["user", "tool", "assistant", "assistant", "user"]
    chat = buf.to_openai_chat()
    assert [(m["role"], m.get("tool_call_id")) for m in chat] == [
        ("user", None),
        ("assistant", None),
        ("assistant", None),
        ("tool", "c1"),
        ("user", None),
    ]
    assert chat[3]["content"] == "early"
    validate_openai_chat(chat)
    validate_openai_responses(buf.to_openai_responses())
    anthropic = buf.to_anthropic()
    assert anthropic["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "thinking"},
            {"type": "tool_use", "id": "c1", "name": "f", "input": {}},
        ],
    }
    validate_anthropic(anthropic)


def test_a_mid_loop_export_answers_the_open_call_without_writing(store: Store) -> None:
    """The last call has no result yet: the payload has a placeholder, the store does not."""
    buf = store.buffer("session", "s1", "loop")
    buf.append(
        [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [weather_call()]}]
    )
    before = buf.read()
    chat = buf.to_openai_chat()
    assert chat[-1] == {"role": "tool", "tool_call_id": "call_1", "content": PLACEHOLDER_CONTENT}
    validate_openai_chat(chat)
    assert buf.read() == before


def test_anthropic_ids_outside_its_alphabet_are_rewritten_consistently(store: Store) -> None:
    """A local server's id "call 1" becomes a safe id, the same in tool_use and tool_result."""
    buf = store.buffer("session", "s1", "ids")
    buf.append(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "call 1", "name": "f"}, {"id": "call_1", "name": "g"}],
            },
            {"role": "tool", "tool_call_id": "call 1", "content": "a"},
            {"role": "tool", "tool_call_id": "call_1", "content": "b"},
        ]
    )
    payload = buf.to_anthropic()
    uses = [b["id"] for b in payload["messages"][1]["content"]]
    results = [b["tool_use_id"] for b in payload["messages"][2]["content"]]
    assert uses == results and uses[1] == "call_1" and uses[0] != uses[1]
    validate_anthropic(payload)
    assert buf.to_openai_chat()[1]["tool_calls"][0]["id"] == "call 1"  # OpenAI takes any string


def test_anthropic_opens_with_a_user_turn_and_drops_blank_text(store: Store) -> None:
    """A history that opens with the assistant gets a user opener; blank turns are left out."""
    buf = store.buffer("session", "s1", "greeting")
    buf.append(
        [
            {"role": "assistant", "content": "Hi! How can I help?"},
            {"role": "user", "content": "   "},
            {"role": "assistant", "content": "Still there?"},
        ]
    )
    assert buf.to_anthropic() == {
        "messages": [
            {"role": "user", "content": OPENING_USER_TEXT},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Hi! How can I help?"},
                    {"type": "text", "text": "Still there?"},
                ],
            },
        ]
    }


def test_reasoning_stays_with_its_provider() -> None:
    """Anthropic thinking blocks survive an Anthropic round trip, and stay out of OpenAI's."""
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    history = from_anthropic(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [thinking, {"type": "text", "text": "a"}]},
        ]
    )
    with Store(":memory:") as store:
        buf = store.buffer("session", "s1", "think")
        buf.append(history)
        assert buf.to_anthropic()["messages"][1]["content"][0] == thinking
        assert buf.to_openai_chat()[1]["content"] == [{"type": "text", "text": "a"}]
        assert buf.to_openai_responses()[1]["content"] == [
            {"type": "output_text", "text": "a", "annotations": []}
        ]


def test_a_call_without_name_or_arguments_is_still_sendable(store: Store) -> None:
    """The spec shape lets a call omit its name: exports name it and give empty arguments."""
    buf = store.buffer("session", "s1", "bare")
    buf.append(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"tool_call_id": "c1"}]},
        ]
    )
    assert buf.to_openai_chat()[1]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": UNNAMED_TOOL, "arguments": "{}"}}
    ]
    validate_anthropic(buf.to_anthropic())


# ------------------------------------------------------------------- windows


@pytest.fixture
def long_buffer(store: Store) -> Buffer:
    buf = store.buffer("session", "s1", "long")
    buf.append(
        [
            {"role": "system", "content": "sys"},  # 0
            {"role": "user", "content": "u1"},  # 1
            {"role": "assistant", "content": "a0"},  # 2
            {"role": "user", "content": "u2"},  # 3
            {"role": "tool", "tool_call_id": "early", "content": "stored first"},  # 4
            {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},  # 5
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},  # 6
            {"role": "assistant", "content": "a1"},  # 7
            {"role": "user", "content": "u3"},  # 8
            {"role": "assistant", "tool_calls": [{"id": "early", "name": "f"}]},  # 9
            {"role": "assistant", "content": "a2"},  # 10
        ]
    )
    return buf


U2_ON = ["u2", "", "r1", "a1", "u3", "", "stored first", "a2"]


U3_ALONE = ["u3", "", PLACEHOLDER_CONTENT, "a2"]


@pytest.mark.parametrize(
    ("limit", "contents", "read_contents"),
    [
        (0, [], []),
        # u3's turn, widened to u2's: it holds the result of u3's call. The buffer
        # reads back only until a user turn: a result stored before the last
        # turn's call (no user turn after it) is not looked for, and the call
        # gets a placeholder, as a call still waiting for its result would.
        # The system prompt that opens the history is kept, wherever the window starts.
        (1, ["sys", *U2_ON], ["sys", *U3_ALONE]),
        (7, ["sys", *U2_ON], ["sys", *U2_ON]),
        (9, ["sys", "u1", "a0", *U2_ON], ["sys", "u1", "a0", *U2_ON]),
        (11, ["sys", "u1", "a0", *U2_ON], ["sys", "u1", "a0", *U2_ON]),
        (None, ["sys", "u1", "a0", *U2_ON], ["sys", "u1", "a0", *U2_ON]),
    ],
)
def test_limit_widens_to_whole_turns(
    long_buffer: Buffer, limit: int | None, contents: list[str], read_contents: list[str]
) -> None:
    """The window starts at a user turn and keeps each call with its results it sees."""
    pure = to_openai_chat(long_buffer.read(), limit=limit)
    assert [m["content"] or "" for m in pure] == contents
    payload = long_buffer.to_openai_chat(limit)
    assert [m["content"] or "" for m in payload] == read_contents
    validate_openai_chat(payload)
    validate_anthropic(long_buffer.to_anthropic(limit))
    validate_openai_responses(long_buffer.to_openai_responses(limit))


def test_limit_is_checked(buffer: Buffer) -> None:
    """A negative or non-integer limit is a ValueError, not a silent full export."""
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="limit"):
            buffer.to_openai_chat(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------- imports


def test_from_anthropic_round_trips_through_the_store(store: Store) -> None:
    """An Anthropic history, stored and exported again, comes back the same."""
    payload = {
        "system": "sys",
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get",
                        "input": {"city": "Porto"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "sun",
                        "is_error": True,
                    },
                    {"type": "text", "text": "and tomorrow?"},
                ],
            },
            {"role": "assistant", "content": "Sun too."},
        ],
    }
    validate_anthropic(payload)
    buf = store.buffer("session", "s1", "imported")
    buf.append(from_anthropic(payload))
    assert [m["role"] for m in buf.read()] == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
    ]
    assert buf.to_anthropic() == payload
    chat = buf.to_openai_chat()
    assert chat[2]["tool_calls"][0]["function"] == {"name": "get", "arguments": '{"city": "Porto"}'}
    validate_openai_chat(chat)


def test_from_openai_chat_round_trips_through_the_store(store: Store) -> None:
    """A Chat history, stored and exported again, comes back the same (developer as system)."""
    history = [
        {"role": "developer", "content": "sys"},
        {"role": "user", "content": "weather?", "name": "ana"},
        {"role": "assistant", "content": None, "tool_calls": [weather_call()]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        {"role": "assistant", "content": "Take an umbrella."},
    ]
    validate_openai_chat(history)
    buf = store.buffer("session", "s1", "chat-import")
    buf.append(from_openai_chat(history))
    assert buf.read()[1]["metadata"] == {"name": "ana"}
    assert buf.to_openai_chat() == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "weather?"},
        *history[2:],
    ]


@pytest.mark.parametrize(
    ("convert", "payload", "index"),
    [
        (from_openai_chat, [{"role": "function", "content": "x"}], 0),
        (from_openai_chat, "not a list", None),
        (from_anthropic, [{"role": "user", "content": "x"}, {"role": "system", "content": "x"}], 1),
        (from_anthropic, [{"role": "user", "content": 5}], 0),
        (from_anthropic, {"messages": None}, None),
    ],
    ids=["chat role", "chat not list", "anthropic role", "anthropic content", "anthropic no list"],
)
def test_importers_raise_a_typed_error(convert: Any, payload: Any, index: int | None) -> None:
    """Importers name the first message they cannot convert."""
    with pytest.raises(InvalidPayload) as raised:
        convert(payload)
    assert raised.value.index == index


# ---------------------------------------------------------------- validators

CHAT_BAD = [
    ("not a list", None, "messages must be a list"),
    ([{"role": "function", "content": "x"}], 0, "unknown role 'function'"),
    (
        [{"role": "user", "content": None}],
        0,
        "a user message needs content (null only beside tool_calls)",
    ),
    (
        [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
        0,
        "content[0]: a assistant message takes ['refusal', 'text'], not 'image_url'",
    ),
    (
        [{"role": "assistant", "content": None, "tool_calls": []}],
        0,
        "tool_calls must be a non-empty list",
    ),
    (
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
            }
        ],
        0,
        "tool_calls[0].type must be 'function'",
    ),
    (
        [
            {"role": "assistant", "content": None, "tool_calls": [weather_call()]},
            {"role": "user", "content": "x"},
        ],
        0,
        "tool calls ['call_1'] have no tool message right after their turn",
    ),
    (
        [{"role": "tool", "tool_call_id": "call_1", "content": "x"}],
        0,
        "tool_call_id 'call_1' answers no call of the assistant turn before it",
    ),
    (
        [
            {"role": "assistant", "content": None, "tool_calls": [weather_call()]},
            {"role": "tool", "tool_call_id": "call_1", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [weather_call()]},
        ],
        2,
        "tool_calls[0]: tool call id 'call_1' is used twice",
    ),
]
RESPONSES_BAD = [
    ({"input": []}, None, "input must be a list of items"),
    ([{"role": "tool", "content": "x"}], 0, "unknown message role 'tool'"),
    (
        [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}],
        0,
        "content[0]: expected one of ['output_text', 'refusal'], not 'input_text'",
    ),
    (
        [{"type": "function_call", "id": "fc_1", "name": "f", "arguments": "{}"}],
        0,
        "a function_call needs a non-empty string call_id",
    ),
    (
        [{"type": "function_call_output", "call_id": "c1", "output": "x"}],
        0,
        "no function_call before this output for call_id 'c1'",
    ),
    (
        [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}],
        0,
        "function_call 'c1' has no function_call_output",
    ),
    (
        [
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "x"},
            {"type": "function_call_output", "call_id": "c1", "output": "y"},
        ],
        2,
        "call_id 'c1' already has an output",
    ),
]
TOOL_USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
ANTHROPIC_BAD = [
    ([], None, "the payload must be an object with 'messages'"),
    (
        {"messages": [{"role": "system", "content": "x"}]},
        0,
        "role must be user or assistant, not 'system'",
    ),
    (
        {"messages": [{"role": "assistant", "content": "x"}]},
        0,
        "the first message must be a user turn",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]},
        1,
        "two user turns stand side by side",
    ),
    ({"messages": [{"role": "user", "content": " "}]}, 0, "content must hold non-whitespace text"),
    (
        {"messages": [{"role": "user", "content": [TOOL_USE]}]},
        0,
        "content[0]: a tool_use block belongs in an assistant turn",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{**TOOL_USE, "id": "call 1"}]},
            ]
        },
        1,
        "content[0]: tool_use id 'call 1' must match [a-zA-Z0-9_-]+",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [TOOL_USE]},
                {"role": "user", "content": "y"},
            ]
        },
        1,
        "tool_use ids ['t1'] have no tool_result in the next turn",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [TOOL_USE]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "y"},
                        {"type": "tool_result", "tool_use_id": "t1"},
                    ],
                },
            ]
        },
        2,
        "content[1]: tool_result blocks must come first in the turn",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]},
        0,
        "content[0]: tool_result for 't1' answers no tool_use just before",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [TOOL_USE]},
            ]
        },
        1,
        "tool_use ids ['t1'] have no tool_result in the next turn",
    ),
]


@pytest.mark.parametrize(
    ("validate", "fmt", "payload", "index", "problem"),
    [(validate_openai_chat, "openai-chat", *case) for case in CHAT_BAD]
    + [(validate_openai_responses, "openai-responses", *case) for case in RESPONSES_BAD]
    + [(validate_anthropic, "anthropic", *case) for case in ANTHROPIC_BAD],
)
def test_validators_name_the_first_offending_message(
    validate: Any, fmt: str, payload: Any, index: int | None, problem: str
) -> None:
    """Each validator raises InvalidPayload (a ValueError): format, index and rule."""
    with pytest.raises(InvalidPayload) as raised:
        validate(payload)
    assert (raised.value.format, raised.value.index, raised.value.problem) == (fmt, index, problem)
    assert isinstance(raised.value, ValueError)


# ------------------------------------------------- random histories, real store

IDS = ["c1", "c2", "c3", "0", "call 1", "x/y"]
STEP = st.one_of(
    st.tuples(st.just("user"), st.sampled_from(["hi", "", "  ", "parts", "image"])),
    st.tuples(st.just("system"), st.sampled_from(["sys", ""])),
    st.tuples(st.just("assistant"), st.sampled_from(["ok", "", "parts"])),
    st.tuples(st.just("call"), st.lists(st.sampled_from(IDS), min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("result"), st.sampled_from([*IDS, "orphan"])),
)
USER_CONTENT: dict[str, Any] = {
    "parts": [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}],
    "image": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}],
}


def build(buf: Buffer, steps: list[tuple[str, Any]]) -> None:
    for n, (kind, value) in enumerate(steps):
        if kind in ("user", "system"):
            buf.append({"role": kind, "content": USER_CONTENT.get(value, value)})
        elif kind == "assistant":
            content = [{"type": "output_text", "text": "x"}] if value == "parts" else value
            buf.append({"role": "assistant", "content": content})
        elif kind == "call":
            calls = [{"id": i, "name": "f", "arguments": {"n": n}} for i in value]
            buf.append({"role": "assistant", "content": "", "tool_calls": calls})
        else:
            content = [{"type": "text", "text": "r"}] if n % 2 else f"r{n}"
            buf.append({"role": "tool", "tool_call_id": value, "content": content})


def check_every_export(buf: Buffer, limit: int | None) -> None:
    validate_openai_chat(buf.to_openai_chat(limit))
    validate_openai_responses(buf.to_openai_responses(limit))
    validate_anthropic(buf.to_anthropic(limit))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(STEP, max_size=12), st.one_of(st.none(), st.integers(0, 8)))
def test_every_export_of_a_random_history_validates(
    store: Store, steps: list[tuple[str, Any]], limit: int | None
) -> None:
    """Property: whatever the store holds, each export, windowed or not, passes its validator."""
    buf = store.buffer("session", "random", "chat")
    buf.clear()
    build(buf, steps)
    check_every_export(buf, limit)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(STEP, max_size=10))
def test_exports_from_a_reopened_file_validate(
    tmp_path: Path, steps: list[tuple[str, Any]]
) -> None:
    """Property, on a temp file: histories read back after reopening export validly too."""
    path = tmp_path / "random.db"
    path.unlink(missing_ok=True)
    with Store(path) as store:
        build(store.buffer("session", "random", "chat"), steps)
    with Store(path) as store:
        check_every_export(store.buffer("session", "random", "chat"), None)


def test_pure_exports_take_read_dicts(buffer: Buffer) -> None:
    """The module functions are the buffer methods' work, on any list of read() dicts."""
    messages = buffer.read()
    assert to_openai_chat(messages, limit=2) == buffer.to_openai_chat(2)
    assert to_openai_responses(messages) == buffer.to_openai_responses()
    assert to_anthropic(messages) == buffer.to_anthropic()


# ----------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("fmt", "validate"),
    [
        ("openai-chat", validate_openai_chat),
        ("openai-responses", validate_openai_responses),
        ("anthropic", validate_anthropic),
    ],
)
def test_show_format_prints_the_payload(db_path: Path, fmt: str, validate: Any) -> None:
    """``show --format`` prints the JSON payload a user would send, the one the method returns."""
    with Store(db_path) as store:
        buf = store.buffer("session", "s1", "chat")
        buf.append(
            [
                {"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [weather_call()]},
                {"role": "user", "content": "hello?"},
            ]
        )
        expected = {
            "openai-chat": buf.to_openai_chat,
            "openai-responses": buf.to_openai_responses,
            "anthropic": buf.to_anthropic,
        }[fmt]()
    result = CliRunner().invoke(
        cli, ["--db", str(db_path), "show", "session", "s1", "chat", "--format", fmt]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload == expected
    validate(payload)


def test_show_format_help_names_the_formats() -> None:
    """The option is documented in the command's help."""
    result = CliRunner().invoke(cli, ["show", "--help"])
    assert "openai-chat|openai-responses|anthropic" in result.output

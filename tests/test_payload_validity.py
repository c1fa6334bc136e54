"""Every payload an exporter gives is one its validator (and the provider) accepts.

Whatever ``append`` accepted: opaque Responses items beside tool calls, ids that
Anthropic rewrites, content parts of one provider exported to another, a history
with nothing to send, a ``function_call`` stored without a name. Then a property
test over buffers built from everything ``append`` takes, windowed or not.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import Buffer, InvalidArgument, InvalidPayload, Store
from flowdrop_local.providers import (
    OPENING_USER_TEXT,
    UNNAMED_TOOL,
    item_to_message,
    validate_anthropic,
    validate_openai_chat,
    validate_openai_responses,
)
from flowdrop_local.rules import PLACEHOLDER_CONTENT

PNG = "iVBORw0KGgo="
PDF = "JVBERi0xLjQ="


def exports(buf: Buffer, limit: int | None = None) -> dict[str, Any]:
    """All three payloads, each checked by its own validator."""
    chat = buf.to_openai_chat(limit)
    validate_openai_chat(chat)
    responses = buf.to_openai_responses(limit)
    validate_openai_responses(responses)
    anthropic = buf.to_anthropic(limit)
    validate_anthropic(anthropic)
    return {"chat": chat, "responses": responses, "anthropic": anthropic}


# ------------------------------------------------ opaque items beside pairing

REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}


@pytest.mark.parametrize(
    "turn",
    [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f"}]},
        {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "c1", "name": "f"}]},
        # a function_call item that no longer says what the message declares
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "f"}, {"id": "c2", "name": "g"}],
            "metadata": {"responses_item": {"type": "function_call", "call_id": "c1", "name": "f"}},
        },
    ],
    ids=["calls only", "calls and text", "item names one of two calls"],
)
def test_a_stored_item_never_hides_the_calls_of_its_turn(
    store: Store, turn: dict[str, Any]
) -> None:
    """A turn whose metadata holds a Responses item next to its calls is exported with its
    calls (before: skipped as opaque while its results were sent, so every export failed)."""
    metadata = turn.get("metadata") or {"responses_item": REASONING}
    buf = store.buffer("session", "s1", "opaque")
    buf.append(
        [
            {"role": "user", "content": "go"},
            {**turn, "metadata": metadata},
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "tool", "tool_call_id": "c2", "content": "r2"},
            {"role": "user", "content": "next"},
        ]
    )
    payloads = exports(buf)
    assert payloads["chat"][1]["tool_calls"][0]["id"] == "c1"
    calls = [i["call_id"] for i in payloads["responses"] if i.get("type") == "function_call"]
    assert calls[0] == "c1"


def test_a_result_holding_an_opaque_item_still_answers_its_call(store: Store) -> None:
    """A tool result whose metadata holds a reasoning item is sent as the result it is."""
    buf = store.buffer("session", "s1", "opaque-result")
    buf.append(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": "r1",
                "metadata": {"responses_item": REASONING},
            },
        ]
    )
    payloads = exports(buf)
    assert payloads["chat"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "r1"}
    assert payloads["responses"][-1] == {
        "type": "function_call_output",
        "call_id": "c1",
        "output": "r1",
    }


def test_a_reasoning_item_alone_is_kept_for_responses_and_skipped_elsewhere(store: Store) -> None:
    """An entry that is only a reasoning item stays an item in Responses, nothing elsewhere."""
    buf = store.buffer("session", "s1", "reasoning")
    buf.append([{"role": "user", "content": "go"}, item_to_message(REASONING)])
    payloads = exports(buf)
    assert payloads["responses"][-1] == REASONING
    assert [m["role"] for m in payloads["chat"]] == ["user"]


# ------------------------------------------------------------ Anthropic ids


def rewritten(call_id: str) -> str:
    """The id Anthropic's export gives an id outside [a-zA-Z0-9_-]+ (first come)."""
    digest = hashlib.sha256(call_id.encode()).hexdigest()[:8]
    return f"{call_id.replace(' ', '_')}_{digest}"


@pytest.mark.parametrize(
    "ids",
    [
        ["a b", rewritten("a b")],
        [rewritten("a b"), "a b"],
        ["a b", rewritten("a b"), rewritten("a b") + "_"],
    ],
    ids=["rewrite first", "literal first", "literal and its suffix"],
)
@pytest.mark.parametrize("one_turn", [True, False], ids=["one turn", "two turns"])
def test_rewritten_anthropic_ids_never_collide(
    store: Store, ids: list[str], one_turn: bool
) -> None:
    """A declared "a b" and the literal id it rewrites to get two different tool_use ids."""
    buf = store.buffer("session", "s1", "ids")
    calls = [{"id": i, "name": "f"} for i in ids]
    turns = [calls] if one_turn else [[c] for c in calls]
    for n, turn in enumerate(turns):
        buf.append(
            [
                {"role": "user", "content": f"go {n}"},
                {"role": "assistant", "tool_calls": turn},
                *({"role": "tool", "tool_call_id": c["id"], "content": "r"} for c in turn),
            ]
        )
    payload = exports(buf)["anthropic"]
    uses = [
        b["id"]
        for m in payload["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert len(uses) == len(set(uses)) == len(ids)


# ------------------------------------------------------------ content parts

IMAGE_BLOCK = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
}
PDF_DOCUMENT = {
    "type": "document",
    "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
}
URL_DOCUMENT = {"type": "document", "source": {"type": "url", "url": "https://x.test/a.pdf"}}
TEXT_DOCUMENT = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "plain words"},
}
CHAT_FILE = {"type": "file", "file": {"file_id": "file-1"}}
CHAT_FILE_DATA = {
    "type": "file",
    "file": {"file_data": f"data:application/pdf;base64,{PDF}", "filename": "a.pdf"},
}
IMAGE_BY_ID = {"type": "input_image", "file_id": "file-2", "detail": "low"}
INPUT_FILE = {"type": "input_file", "file_id": "file-3"}
INPUT_FILE_URL = {"type": "input_file", "file_url": "https://x.test/b.pdf"}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
IMAGE_URL = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}


def stand_in(kind: str) -> dict[str, Any]:
    return {"type": "text", "text": f"[{kind} omitted]"}


def chat_part(buf: Buffer, role: str) -> Any:
    """The content of the first Chat message of ``role`` (or the tool message)."""
    return next(m for m in exports(buf)["chat"] if m["role"] == role)["content"]


# (role the part is stored under, part, Chat content, Responses content, Anthropic content)
PART_CASES: list[tuple[str, dict[str, Any], Any, Any, Any]] = [
    (
        "tool",
        IMAGE_BLOCK,
        [stand_in("image")],  # a Chat tool message takes text only
        [
            {
                "type": "input_image",
                "image_url": f"data:image/png;base64,{PNG}",
                "detail": "auto",
            }
        ],
        [IMAGE_BLOCK],
    ),
    (
        "user",
        PDF_DOCUMENT,
        [
            {
                "type": "file",
                "file": {
                    "file_data": f"data:application/pdf;base64,{PDF}",
                    "filename": "document.pdf",
                },
            }
        ],
        [
            {
                "type": "input_file",
                "file_data": f"data:application/pdf;base64,{PDF}",
                "filename": "document.pdf",
            }
        ],
        [PDF_DOCUMENT],
    ),
    (
        "user",
        URL_DOCUMENT,
        [stand_in("document")],  # Chat takes no file URL
        [{"type": "input_file", "file_url": "https://x.test/a.pdf"}],
        [URL_DOCUMENT],
    ),
    (
        "user",
        TEXT_DOCUMENT,
        [{"type": "text", "text": "plain words"}],
        [{"type": "input_text", "text": "plain words"}],
        [TEXT_DOCUMENT],
    ),
    (
        "user",
        CHAT_FILE,
        [CHAT_FILE],
        [{"type": "input_file", "file_id": "file-1"}],
        [stand_in("file")],  # an OpenAI file id means nothing to Anthropic
    ),
    (
        "user",
        CHAT_FILE_DATA,
        [CHAT_FILE_DATA],
        [
            {
                "type": "input_file",
                "file_data": f"data:application/pdf;base64,{PDF}",
                "filename": "a.pdf",
            }
        ],
        [PDF_DOCUMENT],
    ),
    ("user", IMAGE_BY_ID, [stand_in("input_image")], [IMAGE_BY_ID], [stand_in("input_image")]),
    (
        "user",
        INPUT_FILE,
        [{"type": "file", "file": {"file_id": "file-3"}}],
        [INPUT_FILE],
        [stand_in("input_file")],
    ),
    (
        "user",
        INPUT_FILE_URL,
        [stand_in("input_file")],
        [INPUT_FILE_URL],
        [{"type": "document", "source": {"type": "url", "url": "https://x.test/b.pdf"}}],
    ),
    (
        "user",
        AUDIO,
        [AUDIO],
        [{"type": "input_text", "text": "[input_audio omitted]"}],
        [stand_in("input_audio")],
    ),
    (
        "user",
        {"type": "video", "url": "v"},
        [stand_in("video")],
        [{"type": "input_text", "text": "[video omitted]"}],
        [stand_in("video")],
    ),
    (
        "assistant",
        IMAGE_URL,
        [stand_in("image_url")],
        [{"type": "output_text", "text": "[image_url omitted]", "annotations": []}],
        [stand_in("image_url")],
    ),
    (
        "system",
        IMAGE_URL,
        [stand_in("image_url")],
        [{"type": "input_text", "text": "[image_url omitted]"}],
        [stand_in("image_url")],
    ),
]


def anthropic_content(payload: dict[str, Any], role: str) -> Any:
    if role == "system":
        system = payload["system"]
        return [{"type": "text", "text": system}] if isinstance(system, str) else system
    if role == "tool":
        return payload["messages"][2]["content"][0]["content"]
    message = next(m for m in payload["messages"] if m["role"] == role)
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


@pytest.mark.parametrize(
    ("role", "part", "chat", "responses", "anthropic"),
    PART_CASES,
    ids=[
        "image in a tool result",
        "pdf document",
        "url document",
        "text document",
        "chat file by id",
        "chat file data",
        "input_image by file_id",
        "input_file by id",
        "input_file by url",
        "audio",
        "unknown part",
        "image in an assistant turn",
        "image in a system turn",
    ],
)
def test_content_parts_are_mapped_or_stood_in_for(
    store: Store, role: str, part: dict[str, Any], chat: Any, responses: Any, anthropic: Any
) -> None:
    """Each part becomes its equivalent in the target format, or a text saying what was left
    out; never a part the format does not take."""
    buf = store.buffer("session", "s1", "parts")
    stored = {"role": role, "content": [part]}
    if role == "tool":
        buf.append(
            [
                {"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},
                {**stored, "tool_call_id": "c1"},
            ]
        )
    else:
        buf.append([{"role": "user", "content": "go"}, stored])
    payloads = exports(buf)
    chat_message = next(
        m
        for m in payloads["chat"]
        if m["role"] == role and (role != "user" or m["content"] != "go")
    )
    assert chat_message["content"] == chat
    if role == "tool":
        got = next(i for i in payloads["responses"] if i.get("type") == "function_call_output")
        assert got["output"] == responses
    else:
        items = [i for i in payloads["responses"] if i.get("role") == role]
        assert items[-1]["content"] == responses
    got_anthropic = anthropic_content(payloads["anthropic"], role)
    if role == "user":
        got_anthropic = got_anthropic[1:]  # after "go"
    assert got_anthropic == anthropic


@pytest.mark.parametrize(
    "part",
    [{"type": "text"}, {"type": "input_text", "text": None}, {"type": "output_text", "text": 5}],
    ids=["no text", "null text", "number text"],
)
def test_a_text_part_without_text_is_left_out(store: Store, part: dict[str, Any]) -> None:
    """A text part with no string text carries nothing: every export leaves it out."""
    buf = store.buffer("session", "s1", "textless")
    buf.append(
        [
            {"role": "user", "content": [part, {"type": "text", "text": "kept"}]},
            {"role": "assistant", "content": [part]},
        ]
    )
    payloads = exports(buf)
    assert payloads["chat"][0]["content"] == [{"type": "text", "text": "kept"}]
    assert payloads["responses"][0]["content"] == [{"type": "input_text", "text": "kept"}]
    assert payloads["anthropic"]["messages"] == [{"role": "user", "content": "kept"}]


ANTHROPIC_BLOCK_CASES = [
    ({"type": "video", "url": "v"}, "content[0]: 'video' is not a block type of the Messages API"),
    (
        {"type": "input_text", "text": "x"},
        "content[0]: 'input_text' is not a block type of the Messages API",
    ),
    (
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "input_image"}]},
        "content[0].content[0]: a tool_result holds ['browser_state', 'document', 'image', "
        "'search_result', 'text', 'tool_reference'], not 'input_image'",
    ),
]


@pytest.mark.parametrize(("block", "problem"), ANTHROPIC_BLOCK_CASES)
def test_validate_anthropic_refuses_block_types_the_api_does_not_define(
    block: dict[str, Any], problem: str
) -> None:
    """A block type outside the anthropic package's ContentBlockParam is InvalidPayload."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [block]}]
    if block["type"] == "tool_result":
        messages = [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
            },
            *messages,
        ]
    with pytest.raises(InvalidPayload) as raised:
        validate_anthropic({"messages": messages})
    assert raised.value.problem == problem


def test_validate_anthropic_takes_thinking_and_the_types_it_defines() -> None:
    """thinking and redacted_thinking (which exports keep) and user-side blocks validate."""
    validate_anthropic(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [PDF_DOCUMENT, IMAGE_BLOCK, {"type": "text", "text": "q"}],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "redacted_thinking", "data": "x"},
                        {"type": "text", "text": "a"},
                    ],
                },
            ]
        }
    )


# ----------------------------------------------------- nothing to send, names


@pytest.mark.parametrize(
    "history",
    [[], [{"role": "user", "content": ""}], [{"role": "system", "content": "sys"}]],
    ids=["empty buffer", "empty user turn", "system only"],
)
def test_an_anthropic_payload_always_holds_a_turn(store: Store, history: list[Any]) -> None:
    """Anthropic refuses an empty messages list: a history with no turn to send gets the
    opening user turn alone (the validator refuses the empty list)."""
    buf = store.buffer("session", "s1", "empty")
    if history:
        buf.append(history)
    payload = exports(buf)["anthropic"]
    assert payload["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": OPENING_USER_TEXT}]}
    ] or payload["messages"] == [{"role": "user", "content": OPENING_USER_TEXT}]
    with pytest.raises(InvalidPayload, match="messages must not be empty"):
        validate_anthropic({"messages": []})


@pytest.mark.parametrize(
    "call",
    [
        {"type": "function_call", "call_id": "c1", "arguments": "{}"},
        {"type": "function_call", "call_id": "c1", "name": "", "arguments": "{}"},
        {"type": "function_call", "call_id": "c1", "name": None, "arguments": {"a": 1}},
    ],
    ids=["no name", "empty name", "null name, object arguments"],
)
def test_a_function_call_stored_without_a_name_goes_out_as_unnamed_tool(
    store: Store, call: dict[str, Any]
) -> None:
    """The stored item is re-sent with the name unnamed_tool and JSON-text arguments."""
    buf = store.buffer("session", "s1", "unnamed")
    buf.append(
        [
            {"role": "user", "content": "go"},
            item_to_message({**call, "id": "fc_1"}),
            item_to_message({"type": "function_call_output", "call_id": "c1", "output": "r"}),
        ]
    )
    item = exports(buf)["responses"][1]
    assert item["name"] == UNNAMED_TOOL and item["id"] == "fc_1"
    assert isinstance(item["arguments"], str)


# ------------------------------------------------------------------ windows


def test_a_windowed_export_reads_only_its_window(store: Store) -> None:
    """limit=20 reads about 20 messages, never the whole buffer (before: all 4,000)."""
    buf = store.buffer("session", "s1", "long")
    turn = 0
    batch: list[dict[str, Any]] = []
    for turn in range(1000):
        batch += [
            {"role": "user", "content": f"q{turn}"},
            {"role": "assistant", "tool_calls": [{"id": f"c{turn}", "name": "f"}]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "r"},
            {"role": "assistant", "content": f"a{turn}"},
        ]
    buf.append(batch)
    sizes: list[int | None] = []
    read_plan = buf.read_plan  # the window's reads are this plan's (Buffer.last_turns_plan)

    def counting_read_plan(limit: int | None = None, **kwargs: Any) -> Any:
        rows = yield from read_plan(limit, **kwargs)
        sizes.append(len(rows))
        return rows

    buf.read_plan = counting_read_plan  # type: ignore[method-assign]
    payloads = exports(buf, 20)
    assert payloads["chat"][0] == {"role": "user", "content": "q995"}
    assert max(sizes) <= 40
    assert payloads["chat"] == to_chat_of(buf, buf.read(), 20)


def to_chat_of(buf: Buffer, messages: list[dict[str, Any]], limit: int) -> Any:
    from flowdrop_local.providers import to_openai_chat

    return to_openai_chat(messages, limit=limit)


@pytest.mark.parametrize("limit", [2**63, 10**30])
def test_a_limit_past_64_bits_means_everything(store: Store, limit: int) -> None:
    """A limit a database cannot bind reads everything (before: OverflowError from sqlite3)."""
    buf = store.buffer("session", "s1", "x")
    buf.append({"role": "user", "content": "hi"})
    assert buf.read(limit) == buf.read()
    assert buf.messages(limit) == buf.messages()
    assert buf.to_openai_chat(limit) == buf.to_openai_chat()
    assert buf.to_anthropic(limit) == buf.to_anthropic()


def test_a_negative_limit_is_invalid_argument(store: Store) -> None:
    """A negative limit, however large, is InvalidArgument."""
    buf = store.buffer("session", "s1", "x")
    for call in (buf.read, buf.messages, buf.to_openai_chat, buf.to_anthropic):
        with pytest.raises(InvalidArgument, match="limit"):
            call(-(2**70))


# ---------------------------------------------------------------- property

PARTS: list[dict[str, Any]] = [
    {"type": "text", "text": "t"},
    {"type": "text", "text": " "},
    {"type": "text"},
    {"type": "input_text", "text": "it"},
    {"type": "output_text", "text": "ot", "annotations": []},
    {"type": "refusal", "refusal": "no"},
    IMAGE_URL,
    {"type": "image_url", "image_url": "https://x.test/i.png"},
    {"type": "input_image", "image_url": "https://x.test/i.png"},
    IMAGE_BY_ID,
    IMAGE_BLOCK,
    {"type": "image", "source": {"type": "url", "url": "https://x.test/i.png"}},
    {"type": "image", "source": {"type": "file", "file_id": "file_a"}},
    PDF_DOCUMENT,
    URL_DOCUMENT,
    TEXT_DOCUMENT,
    {"type": "document", "source": {"type": "file", "file_id": "file_a"}},
    CHAT_FILE,
    CHAT_FILE_DATA,
    {"type": "file", "file": "not an object"},
    INPUT_FILE,
    INPUT_FILE_URL,
    {"type": "input_file", "file_data": "data:text/plain;base64,aGk=", "filename": "a.txt"},
    {"type": "input_file"},
    AUDIO,
    {"type": "search_result", "source": "s", "title": "t", "content": []},
    {"type": "container_upload", "file_id": "f"},
    {"type": "web_search_tool_result", "tool_use_id": "srv", "content": []},
    {"type": "thinking", "thinking": "hmm", "signature": "s"},
    {"type": "redacted_thinking", "data": "x"},
    {"type": "reasoning", "text": "r"},
    {"type": "summary_text", "text": "s"},
    {"type": "video", "url": "v"},
]
ODD_IDS = ["c1", "c2", "0", "a b", rewritten("a b"), "x/y", "é", "c1 "]
CONTENT = st.one_of(
    st.sampled_from(["hi", "", "  ", PLACEHOLDER_CONTENT]),
    st.lists(st.sampled_from(PARTS), max_size=3),
)
OPAQUE = st.sampled_from(
    [
        None,
        REASONING,
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "function_call", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c2", "output": {"bad": 1}},
        {"type": "message", "role": "user", "content": 5},
    ]
)


@st.composite
def flat_message(draw: Any) -> dict[str, Any]:
    """A message in the flat shape (calls as Chat, spec or Anthropic spellings)."""
    role = draw(st.sampled_from(["user", "assistant", "system", "tool"]))
    message: dict[str, Any] = {"role": role, "content": draw(CONTENT)}
    metadata: dict[str, Any] = {}
    if role == "tool":
        message["tool_call_id"] = draw(st.sampled_from([*ODD_IDS, "orphan"]))
    if role == "assistant" and draw(st.booleans()):
        ids = draw(st.lists(st.sampled_from(ODD_IDS), min_size=1, max_size=3))
        spelling = draw(st.sampled_from(["chat", "spec", "bare"]))
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            if spelling == "chat"
            else {"tool_call_id": i, "name": "g", "arguments": {"n": 1}}
            if spelling == "spec"
            else {"id": i}
            for i in ids
        ]
    opaque = draw(OPAQUE)
    if opaque is not None:
        metadata["responses_item"] = opaque
    if role == "tool" and draw(st.booleans()):
        metadata["is_error"] = True
    if metadata:
        message["metadata"] = metadata
    return message


CHAT_INPUT = st.lists(
    st.sampled_from(
        [
            [{"role": "user", "content": "q"}],
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "k1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "k1", "content": [IMAGE_URL]},
            ],
        ]
    ),
    max_size=2,
)
ANTHROPIC_INPUT = st.sampled_from(
    [
        [
            {"role": "user", "content": [PDF_DOCUMENT, {"type": "text", "text": "q"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "h", "signature": "s"},
                    {"type": "tool_use", "id": "t 1", "name": "f", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t 1", "content": [IMAGE_BLOCK]},
                ],
            },
        ]
    ]
)
ITEMS_INPUT = st.lists(
    st.sampled_from(
        [
            {"role": "user", "content": [INPUT_FILE, IMAGE_BY_ID]},
            REASONING,
            {"type": "function_call", "call_id": "r1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "r2", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "r1", "output": "ok"},
            {"type": "function_call_output", "call_id": "r2", "output": PLACEHOLDER_CONTENT},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
            },
        ]
    ),
    max_size=4,
)
STEP = st.one_of(
    st.tuples(st.just("flat"), st.lists(flat_message(), min_size=1, max_size=3)),
    st.tuples(st.just("chat"), CHAT_INPUT),
    st.tuples(st.just("anthropic"), ANTHROPIC_INPUT),
    st.tuples(st.just("items"), ITEMS_INPUT),
    st.tuples(st.just("pop"), st.none()),
)


def apply(buf: Buffer, kind: str, value: Any) -> None:
    from flowdrop_local.providers import from_anthropic, from_openai_chat

    if kind == "flat":
        batch = value
    elif kind == "chat":
        batch = from_openai_chat([m for group in value for m in group])
    elif kind == "anthropic":
        batch = from_anthropic(value)
    elif kind == "items":
        batch = [item_to_message(item) for item in value]
    else:
        buf.pop()
        return
    with contextlib.suppress(ValueError):  # refused as a whole: nothing was written
        buf.append(batch)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(STEP, max_size=8),
    st.one_of(st.none(), st.integers(1, 12)),
    st.one_of(st.none(), st.integers(0, 12)),
)
def test_every_export_of_anything_append_accepts_validates(
    store: Store, steps: list[tuple[str, Any]], buffer_window: int | None, limit: int | None
) -> None:
    """Property: buffers built from every input shape, part type, opaque item and odd id,
    with or without a window, give three valid payloads, whole and with any limit."""
    buf = store.buffer("session", "prop", "chat", window=buffer_window)
    buf.clear()
    for kind, value in steps:
        apply(buf, kind, value)
    exports(buf)
    exports(buf, limit)


def test_a_windowed_export_keeps_the_system_prompt(store: Store) -> None:
    """The system messages that open a long history go out with any window, read from the
    head of the buffer (not by reading it all)."""
    buf = store.buffer("session", "s1", "prompted")
    buf.append(
        [{"role": "system", "content": "be brief"}, {"role": "system", "content": "in French"}]
        + [
            message
            for i in range(300)
            for message in (
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": f"a{i}"},
            )
        ]
    )
    chat = buf.to_openai_chat(limit=2)
    assert [m["content"] for m in chat] == ["be brief", "in French", "q299", "a299"]
    anthropic = buf.to_anthropic(limit=2)
    assert "be brief" in str(anthropic["system"]) and len(anthropic["messages"]) == 2
    responses = buf.to_openai_responses(limit=2)
    assert responses[0]["content"] == "be brief"
    validate_openai_chat(chat)
    validate_anthropic(anthropic)
    validate_openai_responses(responses)

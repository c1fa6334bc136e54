"""What every exporter shares: the window, MEM-5, and content parts.

An export runs in two steps over ``Buffer.read()`` dicts (pure, no I/O):

1. :func:`window`: the last ``limit`` messages, widened to whole turns;
2. MEM-5 :func:`~flowdrop_local.rules.normalize.normalize`: system messages
   first, results right after their turn (a result stored *before* its call, which
   the store's MEM-3 ledger counts as the answer, included), a placeholder for
   each call with no result anywhere (mid-loop history stays sendable), orphans
   and duplicates dropped.

Then each format maps the messages; content parts are mapped part by part, never
flattened to text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..errors import InvalidArgument, shown
from ..model import ToolCall
from ..rules.normalize import Message, normalize
from ..rules.pairing import call_id_of, is_usable_call_id

# A declared call without a name still needs one to be sent; providers require it.
UNNAMED_TOOL: Final = "unnamed_tool"
# Metadata key under which the Agents SDK session keeps a Responses item verbatim.
RESPONSES_ITEM: Final = "responses_item"
RESPONSES_MESSAGE_TYPES: Final = frozenset({"message", "function_call", "function_call_output"})
TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})
IMAGE_PARTS: Final = frozenset({"image_url", "input_image", "image"})
# Reasoning belongs to the provider that produced it (signed or encrypted): it is
# not carried into another provider's format.
REASONING_PARTS: Final = frozenset(
    {"thinking", "redacted_thinking", "reasoning", "reasoning_text", "summary_text"}
)
_DATA_URL = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)


# ---------------------------------------------------------------- windowing


def window(messages: Sequence[Message], limit: int | None) -> list[Message]:
    """The last ``limit`` messages, widened so that the window is whole turns.

    The start moves back to the user message that opens its turn (or to the
    first message), and further back while a call in the window has a result
    before it, or a result in the window answers a call before it: a payload
    never starts with a result whose call was cut off, and never separates a call
    from its results. System messages are instructions, not turns: every one of
    them is kept, wherever it stood. ``limit=None`` is the whole list.

    Raises:
        ValueError: ``limit`` is not a non-negative integer.
    """
    if limit is None:
        return list(messages)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidArgument(f"limit must be a non-negative integer or None, got {shown(limit)}")
    declared_at: dict[str, int] = {}
    answered_at: dict[str, int] = {}
    for index, message in enumerate(messages):
        metadata = message.get("metadata") or {}
        if message.get("role") == "tool":
            call_id = metadata.get("tool_call_id")
            if isinstance(call_id, str):
                answered_at.setdefault(call_id, index)
        for call in metadata.get("tool_calls") or ():
            call_id = call_id_of(call) if isinstance(call, Mapping) else None
            if is_usable_call_id(call_id):
                assert isinstance(call_id, str)
                declared_at.setdefault(call_id, index)
    start = max(len(messages) - limit, 0) if limit else len(messages)
    while limit:
        while start > 0 and messages[start].get("role") != "user":
            start -= 1
        earliest = start
        for message in messages[start:]:
            metadata = message.get("metadata") or {}
            ids: list[Any] = [metadata.get("tool_call_id")] if message.get("role") == "tool" else []
            ids += [
                call_id_of(c) for c in metadata.get("tool_calls") or () if isinstance(c, Mapping)
            ]
            for call_id in ids:
                if isinstance(call_id, str):
                    earliest = min(
                        earliest,
                        declared_at.get(call_id, start),
                        answered_at.get(call_id, start),
                    )
        if earliest == start:
            break
        start = earliest
    return [m for m in messages[:start] if m.get("role") == "system"] + list(messages[start:])


def prepare(messages: Sequence[Message], limit: int | None = None) -> list[Message]:
    """Window and normalise (MEM-5): the sendable flat history."""
    return normalize(window(messages, limit))[0]


# ------------------------------------------------------------ reading messages


def responses_item(message: Message) -> dict[str, Any] | None:
    """The Responses item the Agents SDK session stored for this message, if any."""
    item = message["metadata"].get(RESPONSES_ITEM)
    return item if isinstance(item, dict) else None


def is_opaque(message: Message) -> bool:
    """True for a stored Responses item with no chat meaning (reasoning, hosted calls).

    Only the Responses export carries it; the others skip it.
    """
    item = responses_item(message)
    return item is not None and item.get("type", "message") not in RESPONSES_MESSAGE_TYPES


def tool_calls(message: Message) -> list[ToolCall]:
    """The calls an assistant turn declares, read through either id spelling (MEM-11)."""
    calls = message["metadata"].get("tool_calls") or ()
    return [ToolCall.from_declaration(c) for c in calls if isinstance(c, Mapping)]


def call_name(call: ToolCall) -> str:
    """The call's name, or :data:`UNNAMED_TOOL` when the stored call has none."""
    return call.name if call.name and call.name.strip() else UNNAMED_TOOL


def arguments_text(arguments: object) -> str:
    """Arguments as the JSON text OpenAI sends: kept if text, ``{}`` if absent."""
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return "{}"
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError):
        return "{}"


def arguments_object(arguments: object) -> dict[str, Any]:
    """Arguments as the JSON object Anthropic's ``tool_use.input`` needs.

    An object is kept; JSON text of an object is parsed; absent is ``{}``; any
    other value is kept under ``"arguments"`` rather than lost.
    """
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {"arguments": arguments}
        return parsed if isinstance(parsed, dict) else {"arguments": parsed}
    return {"arguments": arguments}


# --------------------------------------------------------------- content parts


def part_text(part: Mapping[str, Any]) -> str | None:
    """The text of a text-like part (``text``, ``input_text``, ``output_text``)."""
    text = part.get("text")
    return text if part.get("type") in TEXT_PARTS and isinstance(text, str) else None


def part_image_url(part: Mapping[str, Any]) -> str | None:
    """The URL (or ``data:`` URL) of an image part in any of the three formats."""
    kind = part.get("type")
    if kind == "image_url":
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, Mapping) else value
        return url if isinstance(url, str) else None
    if kind == "input_image":
        url = part.get("image_url")
        return url if isinstance(url, str) else None
    if kind == "image":
        source = part.get("source")
        if isinstance(source, Mapping):
            if source.get("type") == "base64":
                media, data = source.get("media_type"), source.get("data")
                if isinstance(media, str) and isinstance(data, str):
                    return f"data:{media};base64,{data}"
            elif source.get("type") == "url" and isinstance(source.get("url"), str):
                return str(source["url"])
    return None


def anthropic_image_source(url: str) -> dict[str, Any]:
    """An Anthropic image ``source`` for a URL or a base64 ``data:`` URL."""
    match = _DATA_URL.fullmatch(url)
    if match:
        return {"type": "base64", "media_type": match["media"], "data": match["data"]}
    return {"type": "url", "url": url}

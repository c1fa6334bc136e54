"""OpenAI Responses: input items from stored messages, and back; validation.

A call is a ``function_call`` item and its result a ``function_call_output``
item, paired by ``call_id``. A ``function_call`` item's own ``id`` (``fc_...``)
names the item, not the call: it is never read as the call id.

The Agents SDK session (:mod:`flowdrop_local.integrations.openai_agents`) stores
one item per message with :func:`item_to_message`, keeping the item itself under
``metadata.responses_item``, and reads it back with :func:`message_to_items`, so
its history round-trips exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..errors import InvalidPayload
from ..rules.normalize import Message
from ..rules.pairing import PLACEHOLDER_CONTENT, is_placeholder
from ._common import (
    IMAGE_PARTS,
    REASONING_PARTS,
    RESPONSES_ITEM,
    arguments_text,
    call_name,
    part_image_url,
    part_text,
    prepare,
    responses_item,
    tool_calls,
)

FORMAT: Final = "openai-responses"
_MESSAGE_ROLES: Final = frozenset({"user", "assistant", "system", "developer"})
_INPUT_PARTS: Final = frozenset({"input_text", "input_image", "input_file", "input_audio"})
_OUTPUT_PARTS: Final = frozenset({"output_text", "refusal"})
_RESULT_PARTS: Final = frozenset({"input_text", "input_image", "input_file"})


# ------------------------------------------------------------ items <-> messages


def item_to_message(item: Mapping[str, Any]) -> dict[str, Any]:
    """The stored message for one Responses input item, the item kept in metadata.

    * a message item (``role`` user, system, developer, assistant) is a message
      of that role (``developer`` stored as ``system``) with its content;
    * ``function_call`` is an assistant turn declaring one call whose id is
      ``call_id`` (spec shape ``{"tool_call_id", "name", "arguments"}``);
    * ``function_call_output`` is a ``tool`` result for ``call_id``;
    * any other item (reasoning, hosted tool calls, references) is an
      assistant entry with empty content: it never heals or pairs anything.

    Content and output are stored once: the kept item omits them unless they are
    neither text nor a list.
    """
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message" and item.get("role") in _MESSAGE_ROLES:
        role = "system" if item["role"] == "developer" else item["role"]
        return _with_item(role, item, "content", {})
    if kind == "function_call":
        call = {
            "tool_call_id": item.get("call_id"),
            "name": item.get("name"),
            "arguments": item.get("arguments"),
        }
        return {
            "role": "assistant",
            "content": "",
            "metadata": {"tool_calls": [call], RESPONSES_ITEM: dict(item)},
        }
    if kind == "function_call_output":
        return _with_item("tool", item, "output", {"tool_call_id": item.get("call_id")})
    return {"role": "assistant", "content": "", "metadata": {RESPONSES_ITEM: dict(item)}}


def _with_item(
    role: str, item: Mapping[str, Any], field: str, metadata: dict[str, Any]
) -> dict[str, Any]:
    value = item.get(field)
    if isinstance(value, str | list):
        kept = {k: v for k, v in item.items() if k != field}
        return {"role": role, "content": value, "metadata": {**metadata, RESPONSES_ITEM: kept}}
    return {"role": role, "content": "", "metadata": {**metadata, RESPONSES_ITEM: dict(item)}}


def message_to_items(message: Message) -> list[dict[str, Any]]:
    """The Responses items for one stored message.

    A message stored by :func:`item_to_message` gives back its item exactly (a
    real result that replaced a placeholder in place (MEM-10) included); a healed
    placeholder gives a ``function_call_output`` stating the interruption; any
    other message is mapped: text and parts to a message item, each declared call
    to a ``function_call``, a result to a ``function_call_output``.
    """
    item = responses_item(message)
    if item is not None:
        restored = copy.deepcopy(item)
        field = "output" if restored.get("type") == "function_call_output" else "content"
        if field not in restored and (field == "output" or "role" in restored):
            restored[field] = copy.deepcopy(message["content"])
        return [restored]
    role, content, metadata = message["role"], message["content"], message["metadata"]
    if role == "tool":
        if is_placeholder(message):
            output: str | list[Any] = PLACEHOLDER_CONTENT
        else:
            output = content if isinstance(content, str) else _parts(content, _RESULT_PARTS)
        return [
            {
                "type": "function_call_output",
                "call_id": metadata.get("tool_call_id"),
                "output": output,
            }
        ]
    items: list[dict[str, Any]] = []
    if isinstance(content, str):
        if content or role != "assistant":
            items.append({"role": role, "content": content})
    else:
        allowed = _OUTPUT_PARTS if role == "assistant" else _INPUT_PARTS
        parts = _parts(content, allowed, output=role == "assistant")
        if parts or role != "assistant":
            items.append({"role": role, "content": parts or ""})
    for call in tool_calls(message) if role == "assistant" else ():
        items.append(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call_name(call),
                "arguments": arguments_text(call.arguments),
            }
        )
    return items


def _parts(content: list[Any], allowed: frozenset[str], *, output: bool = False) -> list[Any]:
    parts: list[Any] = []
    for part in content:
        kind = part.get("type")
        text = part_text(part)
        if text is not None:
            if output:
                parts.append({"type": "output_text", "text": text, "annotations": []})
            else:
                parts.append({"type": "input_text", "text": text})
        elif kind in IMAGE_PARTS and (url := part_image_url(part)) is not None and not output:
            detail = part.get("detail")
            parts.append(
                {
                    "type": "input_image",
                    "image_url": url,
                    "detail": detail if isinstance(detail, str) else "auto",
                }
            )
        elif kind not in REASONING_PARTS:
            parts.append(dict(part))
    return parts


def to_openai_responses(
    messages: Sequence[Message], *, limit: int | None = None
) -> list[dict[str, Any]]:
    """Responses ``input`` items for stored messages (``Buffer.read()`` dicts).

    Each result follows its call; items the Agents SDK session stored come back
    as they were given. ``limit`` as for
    :func:`~flowdrop_local.providers.openai_chat.to_openai_chat`.
    """
    items: list[dict[str, Any]] = []
    for message in prepare(messages, limit):
        items.extend(message_to_items(message))
    return items


# ------------------------------------------------------------------ validation


def _fail(index: int | None, problem: str) -> InvalidPayload:
    return InvalidPayload(FORMAT, index, problem)


def _check_parts(index: int, where: str, parts: list[Any], allowed: frozenset[str]) -> None:
    for position, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in allowed:
            raise _fail(
                index, f"{where}[{position}]: expected one of {sorted(allowed)}, not {kind!r}"
            )
        if kind in ("input_text", "output_text") and not isinstance(part.get("text"), str):
            raise _fail(index, f"{where}[{position}]: a {kind} part needs a string 'text'")
        if kind == "input_image" and not (
            isinstance(part.get("image_url"), str) or isinstance(part.get("file_id"), str)
        ):
            raise _fail(
                index, f"{where}[{position}]: an input_image part needs image_url or file_id"
            )


def validate_openai_responses(items: object) -> None:
    """Raise unless ``items`` is a Responses ``input`` list the API accepts.

    Rules checked: a list of objects, each a message or with a string ``type``;
    a message's role is user, assistant, system or developer and its content a
    string or a list of parts (``output_text``/``refusal`` for assistant,
    ``input_text``/``input_image``/``input_file``/``input_audio`` otherwise); a
    ``function_call`` has a non-empty string ``call_id`` never used by another
    call, a non-empty ``name`` and string ``arguments``; a
    ``function_call_output`` has the ``call_id`` of a call before it, answered
    once, and an output that is a string or a list of input parts; every
    ``function_call`` has its output. Other item types are passed unchecked.

    Raises:
        InvalidPayload: names the first offending item.
    """
    if not isinstance(items, list):
        raise _fail(None, "input must be a list of items")
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise _fail(index, "an item must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if not isinstance(kind, str):
            raise _fail(index, "an item needs a string 'type' (or a 'role')")
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise _fail(index, f"unknown message role {role!r}")
            content = item.get("content")
            if isinstance(content, list):
                _check_parts(
                    index,
                    "content",
                    content,
                    _OUTPUT_PARTS if role == "assistant" else _INPUT_PARTS,
                )
            elif not isinstance(content, str):
                raise _fail(index, "message content must be a string or a list of parts")
        elif kind == "function_call":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _fail(index, "a function_call needs a non-empty string call_id")
            if call_id in calls:
                raise _fail(index, f"call_id {call_id!r} is used by two function_call items")
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise _fail(index, "a function_call needs a non-empty name")
            if not isinstance(item.get("arguments"), str):
                raise _fail(index, "function_call arguments must be a string")
            calls[call_id] = index
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in calls:
                raise _fail(index, f"no function_call before this output for call_id {call_id!r}")
            if call_id in answered:
                raise _fail(index, f"call_id {call_id!r} already has an output")
            answered.add(call_id)
            output = item.get("output")
            if isinstance(output, list):
                _check_parts(index, "output", output, _RESULT_PARTS)
            elif not isinstance(output, str):
                raise _fail(index, "output must be a string or a list of parts")
    for call_id, index in calls.items():
        if call_id not in answered:
            raise _fail(index, f"function_call {call_id!r} has no function_call_output")

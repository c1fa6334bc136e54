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
from ..rules.normalize import ROLE_ALIASES, MessageDict, is_empty_content
from ..rules.pairing import (
    PLACEHOLDER_CONTENT,
    is_placeholder,
    is_usable_call_id,
    placeholder_message,
)
from ._common import (
    IMAGE_PARTS,
    REASONING_PARTS,
    RESPONSES_ITEM,
    RESPONSES_MESSAGE_TYPES,
    TEXT_PARTS,
    UNNAMED_TOOL,
    arguments_text,
    call_name,
    document_text,
    omitted,
    part_file,
    part_image_file_id,
    part_image_url,
    part_text,
    prepare,
    refusal_text,
    responses_item,
    tool_calls,
)

FORMAT: Final = "openai-responses"
_MESSAGE_ROLES: Final = frozenset({"user", "assistant", "system", "developer"})
_INPUT_PARTS: Final = frozenset({"input_text", "input_image", "input_file"})
_OUTPUT_PARTS: Final = frozenset({"output_text", "refusal"})
_RESULT_PARTS: Final = frozenset({"input_text", "input_image", "input_file"})
_SYSTEM_PARTS: Final = frozenset({"input_text"})


# ------------------------------------------------------------ items <-> messages


def item_to_message(item: Mapping[str, Any]) -> dict[str, Any]:
    """The stored message for one Responses input item, the item kept in metadata.

    * a message item (``role`` user, system, developer, assistant) is a message
      of that role (``developer`` stored as ``system``) with its content;
    * ``function_call`` is an assistant turn declaring one call whose id is
      ``call_id`` (spec shape ``{"tool_call_id", "name", "arguments"}``);
    * ``function_call_output`` is a ``tool`` result for ``call_id``; one whose
      output is exactly the placeholder text (:data:`PLACEHOLDER_CONTENT`, what
      :func:`message_to_items` gives for a healed placeholder) is that
      placeholder again, marked healed;
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
        call_id = item.get("call_id")
        if item.get("output") == PLACEHOLDER_CONTENT and is_usable_call_id(call_id):
            # The placeholder text is the item form of a healed placeholder: it
            # stays one, so a later real output still replaces it (MEM-10).
            assert isinstance(call_id, str)
            return placeholder_message(call_id)
        return _with_item("tool", item, "output", {"tool_call_id": call_id})
    return {"role": "assistant", "content": "", "metadata": {RESPONSES_ITEM: dict(item)}}


def _with_item(
    role: str, item: Mapping[str, Any], field: str, metadata: dict[str, Any]
) -> dict[str, Any]:
    value = item.get(field)
    if isinstance(value, str | list):
        kept = {k: v for k, v in item.items() if k != field}
        return {"role": role, "content": value, "metadata": {**metadata, RESPONSES_ITEM: kept}}
    return {"role": role, "content": "", "metadata": {**metadata, RESPONSES_ITEM: dict(item)}}


def message_to_items(message: MessageDict) -> list[dict[str, Any]]:
    """The Responses items for one stored message.

    A message stored by :func:`item_to_message` gives back its item exactly (a
    real result that replaced a placeholder in place (MEM-10) included), as long
    as the item still says what the message says and is one the API takes (a
    ``function_call`` stored without a name goes out as ``unnamed_tool``); a
    reasoning or hosted-tool item is followed by the message's own content and
    calls, if it has any. A healed placeholder gives a ``function_call_output``
    stating the interruption; any other message is mapped: text and parts to a
    message item, each declared call to a ``function_call``, a result to a
    ``function_call_output``.
    """
    item = responses_item(message)
    if item is not None:
        restored = _restored(item, message)
        if restored.get("type", "message") not in RESPONSES_MESSAGE_TYPES:
            mapped = _mapped(message)
            return [restored, *mapped] if message["role"] == "assistant" else mapped
        if _fits(restored, message):
            return [restored]
    return _mapped(message)


def _restored(item: Mapping[str, Any], message: MessageDict) -> dict[str, Any]:
    restored = copy.deepcopy(dict(item))
    kind = restored.get("type", "message" if "role" in restored else None)
    field = "output" if kind == "function_call_output" else "content"
    if field not in restored and (field == "output" or "role" in restored):
        restored[field] = copy.deepcopy(message["content"])
    if kind == "function_call":
        name = restored.get("name")
        if not isinstance(name, str) or not name.strip():
            restored["name"] = UNNAMED_TOOL
        if not isinstance(restored.get("arguments"), str):
            restored["arguments"] = arguments_text(restored.get("arguments"))
    return restored


def _fits(item: dict[str, Any], message: MessageDict) -> bool:
    """True when ``item`` says what ``message`` says, and the API takes it."""
    role, metadata = message["role"], message["metadata"]
    kind = item.get("type", "message")
    calls = tool_calls(message) if role == "assistant" else []
    if kind == "function_call":
        same = [call.id for call in calls] == [item.get("call_id")]
        if not same or not is_empty_content(message["content"]):
            return False
    elif kind == "function_call_output":
        if role != "tool" or metadata.get("tool_call_id") != item.get("call_id"):
            return False
    else:
        item_role = item.get("role")
        if calls or role == "tool" or ROLE_ALIASES.get(str(item_role), item_role) != role:
            return False
    try:
        _check_item(0, item)
    except InvalidPayload:
        return False
    return True


def _mapped(message: MessageDict) -> list[dict[str, Any]]:
    role, content, metadata = message["role"], message["content"], message["metadata"]
    if role == "tool":
        if is_placeholder(message):
            output: str | list[Any] = PLACEHOLDER_CONTENT
        else:
            output = content if isinstance(content, str) else _parts(content, "result")
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
        place = {"assistant": "output", "user": "input"}.get(role, "system")
        parts = _parts(content, place)
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


def _part(part: Mapping[str, Any], place: str) -> dict[str, Any] | None:
    """One part as Responses takes it in ``place`` (``input``: a user message;
    ``system``: a system message, text only; ``output``: an assistant message;
    ``result``: a function call's output), a text stand-in, or ``None`` (dropped:
    reasoning, text without text).
    """
    kind = part.get("type")

    def text(value: str) -> dict[str, Any]:
        if place == "output":
            return {"type": "output_text", "text": value, "annotations": []}
        return {"type": "input_text", "text": value}

    if kind in TEXT_PARTS:
        found = part_text(part)
        return None if found is None else text(found)
    if kind in REASONING_PARTS:
        return None
    if (refusal := refusal_text(part)) is not None:
        return {"type": "refusal", "refusal": refusal} if place == "output" else text(refusal)
    if (document := document_text(part)) is not None:
        return text(document)
    if place in ("input", "result"):
        detail = part.get("detail")
        if not isinstance(detail, str) and isinstance(part.get("image_url"), Mapping):
            detail = part["image_url"].get("detail")
        detail = detail if isinstance(detail, str) else "auto"
        if kind in IMAGE_PARTS and (url := part_image_url(part)) is not None:
            return {"type": "input_image", "image_url": url, "detail": detail}
        if (file_id := part_image_file_id(part)) is not None:
            return {"type": "input_image", "file_id": file_id, "detail": detail}
        if (file := part_file(part)) is not None:
            return {"type": "input_file", **file}
    return text(omitted(part))


def _parts(content: list[Any], place: str) -> list[Any]:
    return [p for p in (_part(part, place) for part in content) if p is not None]


def to_openai_responses(
    messages: Sequence[MessageDict], *, limit: int | None = None
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
        if kind == "input_file" and not any(
            isinstance(part.get(k), str) for k in ("file_id", "file_data", "file_url")
        ):
            raise _fail(
                index,
                f"{where}[{position}]: an input_file part needs file_id, file_data or file_url",
            )
        if kind == "refusal" and not isinstance(part.get("refusal"), str):
            raise _fail(index, f"{where}[{position}]: a refusal part needs a string 'refusal'")


def _check_item(index: int, item: object) -> str:
    """Check one item on its own (no pairing); return its type."""
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
            allowed = {"assistant": _OUTPUT_PARTS, "user": _INPUT_PARTS}.get(role, _SYSTEM_PARTS)
            _check_parts(index, "content", content, allowed)
        elif not isinstance(content, str):
            raise _fail(index, "message content must be a string or a list of parts")
    elif kind == "function_call":
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _fail(index, "a function_call needs a non-empty string call_id")
        if not isinstance(item.get("name"), str) or not item["name"]:
            raise _fail(index, "a function_call needs a non-empty name")
        if not isinstance(item.get("arguments"), str):
            raise _fail(index, "function_call arguments must be a string")
    elif kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            _check_parts(index, "output", output, _RESULT_PARTS)
        elif not isinstance(output, str):
            raise _fail(index, "output must be a string or a list of parts")
    return kind


def validate_openai_responses(items: object) -> None:
    """Raise unless ``items`` is a Responses ``input`` list the API accepts.

    Rules checked: a list of objects, each a message or with a string ``type``;
    a message's role is user, assistant, system or developer and its content a
    string or a list of parts (``output_text``/``refusal`` for assistant,
    ``input_text``/``input_image``/``input_file`` for user, ``input_text`` for
    system and developer); a ``function_call``
    has a non-empty string ``call_id`` never used by another call, a non-empty
    ``name`` and string ``arguments``; a ``function_call_output`` has the
    ``call_id`` of a call before it, answered once, and an output that is a
    string or a list of input parts; every ``function_call`` has its output.
    Other item types are passed unchecked.

    Raises:
        InvalidPayload: names the first offending item.
    """
    if not isinstance(items, list):
        raise _fail(None, "input must be a list of items")
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for index, item in enumerate(items):
        kind = _check_item(index, item)
        call_id = item.get("call_id")
        if kind == "function_call":
            if call_id in calls:
                raise _fail(index, f"call_id {call_id!r} is used by two function_call items")
            calls[call_id] = index
        elif kind == "function_call_output":
            if call_id not in calls:
                raise _fail(index, f"no function_call before this output for call_id {call_id!r}")
            if call_id in answered:
                raise _fail(index, f"call_id {call_id!r} already has an output")
            answered.add(call_id)
    for call_id, index in calls.items():
        if call_id not in answered:
            raise _fail(index, f"function_call {call_id!r} has no function_call_output")

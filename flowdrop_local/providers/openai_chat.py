"""OpenAI Chat Completions: export, import and validate ``messages``.

Export: each assistant turn's calls become ``tool_calls`` entries
(``{"id", "type": "function", "function": {"name", "arguments"}}``) and each
result a ``tool`` message with ``tool_call_id``, right after its turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..errors import InvalidPayload
from ..rules.normalize import MessageDict
from ._common import (
    IMAGE_PARTS,
    REASONING_PARTS,
    TEXT_PARTS,
    arguments_text,
    call_name,
    document_text,
    is_opaque,
    omitted,
    part_file,
    part_image_url,
    part_text,
    prepare,
    refusal_text,
    tool_calls,
)

FORMAT: Final = "openai-chat"
_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})
# Part types each role may carry (Chat Completions API reference).
_PART_TYPES: Final[dict[str, frozenset[str]]] = {
    "system": frozenset({"text"}),
    "developer": frozenset({"text"}),
    "user": frozenset({"text", "image_url", "input_audio", "file"}),
    "assistant": frozenset({"text", "refusal"}),
    "tool": frozenset({"text"}),
}


def _part(part: Mapping[str, Any], role: str) -> dict[str, Any] | None:
    """One part as ``role`` may carry it in Chat, a text stand-in, or ``None`` (dropped)."""
    kind = part.get("type")
    if kind in TEXT_PARTS:
        text = part_text(part)
        return None if text is None else {"type": "text", "text": text}
    if kind in REASONING_PARTS:
        return None
    if (refusal := refusal_text(part)) is not None:
        if role == "assistant":
            return {"type": "refusal", "refusal": refusal}
        return {"type": "text", "text": refusal}
    if (text := document_text(part)) is not None:
        return {"type": "text", "text": text}
    if role == "user":
        if kind in IMAGE_PARTS and (url := part_image_url(part)) is not None:
            image: dict[str, Any] = {"url": url}
            detail = part.get("detail")
            if detail is None and isinstance(part.get("image_url"), Mapping):
                detail = part["image_url"].get("detail")
            if isinstance(detail, str):
                image["detail"] = detail
            return {"type": "image_url", "image_url": image}
        file = part_file(part)
        if file is not None and "file_url" not in file:
            return {"type": "file", "file": file}
        audio = part.get("input_audio")
        if kind == "input_audio" and isinstance(audio, Mapping):
            return {"type": "input_audio", "input_audio": dict(audio)}
    return {"type": "text", "text": omitted(part)}


def _content(content: str | list[Any], role: str) -> str | list[Any]:
    if isinstance(content, str):
        return content
    parts = [p for p in (_part(part, role) for part in content) if p is not None]
    return parts or ""  # an empty list of parts is refused; empty text is not


def to_openai_chat(
    messages: Sequence[MessageDict], *, limit: int | None = None
) -> list[dict[str, Any]]:
    """Chat Completions ``messages`` for stored messages (``Buffer.read()`` dicts).

    ``limit``: about the last ``limit`` messages, widened to whole turns (see
    :func:`~flowdrop_local.providers._common.window`).
    """
    payload: list[dict[str, Any]] = []
    for message in prepare(messages, limit):
        if is_opaque(message):
            continue
        role = message["role"]
        content = _content(message["content"], role)
        if role == "tool":
            payload.append(
                {
                    "role": "tool",
                    "tool_call_id": message["metadata"]["tool_call_id"],
                    "content": content,
                }
            )
            continue
        entry: dict[str, Any] = {"role": role, "content": content}
        calls = tool_calls(message) if role == "assistant" else []
        if calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call_name(call),
                        "arguments": arguments_text(call.arguments),
                    },
                }
                for call in calls
            ]
            if content == "":
                entry["content"] = None
        payload.append(entry)
    return payload


def from_openai_chat(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages ``Buffer.append`` accepts, from a Chat Completions history.

    ``developer`` becomes ``system``; the calls are kept as sent (the store reads
    their ``id``); a ``null`` content becomes empty text; other keys (``name``,
    ``refusal``) go to ``metadata``.

    Raises:
        InvalidPayload: a message is not an object or has a role Chat does not
            define (``function``, the deprecated one, included).
    """
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise InvalidPayload(FORMAT, None, "messages must be a list")
    converted: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            raise InvalidPayload(
                FORMAT, index, "not a message with role system, developer, user, assistant or tool"
            )
        role = "system" if message["role"] == "developer" else message["role"]
        entry: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
        metadata = {k: v for k, v in message.items() if k not in ("role", "content")}
        if not metadata.get("tool_calls"):
            metadata.pop("tool_calls", None)
        if metadata:
            entry["metadata"] = metadata
        converted.append(entry)
    return converted


# ------------------------------------------------------------------ validation


def _fail(index: int | None, problem: str) -> InvalidPayload:
    return InvalidPayload(FORMAT, index, problem)


def _check_content(index: int, role: str, content: object, has_calls: bool) -> None:
    if isinstance(content, str):
        return
    if content is None:
        if role == "assistant" and has_calls:
            return
        raise _fail(index, f"a {role} message needs content (null only beside tool_calls)")
    if not isinstance(content, list):
        raise _fail(
            index, f"content must be a string or a list of parts, not {type(content).__name__}"
        )
    if not content:
        raise _fail(index, "content must not be an empty list")
    allowed = _PART_TYPES[role]
    for position, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in allowed:
            raise _fail(
                index,
                f"content[{position}]: a {role} message takes {sorted(allowed)}, not {kind!r}",
            )
        if kind == "text" and not isinstance(part.get("text"), str):
            raise _fail(index, f"content[{position}]: a text part needs a string 'text'")
        if kind == "image_url":
            image = part.get("image_url")
            if not isinstance(image, Mapping) or not isinstance(image.get("url"), str):
                raise _fail(index, f"content[{position}]: an image_url part needs image_url.url")
        if kind == "refusal" and not isinstance(part.get("refusal"), str):
            raise _fail(index, f"content[{position}]: a refusal part needs a string 'refusal'")
        if kind == "file":
            file = part.get("file")
            if not isinstance(file, Mapping) or not (
                isinstance(file.get("file_id"), str) or isinstance(file.get("file_data"), str)
            ):
                raise _fail(
                    index, f"content[{position}]: a file part needs file.file_id or file_data"
                )
        if kind == "input_audio" and not isinstance(part.get("input_audio"), Mapping):
            raise _fail(index, f"content[{position}]: an input_audio part needs input_audio")


def validate_openai_chat(messages: object) -> None:
    """Raise unless ``messages`` is a Chat Completions history the API accepts.

    Rules checked: a list of objects; role one of system, developer, user,
    assistant, tool; content a string or a list of the part types the role
    takes (null only on an assistant turn with tool calls); ``tool_calls``, when
    present, a non-empty list of ``{"id": non-empty string, "type": "function",
    "function": {"name": non-empty string, "arguments": string}}`` with ids never
    used before; every call answered by one ``tool`` message in the run of tool
    messages right after its turn; every ``tool`` message carrying the
    ``tool_call_id`` of a call in the turn right before that run, once.

    Raises:
        InvalidPayload: names the first offending message.
    """
    if not isinstance(messages, list):
        raise _fail(None, "messages must be a list")
    seen: set[str] = set()
    pending: dict[str, None] = {}
    turn = -1
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _fail(index, "a message must be an object")
        role = message.get("role")
        if role not in _ROLES:
            raise _fail(index, f"unknown role {role!r}")
        if role != "tool" and pending:
            raise _fail(
                turn, f"tool calls {list(pending)} have no tool message right after their turn"
            )
        calls = message.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                raise _fail(index, "only an assistant message has tool_calls")
            if not isinstance(calls, list) or not calls:
                raise _fail(index, "tool_calls must be a non-empty list")
            for position, call in enumerate(calls):
                where = f"tool_calls[{position}]"
                if not isinstance(call, Mapping):
                    raise _fail(index, f"{where} must be an object")
                call_id, function = call.get("id"), call.get("function")
                if not isinstance(call_id, str) or not call_id:
                    raise _fail(index, f"{where}.id must be a non-empty string")
                if call.get("type") != "function":
                    raise _fail(index, f"{where}.type must be 'function'")
                if not isinstance(function, Mapping):
                    raise _fail(index, f"{where}.function must be an object")
                if not isinstance(function.get("name"), str) or not function["name"]:
                    raise _fail(index, f"{where}.function.name must be a non-empty string")
                if not isinstance(function.get("arguments"), str):
                    raise _fail(index, f"{where}.function.arguments must be a string")
                if call_id in seen:
                    raise _fail(index, f"{where}: tool call id {call_id!r} is used twice")
                seen.add(call_id)
                pending[call_id] = None
            turn = index
        _check_content(index, role, message.get("content"), bool(calls))
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _fail(index, "a tool message needs a non-empty tool_call_id")
            if call_id not in pending:
                raise _fail(
                    index,
                    f"tool_call_id {call_id!r} answers no call of the assistant turn before it",
                )
            del pending[call_id]
    if pending:
        raise _fail(turn, f"tool calls {list(pending)} have no tool message right after their turn")

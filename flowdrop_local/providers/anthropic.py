"""Anthropic Messages: export, import and validate ``{"system", "messages"}``.

Export: system messages become the top-level ``system``; an assistant turn's
calls become ``tool_use`` blocks in that turn, and their results ``tool_result``
blocks at the start of the next user turn, merged with that user's own content,
so two turns of one role never stand side by side.

Anthropic accepts a ``tool_use`` id only of the form ``[a-zA-Z0-9_-]+``; an id
outside it (a local server's ``"call 1"``, say) is rewritten the same way in the
call and its result, kept unique within the payload.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..errors import InvalidPayload
from ..rules.normalize import MessageDict
from ._common import (
    ANTHROPIC_BLOCKS,
    ANTHROPIC_RESULT_BLOCKS,
    IMAGE_PARTS,
    TEXT_PARTS,
    anthropic_image_source,
    arguments_object,
    call_name,
    data_url,
    is_opaque,
    omitted,
    part_file,
    part_image_url,
    part_text,
    prepare,
    refusal_text,
    tool_calls,
)

FORMAT: Final = "anthropic"
# A payload must open with a user turn and hold at least one: a history that
# opens with an assistant turn (a greeting, or a window cut there), or has no
# turn to send at all, gets this one before it.
OPENING_USER_TEXT: Final = "(conversation continues)"
_TOOL_ID: Final = re.compile(r"[a-zA-Z0-9_-]+")
_ANTHROPIC_REASONING: Final = frozenset({"thinking", "redacted_thinking"})
_OTHER_REASONING: Final = frozenset({"reasoning", "reasoning_text", "summary_text"})
_USER_ONLY: Final = frozenset(
    {"image", "document", "tool_result", "search_result", "container_upload"}
)
_ASSISTANT_ONLY: Final = frozenset(
    {"tool_use", "thinking", "redacted_thinking", "server_tool_use"}
    | {kind for kind in ANTHROPIC_BLOCKS if kind.endswith("_tool_result") and kind != "tool_result"}
)
# Blocks of a user turn kept as they are; the server tool results are not among
# them: they answer a server_tool_use, which the store never holds.
_NATIVE_USER: Final = frozenset({"search_result", "container_upload"})


class _Ids:
    """Anthropic-safe tool ids, one per call id, unique within one payload."""

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}
        self._used: set[str] = set()

    def __call__(self, call_id: str) -> str:
        safe = self._ids.get(call_id)
        if safe is None:
            # A safe id is kept unless a rewritten one already took it.
            usable = _TOOL_ID.fullmatch(call_id) and call_id not in self._used
            safe = call_id if usable else self._rewrite(call_id)
            self._ids[call_id] = safe
            self._used.add(safe)
        return safe

    def _rewrite(self, call_id: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9_-]", "_", call_id)
        digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{base}_{digest}"
        while safe in self._used or safe in self._ids:
            safe += "_"
        return safe


def _block(part: Mapping[str, Any], place: str) -> dict[str, Any] | None:
    """One part as a block Anthropic takes in ``place`` (``user``, ``assistant``,
    ``system`` or ``result``: a ``tool_result``'s content), a text stand-in, or
    ``None`` (dropped: blank text, reasoning that is not Anthropic's, or Anthropic
    thinking outside an assistant turn).
    """
    kind = part.get("type")
    if kind in TEXT_PARTS:
        text = part_text(part)
        return {"type": "text", "text": text} if text is not None and text.strip() else None
    if kind in _OTHER_REASONING or (kind in _ANTHROPIC_REASONING and place != "assistant"):
        return None
    if kind in _ANTHROPIC_REASONING:
        return dict(part)
    if (refusal := refusal_text(part)) is not None:
        return {"type": "text", "text": refusal} if refusal.strip() else None
    if place in ("user", "result"):
        if kind == "image" and isinstance(part.get("source"), Mapping):
            return dict(part)
        if kind in IMAGE_PARTS and (url := part_image_url(part)) is not None:
            return {"type": "image", "source": anthropic_image_source(url)}
        if kind == "document" and isinstance(part.get("source"), Mapping):
            return dict(part)
        if (document := _document(part)) is not None:
            return document
        if kind in _NATIVE_USER and (place == "user" or kind in ANTHROPIC_RESULT_BLOCKS):
            return dict(part)
    return {"type": "text", "text": omitted(part)}


def _document(part: Mapping[str, Any]) -> dict[str, Any] | None:
    """A ``document`` block for an OpenAI file part holding a PDF or a URL, else ``None``."""
    if part.get("type") == "document":
        return None
    file = part_file(part)
    if file is None:
        return None
    if "file_data" in file:
        parsed = data_url(file["file_data"])
        if parsed and parsed[0] == "application/pdf":
            source = {"type": "base64", "media_type": "application/pdf", "data": parsed[1]}
            return {"type": "document", "source": source}
        return None
    if "file_url" in file:
        return {"type": "document", "source": {"type": "url", "url": file["file_url"]}}
    return None


def _blocks(content: str | list[Any], place: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    return [b for b in (_block(part, place) for part in content) if b is not None]


def _simplified(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if len(blocks) == 1 and blocks[0].keys() == {"type", "text"} and blocks[0]["type"] == "text":
        return str(blocks[0]["text"])
    return blocks


def to_anthropic(messages: Sequence[MessageDict], *, limit: int | None = None) -> dict[str, Any]:
    """``{"system": ..., "messages": [...]}`` for stored messages (``Buffer.read()`` dicts).

    ``system`` is present only when the history has system messages: one text
    gives a string, several (or parts) a list of text blocks. Blank text is left
    out (Anthropic refuses it), and a turn left empty with it. A history that
    opens with an assistant turn, or holds no turn to send (Anthropic refuses an
    empty list), gets the user turn :data:`OPENING_USER_TEXT` first. A part
    Anthropic has no block for becomes a short text saying what was left out.
    ``limit`` as for :func:`~flowdrop_local.providers.openai_chat.to_openai_chat`.
    """
    ids = _Ids()
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in prepare(messages, limit):
        if is_opaque(message):
            continue
        role = message["role"]
        if role == "system":
            system.extend(_blocks(message["content"], "system"))
            continue
        if role == "tool":
            metadata = message["metadata"]
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": ids(metadata["tool_call_id"]),
            }
            content = _blocks(message["content"], "result")
            if content:
                result["content"] = _simplified(content)
            if metadata.get("is_error") is True:
                result["is_error"] = True
            blocks = [result]
            role = "user"
        else:
            blocks = _blocks(message["content"], role)
            if role == "assistant":
                blocks += [
                    {
                        "type": "tool_use",
                        "id": ids(call.id),
                        "name": call_name(call),
                        "input": arguments_object(call.arguments),
                    }
                    for call in tool_calls(message)
                ]
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if not turns or turns[0]["role"] == "assistant":
        # Anthropic refuses an empty list as it refuses an assistant opening.
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": OPENING_USER_TEXT}]})
    payload: dict[str, Any] = {}
    if system:
        payload["system"] = _simplified(system)
    payload["messages"] = [{"role": t["role"], "content": _simplified(t["content"])} for t in turns]
    return payload


def from_anthropic(
    messages: Sequence[Mapping[str, Any]] | Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Messages ``Buffer.append`` accepts, from an Anthropic history.

    Takes the ``messages`` list, or a whole payload ``{"system", "messages"}``.
    Each ``tool_result`` block becomes a ``tool`` message (``is_error`` kept in
    metadata) in the order the blocks stand, the user's other blocks one user
    message; an assistant turn keeps its other blocks as content and declares
    its ``tool_use`` blocks, kept as sent, as its calls. Content parts are kept,
    never turned into text.

    Raises:
        InvalidPayload: a message or block is malformed.
    """
    converted: list[dict[str, Any]] = []
    if isinstance(messages, Mapping):
        system = messages.get("system")
        if isinstance(system, str) and system:
            converted.append({"role": "system", "content": system})
        elif isinstance(system, list) and system:
            converted.append({"role": "system", "content": list(system)})
        messages = messages.get("messages")  # type: ignore[assignment]
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidPayload(FORMAT, None, "messages must be a list")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            raise InvalidPayload(FORMAT, index, "not a message with role user or assistant")
        role, content = message["role"], message.get("content")
        if isinstance(content, str):
            converted.append({"role": role, "content": content})
            continue
        if not isinstance(content, list) or not all(isinstance(b, Mapping) for b in content):
            raise InvalidPayload(FORMAT, index, "content must be a string or a list of blocks")
        if role == "assistant":
            calls = [dict(b) for b in content if b.get("type") == "tool_use"]
            entry: dict[str, Any] = {
                "role": "assistant",
                "content": [dict(b) for b in content if b.get("type") != "tool_use"],
            }
            if calls:
                entry["tool_calls"] = calls
            converted.append(entry)
            continue
        pending: list[Any] = []
        for block in content:
            if block.get("type") != "tool_result":
                pending.append(dict(block))
                continue
            if pending:
                converted.append({"role": "user", "content": pending})
                pending = []
            result_content = block.get("content")
            result: dict[str, Any] = {
                "role": "tool",
                "content": list(result_content)
                if isinstance(result_content, list)
                else result_content or "",
                "tool_call_id": block.get("tool_use_id"),
            }
            if block.get("is_error") is not None:
                result["metadata"] = {"is_error": block["is_error"]}
            converted.append(result)
        if pending:
            converted.append({"role": "user", "content": pending})
    return converted


# ------------------------------------------------------------------ validation


def _fail(index: int | None, problem: str) -> InvalidPayload:
    return InvalidPayload(FORMAT, index, problem)


def _check_text_block(index: int, where: str, block: Mapping[str, Any]) -> None:
    text = block.get("text")
    if not isinstance(text, str) or not text.strip():
        raise _fail(index, f"{where}: a text block needs non-whitespace text")


def _check_result_content(index: int, where: str, content: object) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _fail(index, f"{where}: tool_result content must be text or a list of blocks")
    for position, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind not in ANTHROPIC_RESULT_BLOCKS:
            raise _fail(
                index,
                f"{where}.content[{position}]: a tool_result holds "
                f"{sorted(ANTHROPIC_RESULT_BLOCKS)}, not {kind!r}",
            )
        if kind == "text":
            assert isinstance(block, Mapping)
            _check_text_block(index, f"{where}.content[{position}]", block)


def validate_anthropic(payload: object) -> None:
    """Raise unless ``payload`` is an Anthropic Messages request body the API accepts.

    Rules checked: an object with a ``messages`` list; ``system``, if present, a
    string or a list of text blocks; each message's role is user or assistant
    (system is not a message role); the list is not empty; the first message is a
    user turn, and two
    turns of one role never stand side by side; content is non-whitespace text or
    a non-empty list of blocks of a type the Messages API defines (a
    ``tool_result``'s own content: text, image, search_result, document,
    tool_reference, browser_state); text blocks hold
    non-whitespace text; ``tool_use``, ``thinking`` and ``redacted_thinking``
    only in assistant turns, ``tool_result``, ``image`` and ``document`` only in
    user turns; a ``tool_use`` has an id matching ``[a-zA-Z0-9_-]+`` never used
    before, a non-empty name and an object ``input``; every ``tool_use`` is
    answered by a ``tool_result`` in the very next (user) turn, whose
    ``tool_result`` blocks come before its other blocks and each answer a
    ``tool_use`` of the turn right before, once.

    Raises:
        InvalidPayload: names the first offending message.
    """
    if not isinstance(payload, Mapping):
        raise _fail(None, "the payload must be an object with 'messages'")
    system = payload.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            raise _fail(None, "system must be a string or a list of text blocks")
        for position, block in enumerate(system):
            if not isinstance(block, Mapping) or block.get("type") != "text":
                raise _fail(None, f"system[{position}] must be a text block")
            if not isinstance(block.get("text"), str):
                raise _fail(None, f"system[{position}] needs a string 'text'")
    messages = payload.get("messages")
    if not isinstance(messages, list):
        raise _fail(None, "messages must be a list")
    if not messages:
        raise _fail(None, "messages must not be empty")
    seen: set[str] = set()
    pending: dict[str, None] = {}
    turn = -1
    previous: object = None
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _fail(index, "a message must be an object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _fail(index, f"role must be user or assistant, not {role!r}")
        if index == 0 and role != "user":
            raise _fail(index, "the first message must be a user turn")
        if role == previous:
            raise _fail(index, f"two {role} turns stand side by side")
        previous = role
        content = message.get("content")
        if isinstance(content, str):
            if not content.strip():
                raise _fail(index, "content must hold non-whitespace text")
            blocks: list[Any] = []
        elif isinstance(content, list) and content:
            blocks = content
        else:
            raise _fail(index, "content must be text or a non-empty list of blocks")
        answers = pending
        pending = {}
        past_results = False
        for position, block in enumerate(blocks):
            where = f"content[{position}]"
            kind = block.get("type") if isinstance(block, Mapping) else None
            if not isinstance(kind, str):
                raise _fail(index, f"{where} must be a block with a string 'type'")
            assert isinstance(block, Mapping)
            if kind not in ANTHROPIC_BLOCKS:
                raise _fail(index, f"{where}: {kind!r} is not a block type of the Messages API")
            if role == "assistant" and kind in _USER_ONLY:
                raise _fail(index, f"{where}: a {kind} block belongs in a user turn")
            if role == "user" and kind in _ASSISTANT_ONLY:
                raise _fail(index, f"{where}: a {kind} block belongs in an assistant turn")
            if kind == "text":
                _check_text_block(index, where, block)
            if kind == "tool_use":
                call_id = block.get("id")
                if not isinstance(call_id, str) or not _TOOL_ID.fullmatch(call_id):
                    raise _fail(
                        index, f"{where}: tool_use id {call_id!r} must match [a-zA-Z0-9_-]+"
                    )
                if call_id in seen:
                    raise _fail(index, f"{where}: tool_use id {call_id!r} is used twice")
                if not isinstance(block.get("name"), str) or not block["name"]:
                    raise _fail(index, f"{where}: tool_use needs a non-empty name")
                if not isinstance(block.get("input"), Mapping):
                    raise _fail(index, f"{where}: tool_use input must be an object")
                seen.add(call_id)
                pending[call_id] = None
            if kind == "tool_result":
                if past_results:
                    raise _fail(index, f"{where}: tool_result blocks must come first in the turn")
                call_id = block.get("tool_use_id")
                if call_id not in answers:
                    raise _fail(
                        index,
                        f"{where}: tool_result for {call_id!r} answers no tool_use just before",
                    )
                del answers[call_id]
                _check_result_content(index, where, block.get("content"))
            else:
                past_results = True
        if answers:
            raise _fail(turn, f"tool_use ids {list(answers)} have no tool_result in the next turn")
        if pending:
            turn = index
    if pending:
        raise _fail(turn, f"tool_use ids {list(pending)} have no tool_result in the next turn")

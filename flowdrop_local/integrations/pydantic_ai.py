"""Pydantic AI message history in a flowdrop_local buffer.

``save(buf, messages)`` stores ``ModelMessage`` objects (typically
``result.all_messages()`` or ``result.new_messages()``); ``load(buf)`` gives them
back, ready for ``agent.run(..., message_history=load(buf))``. ``Persist(buf)`` is
a capability that saves while the run goes on, so a process killed inside a tool
leaves the model's call stored.

Storage, so that the buffer rules see the conversation they were written for:

* a ``ModelResponse`` is one ``assistant`` message: its text and thinking parts
  as content, its ``ToolCallPart`` s as declared calls (MEM-2, the ledger);
* each part of a ``ModelRequest`` is one message: ``SystemPromptPart`` a
  ``system`` message, ``UserPromptPart`` a ``user`` turn (which heals, MEM-3),
  ``ToolReturnPart`` (and a tool-bound ``RetryPromptPart``) a ``tool`` result
  for its call (MEM-1, MEM-10), validation feedback (``RetryFeedbackPart``, a
  plain ``RetryPromptPart``) a ``user`` turn, as the model receives it; a
  request part with no buffer equivalent is an ``assistant`` entry with empty
  content, which pairs and heals nothing.

Every message keeps its Pydantic AI form verbatim in ``metadata.pydantic_ai``
(the whole response; the part and its request's other fields), so ``load`` gives
back exactly what was saved, parts with no buffer equivalent (``FilePart``,
native tool parts, compaction parts, whatever a later release adds) included.

A placeholder is a ``ToolReturnPart`` for its call, built as Pydantic AI builds
its own (``INTERRUPTED_TOOL_RETURN_CONTENT``, ``outcome='interrupted'``,
metadata ``{SYNTHESIZED_TOOL_RETURN_METADATA_KEY: True}``); such a return (or one
holding flowdrop's placeholder text) is saved as a healed placeholder, never as a
real result, so a real result still replaces it (MEM-10).

Saving is idempotent: a part (a response) already stored is not stored again,
recognised by its full serialised form. Request parts carry their own timestamps
(a response its own), so an identical prompt sent again is a new part; Pydantic
AI merges adjacent requests, which is why requests are matched part by part.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    INTERRUPTED_TOOL_RETURN_CONTENT,
    SYNTHESIZED_TOOL_RETURN_METADATA_KEY,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    RetryFeedbackPart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from ..aio import AsyncBuffer
from ..buffer import Buffer
from ..model import AppendResult, Message
from ..providers._common import UNNAMED_TOOL
from ..rules.pairing import PLACEHOLDER_CONTENT, placeholder_message

KEY: Final = "pydantic_ai"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


# ------------------------------------------------------------------ public API


def load(buf: Buffer) -> list[ModelMessage]:
    """The buffer's history as Pydantic AI messages, oldest first.

    A history that ends in a response whose calls have no result (a run killed
    in a tool, or deferred tools) is given as stored: Pydantic AI runs those
    calls when run with no new prompt, and refuses a new prompt on top of them
    (``pydantic_ai.messages.repair_messages(load(buf))`` closes them out; the
    returns it adds are saved as placeholders).
    """
    return _to_model_messages(_read(buf))


def save(buf: Buffer, messages: Iterable[ModelMessage]) -> AppendResult:
    """Store what is not stored yet, in one append (its report: ``appended`` is 0 when
    everything was stored already).

    Raises:
        InvalidMessage: a part cannot be stored; nothing was written.
    """
    fresh = _unsaved(_read(buf), messages)
    return _append(buf, fresh)


async def aload(buf: Buffer | AsyncBuffer) -> list[ModelMessage]:
    """:func:`load` for async code: an :class:`~flowdrop_local.AsyncBuffer` natively,
    a sync ``Buffer`` on a worker thread."""
    return _to_model_messages(await _aread(buf))


async def asave(buf: Buffer | AsyncBuffer, messages: Iterable[ModelMessage]) -> AppendResult:
    """:func:`save` for async code (an ``AsyncBuffer`` natively, a ``Buffer`` on a thread)."""
    given = list(messages)
    return await _aappend(buf, _unsaved(await _aread(buf), given))


@dataclass
class Persist(AbstractCapability[Any]):
    """A capability that saves the run's history to ``buf`` after every step.

    ``agent.run(prompt, message_history=load(buf), capabilities=[Persist(buf)])``:
    after each node of the run (the user's request, each model response, each
    round of tool results) the messages not stored yet are saved, so a model's
    calls are stored before its tools run, and a process killed inside a tool
    leaves them for the next user turn to heal.
    """

    buf: Buffer | AsyncBuffer
    _saved: set[str] | None = field(default=None, init=False, repr=False)

    async def for_run(self, ctx: Any) -> Persist:
        return Persist(self.buf)  # a fresh record of what this run has saved

    async def after_node_run(self, ctx: Any, *, node: Any, result: Any) -> Any:
        await self._save(ctx.messages)
        return result

    async def _save(self, messages: Sequence[ModelMessage]) -> None:
        if self._saved is None:
            self._saved = set(_keys(_to_model_messages(await _aread(self.buf))))
        fresh = _unsaved_after(self._saved, messages)
        if fresh:
            await _aappend(self.buf, fresh)


# ------------------------------------------------------------ the storage calls


def _read(buf: Buffer) -> list[Message]:
    return buf.messages()


def _append(buf: Buffer, messages: list[dict[str, Any]]) -> AppendResult:
    return buf.append(messages)


async def _aread(buf: Buffer | AsyncBuffer) -> list[Message]:
    if isinstance(buf, AsyncBuffer):
        return await buf.messages()
    return await asyncio.to_thread(_read, buf)


async def _aappend(buf: Buffer | AsyncBuffer, messages: list[dict[str, Any]]) -> AppendResult:
    if isinstance(buf, AsyncBuffer):
        return await buf.append(messages)
    return await asyncio.to_thread(_append, buf, messages)


# ------------------------------------------------------------------- saving


def _unsaved(stored: list[Message], messages: Iterable[ModelMessage]) -> list[dict[str, Any]]:
    return _unsaved_after(set(_keys(_to_model_messages(stored))), messages)


def _unsaved_after(known: set[str], messages: Iterable[ModelMessage]) -> list[dict[str, Any]]:
    """The buffer messages for what ``known`` lacks; ``known`` gains their keys."""
    out: list[dict[str, Any]] = []
    for message in messages:
        dumped = _dump(message)
        if isinstance(message, ModelResponse):
            key = _key(dumped)
            if key not in known:
                known.add(key)
                out.append(_response_message(message, dumped))
            continue
        parts = dumped.pop("parts")
        for part, part_json in zip(message.parts, parts, strict=True):
            key = _key(part_json)
            if key not in known:
                known.add(key)
                out.append(_request_part_message(part, part_json, dumped))
    return out


def _response_message(response: ModelResponse, dumped: dict[str, Any]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for part in response.parts:
        if isinstance(part, TextPart):
            content.append({"type": "text", "text": part.content})
        elif isinstance(part, ThinkingPart):
            thinking = {"type": "thinking", "thinking": part.content}
            if part.signature is not None:
                thinking["signature"] = part.signature
            content.append(thinking)
        elif isinstance(part, ToolCallPart):
            calls.append(
                {
                    "tool_call_id": part.tool_call_id,
                    "name": part.tool_name,
                    "arguments": part.args_as_json_str(),
                }
            )
    text: str | list[dict[str, Any]] = content
    if not content:
        text = ""
    elif len(content) == 1 and content[0]["type"] == "text":
        text = content[0]["text"]
    metadata: dict[str, Any] = {KEY: {"response": dumped}}
    if calls:
        metadata["tool_calls"] = calls
    return {"role": "assistant", "content": text, "metadata": metadata}


def _request_part_message(
    part: Any, part_json: dict[str, Any], request: dict[str, Any]
) -> dict[str, Any]:
    if _is_placeholder_return(part):
        return placeholder_message(part.tool_call_id)
    kept = {KEY: {"part": part_json, "request": request}}
    if isinstance(part, SystemPromptPart):
        return {"role": "system", "content": part.content, "metadata": kept}
    if isinstance(part, UserPromptPart):
        return {"role": "user", "content": _user_content(part.content), "metadata": kept}
    if isinstance(part, ToolReturnPart):
        content = part.model_response_str()
        return {
            "role": "tool",
            "content": content,
            "metadata": {**kept, "tool_call_id": part.tool_call_id},
        }
    if isinstance(part, RetryPromptPart) and part.tool_name is not None:
        return {
            "role": "tool",
            "content": part.model_response(),
            "metadata": {**kept, "tool_call_id": part.tool_call_id},
        }
    if isinstance(part, RetryPromptPart | RetryFeedbackPart):
        return {"role": "user", "content": part.model_response(), "metadata": kept}
    return {"role": "assistant", "content": "", "metadata": kept}


def _is_placeholder_return(part: object) -> bool:
    """Pydantic AI's own return for an interrupted call, or flowdrop's placeholder text."""
    if not isinstance(part, ToolReturnPart):
        return False
    if part.content == PLACEHOLDER_CONTENT:
        return True
    synthesized = isinstance(part.metadata, Mapping) and part.metadata.get(
        SYNTHESIZED_TOOL_RETURN_METADATA_KEY
    )
    return part.content == INTERRUPTED_TOOL_RETURN_CONTENT and (
        part.outcome == "interrupted" or synthesized is True
    )


def _user_content(content: str | Sequence[Any]) -> str | list[dict[str, Any]]:
    """A user prompt's content as buffer parts: text as text, anything else named by kind."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, str):
            parts.append({"type": "text", "text": item})
        elif (url := getattr(item, "url", None)) is not None and getattr(item, "kind", "") == (
            "image-url"
        ):
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": str(getattr(item, "kind", type(item).__name__))})
    return parts


# ------------------------------------------------------------------ loading


def _to_model_messages(stored: list[Message]) -> list[ModelMessage]:
    """Regroup stored messages into Pydantic AI messages (see the module doc).

    Consecutive request parts saved from one request form it again; a part
    stored by another writer (a placeholder, a plain user turn) joins the
    request being rebuilt, and a request holding only such parts takes the
    fields of the saved request that follows it (Pydantic AI merges adjacent
    requests the same way).
    """
    out: list[dict[str, Any]] = []
    calls: dict[str, tuple[dict[str, Any], str]] = {}  # call id -> (call part, response time)
    request: dict[str, Any] | None = None  # the request being rebuilt
    plain_only = False  # it holds only parts another writer stored
    for message in stored:
        kept = message.metadata.get(KEY)
        kept = kept if isinstance(kept, Mapping) else None
        if message.role == "assistant" and (kept is None or "part" not in kept):
            response = dict(kept["response"]) if kept else _plain_response(message)
            if response is not None:
                request = None
                out.append(response)
                _remember_calls(calls, response)
            continue
        if kept is None:
            part = _plain_request_part(message, calls)
            if request is None:
                request, plain_only = {"kind": "request", "parts": []}, True
                out.append(request)
            request["parts"].append(part)
            continue
        header = dict(kept["request"])
        if request is not None and plain_only:
            request.update(header)
            plain_only = False
        elif request is None or _header(request) != header:
            request, plain_only = {**header, "parts": []}, False
            out.append(request)
        request["parts"].append(kept["part"])
    return ModelMessagesTypeAdapter.validate_python(out)


def _header(request: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in request.items() if k != "parts"}


def _remember_calls(
    calls: dict[str, tuple[dict[str, Any], str]], response: Mapping[str, Any]
) -> None:
    for part in response.get("parts") or ():
        if isinstance(part, Mapping) and part.get("part_kind") == "tool-call":
            calls[str(part.get("tool_call_id"))] = (dict(part), str(response.get("timestamp")))


def _plain_response(message: Message) -> dict[str, Any] | None:
    """A response for an assistant message another writer stored (no Pydantic AI form)."""
    parts: list[dict[str, Any]] = [
        {"part_kind": "text", "content": text} for text in _texts(message.content) if text
    ]
    for call in message.metadata.get("tool_calls") or ():
        if not isinstance(call, Mapping):
            continue
        call_id = call.get("tool_call_id", call.get("id"))
        name = call.get("name") or (call.get("function") or {}).get("name") or UNNAMED_TOOL
        arguments = call.get("arguments", (call.get("function") or {}).get("arguments"))
        parts.append(
            {
                "part_kind": "tool-call",
                "tool_name": name,
                "args": arguments if isinstance(arguments, str | dict) else None,
                "tool_call_id": str(call_id),
            }
        )
    if not parts:
        return None
    return {"kind": "response", "parts": parts, "timestamp": _stamp(message)}


def _plain_request_part(
    message: Message, calls: Mapping[str, tuple[dict[str, Any], str]]
) -> dict[str, Any]:
    """A request part for a message another writer stored, or a placeholder."""
    stamp = _stamp(message)
    if message.role == "tool":
        call_id = str(message.metadata.get("tool_call_id"))
        call, call_time = calls.get(call_id, ({"tool_name": UNNAMED_TOOL}, stamp))
        if message.healed:
            return {
                "part_kind": "tool-return",
                "tool_name": call.get("tool_name", UNNAMED_TOOL),
                "content": INTERRUPTED_TOOL_RETURN_CONTENT,
                "tool_call_id": call_id,
                "tool_kind": call.get("tool_kind"),
                "metadata": {SYNTHESIZED_TOOL_RETURN_METADATA_KEY: True},
                "timestamp": call_time,
                "outcome": "interrupted",
            }
        return {
            "part_kind": "tool-return",
            "tool_name": call.get("tool_name", UNNAMED_TOOL),
            "content": "\n".join(_texts(message.content)),
            "tool_call_id": call_id,
            "timestamp": stamp,
        }
    text = "\n".join(_texts(message.content))
    kind = "system-prompt" if message.role == "system" else "user-prompt"
    return {"part_kind": kind, "content": text, "timestamp": stamp}


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    texts = []
    for part in content or ():
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return texts


def _stamp(message: Message) -> str:
    """A message's creation time: plain messages get a stable timestamp, so a reloaded
    history is recognised as stored."""
    return message.created_at or _EPOCH.isoformat()


# ------------------------------------------------------------------ identity


def _dump(message: ModelMessage) -> dict[str, Any]:
    dumped: dict[str, Any] = ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]
    return dumped


def _key(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _keys(messages: Iterable[ModelMessage]) -> Iterable[str]:
    """The identity of every stored response and request part."""
    for message in messages:
        dumped = _dump(message)
        if isinstance(message, ModelResponse):
            yield _key(dumped)
        else:
            yield from (_key(part) for part in dumped["parts"])

"""Validate and normalise an incoming message before any write starts.

Three input shapes are accepted and stored as one (tool data under ``metadata``):

* the spec shape: ``metadata.tool_calls`` / ``metadata.tool_call_id``;
* the flat shape of the MEM-1 and MEM-2 examples: ``tool_calls`` / ``tool_call_id``
  at the top level;
* the OpenAI chat shape: assistant ``tool_calls: [{"id", "type": "function",
  "function": {...}}]`` and tool ``tool_call_id``.

A top-level ``id`` is the caller's id for the message (a UUID, checked here; the
append stores the message under it, or drops the message when its buffer holds
that id already). Declared call dicts are kept as sent (both id spellings are
read, MEM-11), so the stored history is lossless. Other top-level keys (``name``, say) move into
``metadata``; one that looks like a misspelled field (``contnet``, ``tool_call``,
``tool_call_ids``) is kept the same way but logged as a warning, since the content
or call it meant to carry is then in no payload. Anything malformed raises
:class:`InvalidMessage` naming the message's index and the field.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import math
import re
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from ..errors import InvalidMessage, shown
from .pairing import PLACEHOLDER_CONTENT, call_id_of, is_usable_call_id

ROLES: Final = frozenset({"system", "user", "assistant", "tool"})
MAX_DEPTH: Final = 200
# Content blocks that carry tool pairing in Anthropic's shape: stored as content
# they would hide a result from the guard, so they are refused until converted.
PAIRING_BLOCKS: Final = frozenset({"tool_use", "tool_result", "server_tool_use"})
# SQLite refuses a string, and a row, longer than SQLITE_MAX_LENGTH (1,000,000,000
# bytes by default) with a DataError mid-transaction; a message's content and
# metadata together must leave room for the row's other columns.
MAX_STORED_BYTES: Final = 999_000_000
_STRUCTURAL_KEYS: Final = frozenset({"role", "content", "metadata", "tool_calls", "tool_call_id"})
_NO_VALUE: Final = object()
# A caller's message id: a UUID in its 36-character text form (UUIDv7 recommended).
_MESSAGE_ID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
log = logging.getLogger(__name__)


class Incoming(NamedTuple):
    """A validated message, ready to be written."""

    role: str
    content: str  # text, or the JSON array of parts when content_parts
    content_parts: int  # 1 when content is a JSON array of content parts
    metadata: str  # JSON object text
    declared: tuple[str, ...]  # call ids an assistant turn declares, in order
    tool_call_id: str | None  # the call a tool message answers
    healed: bool  # metadata.healed is true
    id: str | None = None  # the caller's id for the message (lower case), if it gave one


def _check_json(value: object, index: int, field: str) -> None:
    """Raise unless ``value`` is JSON that round-trips exactly and SQLite can store.

    Walks iteratively: deep nesting gives an error, never a RecursionError.
    """
    stack: list[tuple[object, str, int]] = [(value, field, 0)]
    while stack:
        item, path, depth = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if item.bit_length() > 14_000:  # perhaps past Python's int-to-str digit limit
                try:
                    int.__repr__(item)
                except ValueError:
                    raise InvalidMessage(
                        index, path, f"{shown(item)} has too many digits to write as JSON"
                    ) from None
            continue
        if isinstance(item, str):
            if not item.isascii():
                _check_text(item, index, path)
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidMessage(index, path, f"{item!r} is not a JSON number")
            continue
        if depth >= MAX_DEPTH:
            raise InvalidMessage(index, path, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidMessage(index, path, f"object key {shown(key)} is not a string")
                if not key.isascii():
                    _check_text(key, index, path)
                stack.append((child, f"{path}.{key}", depth + 1))
            continue
        if isinstance(item, list | tuple):
            for i, child in enumerate(item):
                stack.append((child, f"{path}[{i}]", depth + 1))
            continue
        raise InvalidMessage(index, path, f"{type(item).__name__} is not JSON-serialisable")


def _check_text(text: str, index: int, field: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessage(
            index, field, "contains a lone surrogate, which is not valid Unicode text"
        ) from None


def too_big(*texts: str) -> bool:
    """Whether ``texts`` take more than :data:`MAX_STORED_BYTES` in UTF-8 together.

    Encodes only when it could matter (UTF-8 takes at most 4 bytes a character),
    and only non-ASCII text (ASCII takes one byte a character).
    """
    if sum(map(len, texts)) * 4 <= MAX_STORED_BYTES:
        return False
    size = sum(len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in texts)
    return size > MAX_STORED_BYTES


def _check_size(content: str, metadata: str, index: int) -> None:
    if too_big(content, metadata):
        raise InvalidMessage(
            index,
            "content",
            f"content and metadata take more than {MAX_STORED_BYTES:,} bytes, "
            "more than SQLite stores in one row",
        )


# One encoder, built once: json.dumps with options builds a new one on every call.
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def stored_content(value: object, index: int) -> tuple[str, int]:
    """Content as stored: (text, 0), or (JSON array of parts, 1); InvalidMessage otherwise."""
    if isinstance(value, str):
        if not value.isascii():
            _check_text(value, index, "content")
        return value, 0
    if value is None:
        return "", 0
    if isinstance(value, list):
        for i, part in enumerate(value):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise InvalidMessage(
                    index, f"content[{i}]", "a content part must be an object with a string 'type'"
                )
            if part["type"] in PAIRING_BLOCKS:
                raise InvalidMessage(
                    index,
                    f"content[{i}]",
                    f"a {part['type']!r} block carries tool pairing inside content; convert the "
                    "message first (one message per tool call and tool result)",
                )
        _check_json(value, index, "content")
        return _dumps(value), 1
    raise InvalidMessage(
        index,
        "content",
        f"must be a string, null or a list of content parts, not {type(value).__name__}",
    )


@functools.lru_cache(maxsize=256)
def _misspelled_field(key: str) -> str | None:
    """The field ``key`` looks like a misspelling of (case, a letter or an ``s`` off)."""
    match = difflib.get_close_matches(key.lower(), sorted(_STRUCTURAL_KEYS), n=1, cutoff=0.8)
    return match[0] if match else None


def _merged(message: Mapping[str, Any], metadata: dict[str, Any], name: str, index: int) -> object:
    """The value of ``name`` given at the top level or in metadata (both must agree)."""
    top = message.get(name, _NO_VALUE)
    nested = metadata.get(name, _NO_VALUE)
    if top is not _NO_VALUE and nested is not _NO_VALUE and _differ(top, nested, index, name):
        raise InvalidMessage(
            index, name, "given both at the top level and in metadata, differently"
        )
    return nested if top is _NO_VALUE else top


def _differ(a: object, b: object, index: int, field: str) -> bool:
    """``a != b``, or InvalidMessage when they cannot be compared (too deep, not JSON)."""
    try:
        return bool(a != b)
    except RecursionError:
        raise InvalidMessage(index, field, f"nested deeper than {MAX_DEPTH} levels") from None
    except Exception as error:  # a non-JSON value's own __eq__ or __bool__
        raise InvalidMessage(index, field, f"cannot be compared: {error!r}") from None


def _placeholder_content(
    role: str, call_id: object, content: str, parts: int, metadata: dict[str, Any], index: int
) -> str:
    """A message marked healed must be a placeholder, exactly: else it is refused.

    Only a placeholder is ever overwritten (MEM-10), so accepting real content
    under a healed mark would let a later result destroy it. Blank content is read
    as the placeholder's text.
    """
    if role != "tool" or call_id is None:
        raise InvalidMessage(
            index, "metadata.healed", "only a tool message answering a call can be marked healed"
        )
    if parts or content not in ("", PLACEHOLDER_CONTENT):
        raise InvalidMessage(
            index, "content", f"a message marked healed is a placeholder: {PLACEHOLDER_CONTENT!r}"
        )
    if set(metadata) != {"tool_call_id", "healed"}:
        raise InvalidMessage(
            index, "metadata", "a placeholder's metadata holds tool_call_id and healed only"
        )
    return PLACEHOLDER_CONTENT


def valid_message_id(value: object, index: int) -> str:
    """A caller-supplied message id in the stored form (lower case), or InvalidMessage.

    Ids are the messages' keys across the whole store: a UUID (UUIDv7 recommended,
    :func:`flowdrop_local.engine.new_message_id` makes one), in its 36-character form.
    """
    if isinstance(value, str) and len(value) == 36:
        lowered = value.lower()
        if _MESSAGE_ID.fullmatch(lowered):
            return lowered
    raise InvalidMessage(
        index, "id", f"must be a UUID string (8-4-4-4-12 hex digits), got {shown(value)}"
    )


def incoming(message: object, index: int = 0) -> Incoming:
    """Validate one incoming message and return it in the stored shape.

    Raises:
        InvalidMessage: the message, its id, role, content, metadata, tool calls or
            tool call id is malformed.
    """
    if type(message) is dict and len(message) == 2:
        # The common shape, {"role": ..., "content": "text"}: the same checks, in short.
        role = message.get("role")
        content = message.get("content")
        if type(content) is str and type(role) is str and role in ROLES:
            if not content.isascii():
                _check_text(content, index, "content")
            _check_size(content, "{}", index)
            return Incoming(role, content, 0, "{}", (), None, False)
    if not isinstance(message, Mapping):
        raise InvalidMessage(index, "message", f"must be a mapping, not {type(message).__name__}")
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidMessage(
            index, "role", f"must be one of assistant, system, tool, user; got {shown(role)}"
        )
    content, content_parts = stored_content(message.get("content"), index)
    given_id = message.get("id")
    message_id = None if given_id is None else valid_message_id(given_id, index)

    raw_metadata = message.get("metadata")
    if raw_metadata is None:
        metadata: dict[str, Any] = {}
    elif isinstance(raw_metadata, Mapping):
        metadata = dict(raw_metadata)
    else:
        raise InvalidMessage(
            index, "metadata", f"must be a JSON object, not {type(raw_metadata).__name__}"
        )
    if len(message) > 2 or "role" not in message or "content" not in message:
        for key, value in message.items():
            if key in _STRUCTURAL_KEYS or key == "id":
                continue
            if not isinstance(key, str):
                raise InvalidMessage(index, "message", f"key {shown(key)} is not a string")
            meant = _misspelled_field(key)
            if meant is not None:
                log.warning(
                    "message %d: key %r is not a message field: it is kept in metadata, where "
                    "no payload reads it; did you mean %r?",
                    index,
                    key,
                    meant,
                )
            if key in metadata and _differ(metadata[key], value, index, key):
                raise InvalidMessage(
                    index, key, "given both at the top level and in metadata, differently"
                )
            metadata[key] = value

    declared: tuple[str, ...] = ()
    calls = _merged(message, metadata, "tool_calls", index)
    if calls is not _NO_VALUE and calls is not None:
        if not isinstance(calls, list):
            raise InvalidMessage(index, "tool_calls", f"must be a list, not {type(calls).__name__}")
        if calls and role != "assistant":
            raise InvalidMessage(
                index, "tool_calls", f"only an assistant turn declares tool calls, not {role}"
            )
        ids = []
        for i, call in enumerate(calls):
            if not isinstance(call, Mapping):
                raise InvalidMessage(index, f"tool_calls[{i}]", "a tool call must be an object")
            call_id = call_id_of(call)
            if not is_usable_call_id(call_id):
                raise InvalidMessage(
                    index,
                    f"tool_calls[{i}].id",
                    f"a tool call needs a non-blank string id without NUL (tool_call_id or id), "
                    f"got {shown(call_id)}",
                )
            ids.append(call_id)
        metadata["tool_calls"] = calls
        declared = tuple(ids)  # type: ignore[arg-type]
    elif calls is None:
        metadata.pop("tool_calls", None)

    tool_call_id = _merged(message, metadata, "tool_call_id", index)
    if tool_call_id is _NO_VALUE or tool_call_id is None:
        tool_call_id = None
        metadata.pop("tool_call_id", None)
    elif role != "tool":
        raise InvalidMessage(
            index, "tool_call_id", f"only a tool message answers a call, not {role}"
        )
    elif not is_usable_call_id(tool_call_id):
        raise InvalidMessage(
            index,
            "tool_call_id",
            f"must be a non-blank string without NUL, got {shown(tool_call_id)}",
        )
    else:
        metadata["tool_call_id"] = tool_call_id

    healed = metadata.get("healed", False)
    if not isinstance(healed, bool):
        raise InvalidMessage(
            index, "metadata.healed", f"must be true or false, got {shown(healed)}"
        )
    if healed:
        content = _placeholder_content(role, tool_call_id, content, content_parts, metadata, index)

    if metadata:
        _check_json(metadata, index, "metadata")
        metadata_json = _dumps(metadata)
    else:
        metadata_json = "{}"
    _check_size(content, metadata_json, index)
    return Incoming(
        role,
        content,
        content_parts,
        metadata_json,
        declared,
        tool_call_id,  # type: ignore[arg-type]  # a usable str or None, checked above
        healed,
        message_id,
    )

"""MEM-5: normalising a conversation makes it sendable, and says what it dropped.

The flat shape is the library's one message shape, the one ``Buffer.read``
returns and ``Buffer.append`` accepts: ``{"role", "content", "metadata"}`` with
tool data under ``metadata.tool_calls`` / ``metadata.tool_call_id``. The spec's
examples write those two keys at the top level; coercion moves them into
``metadata`` (both spellings are read), so ``normalize(buffer.read())`` is the
identity on a healed buffer.

:func:`normalize` applies MEM-5's four steps in order:

1. coerce each entry (:func:`coerce_message`); entries that are not mappings, or
   have no usable role, are dropped;
2. move ``system`` messages to the front, each group keeping its order;
3. repair tool pairing (:func:`repair_pairing`);
4. strip ``tool`` messages leading the list, and repair again if any was.

Repair reads call ids only through :func:`~.pairing.call_id_of` and
:func:`~.pairing.is_usable_call_id` (MEM-11), and heals with the store's own
planner and placeholder (:func:`~.pairing.plan_healing`,
:func:`~.pairing.placeholder_message`), so placeholders land where the store's
MEM-3 healing puts them: directly after the declaring turn, before its results.

Two readings of the spec's examples (see docs/providers.md, "Sendable history"):

* a usable call id is a non-blank string, ``"0"`` included: the spec's example
  that drops a ``"0"`` pair reflects PHP's falsiness, not a rule;
* a result answers its call wherever it stands, as the store's MEM-3 ledger
  counts it ("no matching tool result anywhere in the buffer"): one stored before
  the turn that declares its call is placed right after that turn, not dropped
  for a placeholder, so repair and the store agree on which calls are answered.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..errors import InvalidPayload
from .incoming import PAIRING_BLOCKS, ROLES
from .pairing import call_id_of, is_usable_call_id, placeholder_message, plan_healing

MessageDict = dict[str, Any]  # a message as the API takes it; model.Message is the stored record

# ROLES and the content blocks that carry tool pairing (Anthropic) are the write
# path's own (rules/incoming.py): one definition. Inside content a pairing block
# would hide a call or a result from repair, so a list holding one is not a list
# of parts.

# OpenAI's newer name for the system role; a developer instruction is not dropped.
ROLE_ALIASES: Final = {"developer": "system"}
_PAIRING_FORMAT: Final = "pairing"


def coerce_content(value: object) -> str | list[Any]:
    """Content in the flat shape: text, or a list of content parts kept as given.

    A string is kept; ``None`` is empty; a boolean, integer or float is cast
    (booleans as JSON's ``true``/``false``); a list of content parts (objects with
    a string ``type``, none of them a tool-pairing block) is kept as a new list;
    anything else is serialised to JSON text rather than blanked, and falls back
    to ``""`` when it cannot be serialised (MEM-5 rule 1, MEM-16).
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list) and all(_is_content_part(part) for part in value):
        return list(value)
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return ""


def _is_content_part(part: object) -> bool:
    if not isinstance(part, Mapping):
        return False
    kind = part.get("type")
    return isinstance(kind, str) and kind not in PAIRING_BLOCKS


def is_empty_content(content: str | list[Any]) -> bool:
    """True for ``""``, blank text and ``[]``: content no provider wants as a turn."""
    return not content if isinstance(content, list) else not content.strip()


def coerce_message(entry: object) -> tuple[MessageDict | None, int]:
    """Coerce one entry to the flat shape (MEM-5 rule 1).

    Returns the message (``None`` when the entry is dropped) and how many items
    coercion dropped: 1 for a dropped entry; for a kept one, the tool calls a
    non-``assistant`` message claimed to declare (only an assistant turn
    declares). Top-level ``tool_calls`` / ``tool_call_id`` and any other extra
    key move into ``metadata``; where both give a key, the top-level one wins.
    A ``tool_call_id`` on a role other than ``tool`` names no pairing and is
    discarded; a ``metadata`` that is not an object is replaced by ``{}``.
    """
    if not isinstance(entry, Mapping):
        return None, 1
    role = entry.get("role")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in ROLES:
        return None, 1
    raw_metadata = entry.get("metadata")
    metadata: dict[str, Any] = (
        {k: v for k, v in raw_metadata.items() if isinstance(k, str)}
        if isinstance(raw_metadata, Mapping)
        else {}
    )
    for key, value in entry.items():
        if key not in ("role", "content", "metadata") and isinstance(key, str):
            metadata[key] = value
    dropped = 0
    calls = metadata.get("tool_calls")
    if calls is None or (isinstance(calls, list) and role != "assistant"):
        metadata.pop("tool_calls", None)
        dropped += len(calls) if isinstance(calls, list) else 0
    elif not isinstance(calls, list):
        metadata.pop("tool_calls")
        dropped += 1
    if role != "tool" or metadata.get("tool_call_id") is None:
        metadata.pop("tool_call_id", None)
    message = {"role": role, "content": coerce_content(entry.get("content")), "metadata": metadata}
    return message, dropped


def repair_pairing(messages: Iterable[MessageDict]) -> tuple[list[MessageDict], int]:
    """Repair tool pairing over coerced messages (MEM-5 rule 3); return them and the drops.

    * A call whose id is unusable, or declared before (by an earlier turn or
      earlier in the same turn), is dropped from its turn: the first declaration
      owns the pairing. A turn left with no calls and no content is dropped too.
    * A result answers its call wherever it stands, before or after the turn
      that declares it (MEM-3: a call is unanswered only with no result
      *anywhere*). One with an unusable id, or whose call no kept turn declares,
      is an orphan and dropped; a second result for an answered call is a
      duplicate and dropped: the first in list order wins, as MEM-1 keeps the
      first one stored.
    * Each turn is followed directly by the results of its calls: first a
      placeholder for each call with no result anywhere (the store's planner and
      placeholder), then its real results in the order they came, wherever they
      stood.

    The count is one per dropped message and one per dropped call declaration.
    """
    kept: list[MessageDict] = []
    declared: dict[str, int] = {}  # call id -> index in kept of the declaring turn
    order: list[tuple[int, str]] = []  # every kept declaration, in order
    tools: list[MessageDict] = []  # every result, in list order: matched once all turns are read
    dropped = 0
    for message in messages:
        metadata = message["metadata"]
        if message["role"] == "tool":
            tools.append(message)
            continue
        calls = metadata.get("tool_calls")
        if not calls:  # None, or an empty list kept as given
            kept.append(message)
            continue
        slot = len(kept)
        keep: list[Any] = []
        for call in calls:
            call_id = call_id_of(call) if isinstance(call, Mapping) else None
            if not is_usable_call_id(call_id) or call_id in declared:
                dropped += 1
                continue
            assert isinstance(call_id, str)
            declared[call_id] = slot
            order.append((slot, call_id))
            keep.append(call)
        if len(keep) < len(calls):
            if not keep and is_empty_content(message["content"]):
                dropped += 1  # nothing left to send
                continue
            metadata = {k: v for k, v in metadata.items() if k != "tool_calls"}
            if keep:
                metadata["tool_calls"] = keep
            message = {**message, "metadata": metadata}
        kept.append(message)
    results: dict[int, list[MessageDict]] = {}
    answered: set[str] = set()
    for message in tools:
        call_id = message["metadata"].get("tool_call_id")
        if not is_usable_call_id(call_id) or call_id not in declared:
            dropped += 1  # orphan: no kept turn declares its call
        elif call_id in answered:
            dropped += 1  # duplicate result: the first in list order answers
        else:
            answered.add(call_id)
            results.setdefault(declared[call_id], []).append(message)
    healing = dict(plan_healing((slot, i) for slot, i in order if i not in answered))
    repaired: list[MessageDict] = []
    for slot, message in enumerate(kept):
        repaired.append(message)
        repaired.extend(placeholder_message(i) for i in healing.get(slot, ()))
        repaired.extend(results.get(slot, ()))
    return repaired, dropped


def normalize(messages: Iterable[object]) -> tuple[list[MessageDict], int]:
    """MEM-5: one message list in, a sendable one and the number of drops out.

    Idempotent: ``normalize(normalize(m)[0]) == (normalize(m)[0], 0)``. The
    count adds what coercion dropped to what the repair passes report
    themselves; nothing recounts their rules.
    """
    dropped = 0
    coerced: list[MessageDict] = []
    for entry in messages:
        message, lost = coerce_message(entry)
        dropped += lost
        if message is not None:
            coerced.append(message)
    ordered = [m for m in coerced if m["role"] == "system"]
    ordered += [m for m in coerced if m["role"] != "system"]
    repaired, lost = repair_pairing(ordered)
    dropped += lost
    # Rule 4. Repair places every result it keeps right after its declaring turn,
    # so nothing leads with a tool message here; the guard stays as the rule writes it.
    first = next((i for i, m in enumerate(repaired) if m["role"] != "system"), len(repaired))
    end = first
    while end < len(repaired) and repaired[end]["role"] == "tool":
        end += 1
    if end > first:
        dropped += end - first
        repaired, lost = repair_pairing(repaired[:first] + repaired[end:])
        dropped += lost
    return repaired, dropped


def validate_pairing(messages: Iterable[MessageDict]) -> None:
    """Raise unless every call is answered once, right after its turn, in the flat shape.

    Checked, in order: each message is a mapping with a known role; an
    assistant turn declares calls with usable ids never declared before; the
    messages right after a turn that declares calls are ``tool`` results, one per
    call and for those calls only, before any other message; no ``tool``
    message stands anywhere else.

    Raises:
        InvalidPayload: names the first offending message (format ``pairing``).
    """
    seen: set[str] = set()
    pending: set[str] = set()
    pending_turn = -1
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ROLES:
            raise InvalidPayload(_PAIRING_FORMAT, index, "not a message with a known role")
        metadata = message.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        role = message["role"]
        if role == "tool":
            call_id = metadata.get("tool_call_id")
            if call_id not in pending:
                raise InvalidPayload(
                    _PAIRING_FORMAT,
                    index,
                    f"tool result for {call_id!r} does not follow the turn that declares it",
                )
            pending.discard(call_id)
            continue
        if pending:
            raise InvalidPayload(
                _PAIRING_FORMAT,
                pending_turn,
                f"tool calls {sorted(pending)} are not answered right after their turn",
            )
        calls = metadata.get("tool_calls") or []
        if calls and role != "assistant":
            raise InvalidPayload(_PAIRING_FORMAT, index, f"a {role} message declares tool calls")
        for call in calls:
            call_id = call_id_of(call) if isinstance(call, Mapping) else None
            if not is_usable_call_id(call_id):
                raise InvalidPayload(_PAIRING_FORMAT, index, f"unusable tool call id {call_id!r}")
            if call_id in seen:
                raise InvalidPayload(
                    _PAIRING_FORMAT, index, f"tool call {call_id!r} declared twice"
                )
            assert isinstance(call_id, str)
            seen.add(call_id)
            pending.add(call_id)
        pending_turn = index
    if pending:
        raise InvalidPayload(
            _PAIRING_FORMAT,
            pending_turn,
            f"tool calls {sorted(pending)} are not answered right after their turn",
        )

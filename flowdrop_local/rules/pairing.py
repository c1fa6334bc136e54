"""Tool-call pairing: the single definition of a call's id, and healing placeholders.

Every reader of a declared call's id goes through :func:`call_id_of` (MEM-11):
de-duplication (MEM-2), the ledger that healing reads (MEM-3) and the checker all
agree on which calls a turn declares because they share it. The decisions an
append makes on a turn or a result (MEM-2, MEM-1, MEM-10) are
:func:`repeats_known_calls` and :func:`judge_result`; a sync's merge
(:mod:`.merge`) makes the same ones with the same functions.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, TypeVar

PLACEHOLDER_CONTENT: Final = "Tool call was interrupted; no result."

Anchor = TypeVar("Anchor", bound=Hashable)


def call_id_of(call: Mapping[str, Any]) -> object:
    """The id a declared tool call carries: ``tool_call_id``, else the flat ``id``.

    Returns the raw value (``None`` when neither spelling is present); whether it
    is usable is :func:`is_usable_call_id`'s decision.
    """
    value = call.get("tool_call_id")
    return call.get("id") if value is None else value


def is_usable_call_id(value: object) -> bool:
    """A usable call id is a string that is not blank and holds no NUL character.

    (SQLite's JSON functions end a string at NUL, so the stored id and the one
    Python read would differ.)
    """
    return isinstance(value, str) and bool(value.strip()) and "\x00" not in value


def declared_call_ids(metadata: Mapping[str, Any]) -> list[str]:
    """The usable ids declared by ``metadata.tool_calls``, in declaration order."""
    calls = metadata.get("tool_calls")
    if not isinstance(calls, list):
        return []
    ids = []
    for call in calls:
        if isinstance(call, Mapping):
            value = call_id_of(call)
            if is_usable_call_id(value):
                ids.append(value)
    return ids  # type: ignore[return-value]


def placeholder_metadata(call_id: str) -> dict[str, Any]:
    """The metadata of the synthetic result that heals ``call_id``."""
    return {"tool_call_id": call_id, "healed": True}


def placeholder_metadata_text(call_id: str) -> str:
    """:func:`placeholder_metadata` as stored: compact JSON, keys in that order."""
    return json.dumps(placeholder_metadata(call_id), ensure_ascii=False, separators=(",", ":"))


def placeholder_message(call_id: str) -> dict[str, Any]:
    """The synthetic ``tool`` message that answers an interrupted call (MEM-3)."""
    return {
        "role": "tool",
        "content": PLACEHOLDER_CONTENT,
        "metadata": placeholder_metadata(call_id),
    }


def marked_healed(role: object, metadata: object) -> bool:
    """The one test of "is this a placeholder healing inserted (MEM-3)": a ``tool``
    message whose metadata has ``healed`` true. Whether its shape is a placeholder's
    exactly is the checks' question (``check``, an import, a sync's peer rows)."""
    return role == "tool" and isinstance(metadata, Mapping) and metadata.get("healed") is True


def is_placeholder(message: Mapping[str, Any]) -> bool:
    """:func:`marked_healed` of a message dict."""
    return marked_healed(message.get("role"), message.get("metadata"))


def repeats_known_calls(declared: Sequence[str], known: Collection[str]) -> bool:
    """MEM-2: an assistant turn that declares calls, every one of them declared
    already (by ``known`` turns), repeats a turn and is dropped. A turn with one new
    call id is kept; a turn without calls is never a repeat (turns have no other
    identity: equal texts are different messages)."""
    return bool(declared) and all(call_id in known for call_id in declared)


Verdict = Literal["new", "replaces", "duplicate"]


def judge_result(standing: bool | None, incoming_healed: bool) -> Verdict:
    """What a tool result does, given the call's standing result: ``None`` none,
    ``True`` a healed placeholder, ``False`` a real result.

    ``"new"``: the call's first result, kept. ``"replaces"`` (MEM-10): a real result
    for a call answered by a placeholder takes the placeholder's place. ``"duplicate"``
    (MEM-1): anything else for an answered call (a second result, or a placeholder)
    is dropped; the standing result stays.
    """
    if standing is None:
        return "new"
    if standing and not incoming_healed:
        return "replaces"
    return "duplicate"


def plan_healing(unanswered: Iterable[tuple[Anchor, str]]) -> list[tuple[Anchor, list[str]]]:
    """Group unanswered calls by the turn that declared them.

    ``unanswered`` is ``(declaring turn, call id)`` pairs in buffer order, then
    declaration order. The result keeps that order: one entry per declaring turn
    with the ids its placeholders answer, in the order they are to be inserted
    directly after the turn. Duplicate ids keep their first declaration only.
    """
    plan: dict[Anchor, list[str]] = {}
    seen: set[str] = set()
    for anchor, call_id in unanswered:
        if call_id in seen:
            continue
        seen.add(call_id)
        plan.setdefault(anchor, []).append(call_id)
    return list(plan.items())

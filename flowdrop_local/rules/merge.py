"""Merging two copies of one buffer (offline sync): pure, no I/O.

Input: each side's messages in position order, as :class:`Entry` records (what a
sync reads of a buffer: id, position, role, metadata and a fingerprint of the
content), after deletions known to either side were applied. Output: the one
history both sides will hold (:class:`Merged`), which does not depend on which
side is ``a``.

The order is not decided here: every replica gives a buffer's messages one order
(:mod:`.order`, from the links each message got when a sync first saw it), and the
merge takes it. Positions only store that order: the most messages that can keep
their keys do; the rest get keys between their neighbours' (appends never
renumber; only a sync re-keys, and a re-key moves nothing).

Then the buffer rules, read along the merged order (the same decisions an append
makes; the single definition of a declared call's id is
:func:`~flowdrop_local.rules.pairing.declared_call_ids`, MEM-11):

* MEM-2: an assistant turn whose declared call ids are all declared by an earlier
  turn is dropped (recorded as a conflict, so its text is not silently lost).
* MEM-10: a real result for a call whose result so far is a healed placeholder
  replaces it: the placeholder goes, and the result answers the call where it
  stands, or, standing after a user turn, in the turn's tool run (below). The
  result keeps its own row: a placeholder's id never takes another message's
  content in a merge, so a deletion of the placeholder elsewhere never reaches
  the result, and a deletion of the result reaches every row holding it
  (``sync.tombstones``). No message moves, so every replica orders the merged
  history alike.
* MEM-1: a second result for a call is dropped: a placeholder silently, an equal
  result silently, a different real result as a conflict (the first in merged
  order is kept).
* A placeholder that no longer stands in the tool run right after the first turn
  declaring its call (that turn was dropped or deleted) is dropped; healing
  (MEM-3, run by the sync on the merged buffer with the engine's own ``heal``)
  answers the call again where it belongs, if a user turn follows it.
* One message edited differently on the two sides (same id, different content):
  a real result beats a placeholder (MEM-10, in place); otherwise the version
  with the lower fingerprint is kept and the other recorded as a conflict.
"""

from __future__ import annotations

import bisect
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ..positions import keys_between
from .order import MAX_RANK, ROOT, Link
from .pairing import declared_call_ids, judge_result, marked_healed, repeats_known_calls


class Entry(NamedTuple):
    """One stored message as a sync sees it (``fingerprint``: of content and metadata)."""

    id: str
    position: str
    role: str
    metadata: str
    fingerprint: str
    created_at: str
    # The message whose stored content this one takes (a placeholder replaced by a
    # real result in place, MEM-10); None: its own.
    content_of: str | None = None


class Placed(NamedTuple):
    """A message of the merged history: its entry (the kept version), its position,
    and which side's row holds that version (``"a"``, ``"b"``, or ``"ab"`` for both)."""

    entry: Entry
    position: str
    source: str


class Conflict(NamedTuple):
    """A message the merge dropped that is not a mere duplicate (kept for the user)."""

    rule: str  # "MEM-1", "MEM-2" or "edit"
    dropped: Entry
    dropped_side: str  # which side's row holds the dropped version
    kept_id: str | None
    call_id: str | None


class Merged(NamedTuple):
    """The merged history and what it took."""

    placed: list[Placed]
    conflicts: list[Conflict]
    replaced: int  # placeholders a real result replaced (MEM-10)
    rekeyed: int  # messages given a new position
    edited: int = 0  # messages whose later edit both now hold
    # Rows made to answer a call in its tool run: (row id, the turn declaring the call).
    answered: tuple[tuple[str, str], ...] = ()


def _metadata(entry: Entry) -> dict[str, Any]:
    try:
        value = json.loads(entry.metadata)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _call_id(entry: Entry, metadata: dict[str, Any]) -> str | None:
    value = metadata.get("tool_call_id") if entry.role == "tool" else None
    return value if isinstance(value, str) else None


def _healed(entry: Entry, metadata: dict[str, Any]) -> bool:
    return marked_healed(entry.role, metadata)


class _Item:
    """A message on its way through the merge."""

    __slots__ = ("call_id", "declared", "entry", "healed", "keys", "source")

    def __init__(self, entry: Entry, source: str, keys: tuple[str, ...]) -> None:
        metadata = _metadata(entry)
        self.entry = entry
        self.source = source
        self.keys = keys  # the keys it could keep (a message both hold: each side's)
        self.call_id = _call_id(entry, metadata)
        self.healed = _healed(entry, metadata)
        self.declared = declared_call_ids(metadata) if entry.role == "assistant" else []


def merge(
    a: Sequence[Entry],
    b: Sequence[Entry],
    order: Sequence[str],
    generation_a: Mapping[str, int] | None = None,
    generation_b: Mapping[str, int] | None = None,
    links: Mapping[str, Link] | None = None,
) -> Merged:
    """The history both sides hold after a sync; symmetric in ``a`` and ``b``
    (up to the ``source`` labels). ``order``: every id of ``a`` and ``b`` once, in
    the order all replicas give them (:func:`~flowdrop_local.rules.order.tree_order`
    of ``links``, which a row the merge makes is placed by too: without them, right
    after the turn it answers).
    ``generation_a``/``generation_b``: for a message the two sides hold in two
    versions, the generation of each side's (how many edits made it; see
    :func:`_version`)."""
    generation_a = generation_a or {}
    generation_b = generation_b or {}
    by_a = {e.id: e for e in a}
    by_b = {e.id: e for e in b}
    if len(order) != len(set(order)) or set(order) != by_a.keys() | by_b.keys():
        raise ValueError("order must name every message of both sides once")

    conflicts: list[Conflict] = []
    replaced = 0
    edited = 0
    items: list[_Item] = []
    for id_ in order:
        if id_ not in by_b or id_ not in by_a:
            side = "a" if id_ in by_a else "b"
            entry = by_a[id_] if side == "a" else by_b[id_]
            items.append(_Item(entry, side, (entry.position,)))
            continue
        kept, source, conflict = _version(
            by_a[id_], by_b[id_], generation_a.get(id_, 0), generation_b.get(id_, 0)
        )
        if conflict is not None:
            conflicts.append(conflict)
        elif source != "ab":
            other = by_b[id_] if source == "a" else by_a[id_]
            if _healed(other, _metadata(other)):
                replaced += 1  # a placeholder filled in place on one side (MEM-10)
            else:
                edited += 1  # edited on one side since the last sync
        # Either side's key (a third replica's merge re-keyed it): the one that fits.
        items.append(_Item(kept, source, (by_a[id_].position, by_b[id_].position)))

    # The rules, along the merged order.
    kept_items: list[_Item | None] = []  # None: a placeholder a real result replaced
    replacing: set[str] = set()  # those real results
    declared: dict[str, str] = {}  # call id -> the first turn declaring it
    result_at: dict[str, int] = {}  # call id -> index in kept_items of its result
    for item in items:
        if repeats_known_calls(item.declared, declared):  # MEM-2
            first = declared[item.declared[0]]
            conflicts.append(Conflict("MEM-2", item.entry, item.source, first, item.declared[0]))
            continue
        for declared_id in item.declared:
            declared.setdefault(declared_id, item.entry.id)
        call_id = item.call_id
        if call_id is not None and call_id in result_at:
            at = result_at[call_id]
            standing = kept_items[at]
            assert standing is not None
            if judge_result(standing.healed, item.healed) == "replaces":  # MEM-10
                kept_items[at] = None  # the result stands for the call from here on
                replacing.add(item.entry.id)
                replaced += 1
                result_at[call_id] = len(kept_items)
                kept_items.append(item)
            elif (
                not standing.healed
                and not item.healed
                and item.entry.fingerprint != standing.entry.fingerprint
            ):  # MEM-1: a second, different real result
                conflicts.append(
                    Conflict("MEM-1", item.entry, item.source, standing.entry.id, call_id)
                )
            continue
        if call_id is not None:
            result_at[call_id] = len(kept_items)
        kept_items.append(item)

    answered: list[tuple[str, str]] = []
    present = _placeholders_in_place([item for item in kept_items if item is not None])
    merged = _results_before_the_next_user_turn(present, answered, dict(links or {}), replacing)
    placed, rekeyed = _positions(merged)
    return Merged(placed, conflicts, replaced, rekeyed, edited, tuple(answered))


def _version(
    x: Entry, y: Entry, generation_x: int, generation_y: int
) -> tuple[Entry, str, Conflict | None]:
    """The version of a message both sides hold: the same; a real result over a
    placeholder (MEM-10); the later generation (an edit of what the other side
    holds: made after it); else, two edits of one generation (made apart), the
    lower fingerprint, and the other is a conflict."""
    if x.fingerprint == y.fingerprint:
        return x, "ab", None
    healed_x = _healed(x, _metadata(x))
    healed_y = _healed(y, _metadata(y))
    if healed_x != healed_y:
        return (y, "b", None) if healed_x else (x, "a", None)
    if generation_x != generation_y:
        return (x, "a", None) if generation_x > generation_y else (y, "b", None)
    if x.fingerprint < y.fingerprint:
        return x, "a", Conflict("edit", y, "b", x.id, None)
    return y, "b", Conflict("edit", x, "a", y.id, None)


def _first_turns(items: list[_Item]) -> dict[str, int]:
    """Each call id's first declaring turn, by index (it owns the pairing)."""
    first_turn: dict[str, int] = {}
    for i, item in enumerate(items):
        for call_id in item.declared:
            first_turn.setdefault(call_id, i)
    return first_turn


def _results_before_the_next_user_turn(
    items: list[_Item],
    answered: list[tuple[str, str]],
    links: dict[str, Link],
    replacing: set[str],
) -> list[_Item]:
    """A call's result that the merge put after a user turn following the call (one
    side held the result before the call, the other the call and a user turn: each
    valid alone) is answered in the call's tool run, where healing would have put a
    placeholder (MEM-3): a user turn never follows a call answered only later. So
    is a result that replaced the call's placeholder (``replacing``) and stands
    outside the run: it takes the placeholder's place there, next to its call
    (MEM-10).

    The result is not moved: another replica may hold it where it stood, and a
    message two replicas hold stands in the same order on both, for ever. A new
    row takes its content there (its id derived from the result's, so every merge
    that makes it makes the same one), and the result's own row goes; a replica
    still holding it drops it at its next merge, as the call's second, equal
    result (MEM-1). The new row stands where its link puts it (the one every merge
    making it gives it, ``rules.order.answered_link``: first among the turn's
    children; :func:`_slot_of_answer`), and goes into ``answered`` with that turn's
    id."""
    first_turn = _first_turns(items)
    made: set[str] = set()
    for j in range(len(items)):
        item = items[j]
        turn = first_turn.get(item.call_id or "")
        if turn is None or turn > j or item.entry.id in made:
            continue
        between = {x.entry.role for x in items[turn + 1 : j]}
        if not (between - {"tool"} if item.entry.id in replacing else between & {"user"}):
            continue
        del items[j]
        answer = item.entry._replace(
            id=answered_in_place_id(item.entry.id),
            content_of=item.entry.content_of or item.entry.id,
        )
        turn_id = items[turn].entry.id
        at = _slot_of_answer(items, turn, answer.id, links)
        items.insert(at, _Item(answer, item.source, item.keys))
        links[answer.id] = (turn_id, MAX_RANK)
        made.add(answer.id)
        answered.append((answer.id, turn_id))
        for call_id, index in first_turn.items():  # the turns after it moved one down
            if at <= index < j:
                first_turn[call_id] = index + 1
    return items


def _slot_of_answer(items: list[_Item], turn: int, answer: str, links: Mapping[str, Link]) -> int:
    """Where the tree order (:func:`~flowdrop_local.rules.order.tree_order`) puts a
    row answering a call of ``items[turn]``: after the rows answering its calls
    already (linked alike, first among its children) whose ids are lower, each
    with what descends from it; so two answers of one turn stand as every later
    merge reads them, whichever was made first. ``items`` are in tree order."""
    parent = items[turn].entry.id
    at = turn + 1
    while at < len(items):
        child = _child_on_the_way(items[at].entry.id, parent, links)
        if child is None or links.get(child) != (parent, MAX_RANK) or child > answer:
            break
        at += 1
    return at


def _child_on_the_way(id_: str, ancestor: str, links: Mapping[str, Link]) -> str | None:
    """The child of ``ancestor`` that ``id_`` descends from (itself, if a child),
    or None if it does not descend from it (as far as ``links`` tell)."""
    node = id_
    for _ in range(len(links) + 1):  # a cycle (a hostile file) ends the walk
        link = links.get(node)
        if link is None or link[0] == ROOT:
            return None
        if link[0] == ancestor:
            return node
        node = link[0]
    return None


_ANSWERED_IN_PLACE = uuid.UUID("6f1d0c6e-3b5a-4c1e-9a7d-2f0e8b4c5d1a")


def answered_in_place_id(result_id: str) -> str:
    """The id of the row that answers a call in its tool run in place of the result
    ``result_id`` standing after a user turn (the same on every replica)."""
    return str(uuid.uuid5(_ANSWERED_IN_PLACE, result_id.lower()))


def _placeholders_in_place(items: list[_Item]) -> list[_Item]:
    """Drop placeholders that are not in the tool run right after the first turn
    declaring their call (what ``check`` requires; healing places a new one)."""
    first_turn = _first_turns(items)
    keep = []
    for i, item in enumerate(items):
        if item.healed:
            turn = first_turn.get(item.call_id or "")
            if turn is None or turn > i or any(x.entry.role != "tool" for x in items[turn + 1 : i]):
                continue
        keep.append(item)
    return keep


def _positions(items: list[_Item]) -> tuple[list[Placed], int]:
    """Keys for the merged order: the most messages that can keep a key do (a longest
    run of keys already ascending along the order, a message both hold keeping
    either side's), the others get keys between their neighbours'. Keys only store
    the order; which messages keep theirs decides nothing about it, but a message
    keeps one when it can, so replicas that re-keyed apart settle on one key."""
    keep = _longest_ascending([item.keys for item in items])
    placed: list[Placed] = []
    rekeyed = 0
    i = 0
    while i < len(items):
        if i in keep:
            placed.append(Placed(items[i].entry, keep[i], items[i].source))
            i += 1
            continue
        j = i
        while j < len(items) and j not in keep:
            j += 1
        lower = placed[-1].position if placed else None
        upper = keep[j] if j < len(items) else None
        for item, key in zip(items[i:j], keys_between(lower, upper, j - i), strict=True):
            placed.append(Placed(item.entry, key, item.source))
            rekeyed += int(key != item.entry.position)
        i = j
    return placed, rekeyed


def _longest_ascending(choices: Sequence[tuple[str, ...]]) -> dict[int, str]:
    """A longest strictly ascending run of keys taking at most one of each item's
    choices, in order (patience sorting, O(n log n); an item's choices are tried
    greatest first, so one cannot follow another of the same item): item index ->
    the key it keeps. Deterministic for a given sequence."""
    tail_keys: list[str] = []  # the least key ending a run of each length, ascending
    tails: list[tuple[int, str]] = []  # (item, key) ending it
    before: dict[tuple[int, str], tuple[int, str] | None] = {}
    for i, keys in enumerate(choices):
        for key in sorted(set(keys), reverse=True):
            k = bisect.bisect_left(tail_keys, key)
            before[(i, key)] = tails[k - 1] if k else None
            if k == len(tails):
                tails.append((i, key))
                tail_keys.append(key)
            else:
                tails[k] = (i, key)
                tail_keys[k] = key
    found: dict[int, str] = {}
    at = tails[-1] if tails else None
    while at is not None:
        found[at[0]] = at[1]
        at = before[at]
    return found


# ------------------------------------------------------------- last writer wins
# Memory values, session rows and viewer grants (not messages: those merge above).


class Version(NamedTuple):
    """One side's version of a keyed value: when it was written (a :func:`stamp`),
    whether it is a deletion (a tombstone), and its canonical text (:func:`canonical`;
    a memory value's is followed by its ``created_at``)."""

    stamp: str
    deleted: bool
    text: str


def stamp(moment: str) -> str:
    """A timestamp both backends and both writers (milliseconds in SQL, microseconds
    in Python) compare alike as text: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    body = moment.rstrip("Z")
    whole, _, fraction = body.partition(".")
    return f"{whole}.{fraction[:6].ljust(6, '0')}Z"


def canonical(value_text: str) -> str:
    """A JSON value's canonical text (sorted keys, no spaces): equal values, equal text."""
    try:
        return json.dumps(
            json.loads(value_text), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
    except ValueError:
        return value_text


def latest(*versions: Version | None) -> Version | None:
    """Last writer wins: the version with the latest stamp; at equal stamps a deletion
    beats a value (a revoke or delete is never undone by a tie), then the greater
    canonical text wins (deterministic, whichever side is ``a``)."""
    present = [v for v in versions if v is not None]
    return max(present) if present else None


SessionRow = tuple[Any, ...]  # id, workflow_id, name, owner_id, status, conversation,
# metadata, created_at, updated_at (the order of the export statements)


def merge_session(x: SessionRow, y: SessionRow, base: SessionRow | None = None) -> SessionRow:
    """One session as both sides will hold it, field by field: a field only one side
    changed since ``base`` (the row at the two stores' last sync) takes that side's
    value; a field both changed (or any field, without a base) takes the value of
    the row written last (by ``updated_at``; at a tie the greater canonical text of
    the fields). The ``conversation`` counter is the greater of the two (two sides
    that reset apart both made ``conversation-<n+1>``, which then merge as one
    buffer); ``created_at`` the earlier, ``updated_at`` the later."""

    def order(row: SessionRow) -> tuple[str, str]:
        return stamp(str(row[8])), json.dumps([str(v) for v in row[1:7]])

    later, earlier = (x, y) if order(x) >= order(y) else (y, x)
    fields = []
    for i in (1, 2, 3, 4, 6):  # workflow_id, name, owner_id, status, metadata
        if base is not None and earlier[i] == base[i]:
            fields.append(later[i])
        elif base is not None and later[i] == base[i]:
            fields.append(earlier[i])
        else:
            fields.append(later[i])
    workflow_id, name, owner_id, status, metadata = fields
    created = min(str(x[7]), str(y[7]), key=stamp)
    conversation = max(int(x[5]), int(y[5]))
    return (x[0], workflow_id, name, owner_id, status, conversation, metadata, created, later[8])

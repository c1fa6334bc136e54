"""Deletions across a sync: recorded, acknowledged, sent, applied, compacted.

The library records a deletion when it happens (the triggers in :mod:`.schema`);
what a writer behind the library deleted is found by comparing a buffer read whole
with the ids it held at the last sync (:func:`record_found`). Each tombstone is
numbered by its store's change sequence. What a store knows its peer holds of its
tombstones is what the peer committed, learnt at the start of their next sync
(:func:`learn_acknowledgements`), never what a sync sent; a tombstone is
compacted once every known peer acknowledged it (:func:`compact`).

A tombstone says what it deleted (its kind, :mod:`.schema`): a placeholder's never
removes a real result that replaced it meanwhile, and a message's also removes the
rows a merge made to hold that message's content elsewhere (:func:`holding`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..engine import remove_message
from ..plans import run_plan
from ..rules.merge import answered_in_place_id
from .common import Address, Scopes, wall_clock
from .report import Report
from .schema import DELETED_MESSAGE, DELETED_PLACEHOLDER
from .side import Side, spares, tombstone_kind


def learn_acknowledgements(a: Side, b: Side) -> None:
    """Each side's record of what the other holds of its tombstones, from the
    other's own committed mark of it (a sync whose other half was lost
    acknowledged nothing). A peer cannot have received a number never given."""
    for source, target in ((a, b), (b, a)):
        row = target.tx.one("sync_peer", (source.replica,))
        if row is not None:
            acked = min(max(0, int(row[0])), source.first_seq)
            source.tx.run("sync_ack_put", (target.replica, acked))


def record_found(sides: Iterable[Side], addresses: Iterable[Address]) -> None:
    """Step 1: what each side deleted behind the library since its last sync (a
    message its buffer held then and lacks now) becomes its tombstone. A buffer
    unchanged or only appended to since has lost nothing."""
    for side in sides:
        gone: list[tuple[str, Address]] = []
        for address in sorted(addresses):
            view = side.views[address]
            if view.state is None or view.kind in ("unchanged", "grown"):
                continue
            present = {e.id for e in view.entries}
            gone += [(id_, address) for id_ in view.held_at_last_sync() if id_ not in present]
        # The library's own deletions have their tombstones (and kinds) already; what
        # a row deleted behind it was is gone with it: each counts as a message.
        dead = side.tombstoned([id_ for id_, _ in gone])
        side.tombstone([(i, address, DELETED_MESSAGE) for i, address in gone if i not in dead])


def exchange(a: Side, b: Side, scopes: Scopes, full: bool, report: Report) -> set[Address]:
    """Step 2: each side receives the tombstones the other numbered past its mark of
    it, in the scopes the sync covers, and deletes those messages with the engine's
    own ``remove_message`` (healing is left to the merge, which may bring the
    call's result). Returns the buffers that lost messages."""
    touched: set[Address] = set()
    for source, target in ((a, b), (b, a)):
        mark_row = target.tx.one("sync_peer", (source.replica,))
        mark = 0 if mark_row is None else int(mark_row[0])
        rows = source.tx.all("sync_tombstones_after", (mark,))
        arriving = [
            (str(r[0]), (r[1], r[2], r[3]), tombstone_kind(source.store.path, r))
            for r in rows
            if (r[1], r[2], r[3]) in scopes
        ]
        known = target.tombstoned([id_ for id_, _, _ in arriving])  # sent again, or relayed
        arriving = [item for item in arriving if item[2] < known.get(item[0], item[2] + 1)]
        # A tombstone is judged by the receiver's own row: one naming a message the
        # receiver holds in another buffer than it claims is refused (a peer could
        # otherwise delete, then relay the deletion of, a message outside the scopes
        # it syncs), and not kept.
        held = target.where([id_ for id_, _, _ in arriving])
        refused = [item for item in arriving if held.get(item[0].lower(), item[1]) != item[1]]
        arriving = [item for item in arriving if item not in refused]
        report.add("tombstones_refused", len(refused))
        target.tombstone(arriving)
        report.add(f"tombstones_{source.label}_to_{target.label}", len(arriving))
        for address, ids in _removed_by(target, arriving, scopes).items():
            source.view(address, full)  # as it was before the deletion
            target.view(address, full)
            for id_ in ids:
                if run_plan(remove_message(id_, heal_now=False), target.tx):
                    touched.add(address)
                    report.add(f"deleted_on_{target.label}", 1)
    return touched


def _removed_by(
    side: Side, tombstones: Sequence[tuple[str, Address, int]], scopes: Scopes
) -> dict[Address, list[str]]:
    """The rows of ``side`` these tombstones remove, by buffer (in the scopes a sync
    covers): a placeholder's tombstone only a row that is still one; a message's
    its row and those :func:`holding` its content (each given a tombstone too, so
    the deletion reaches a replica holding the copy but not the original)."""
    removed: dict[Address, list[str]] = {}
    ids = [id_ for id_, _, _ in tombstones]
    held = side.where(ids)
    placeholders = side.placeholders(
        [id_ for id_, _, kind in tombstones if kind == DELETED_PLACEHOLDER]
    )
    copies: list[tuple[str, Address, int]] = []
    for id_, address, kind in tombstones:
        at = held.get(id_.lower())
        if at is not None and at in scopes and not spares(kind, id_.lower() in placeholders):
            removed.setdefault(at, []).append(id_)
        if kind == DELETED_MESSAGE:
            copies += [(copy, address, kind) for copy in holding(id_)]
    found = side.where([id_ for id_, _, _ in copies])
    copies = [item for item in copies if found.get(item[0]) == item[1] and item[1] in scopes]
    side.tombstone(copies)
    for copy, address, _ in copies:
        removed.setdefault(address, []).append(copy)
    return removed


MAX_COPY_DEPTH = 4
"""How many times over a merge may have answered a result in a tool run (a row
holding a copy's content): the rows :func:`holding` names."""


def holding(message_id: str) -> list[str]:
    """The ids of the rows a merge may have made to hold this message's content
    elsewhere (``rules.merge.answered_in_place_id``, and its own such rows, up to
    :data:`MAX_COPY_DEPTH`): a deletion of the message is a deletion of them."""
    found = []
    at = message_id
    for _ in range(MAX_COPY_DEPTH):
        at = answered_in_place_id(at)
        found.append(at)
    return found


def advance_marks(a: Side, b: Side, scopes: Scopes) -> None:
    """Step 5: each side now holds every tombstone the other has (those it sent,
    received and made in the merges); and, after a sync of everything, each learns
    the other's peers (a backup of a backup, say), so compaction waits for them.

    A scoped sync moves no mark: the tombstones it skipped must still come later.
    The mark is the source's number at the start of this sync, not its last: were
    this sync killed between its two commits, the side that did not commit gives
    its numbers after that again, to other tombstones (sent again next time; the
    ones this sync numbered are skipped as known). A peer's retirements are its
    own: a store retires a replica only by its own ``forget_peer`` (a forged list
    would cut honest replicas apart), and never adopts a peer it retired."""
    for source, target in ((a, b), (b, a)):
        row = target.tx.one("sync_peer", (source.replica,))
        mark = source.first_seq if scopes.everything else (0 if row is None else int(row[0]))
        target.tx.run("sync_peer_put", (source.replica, mark, wall_clock()))
    if not scopes.everything:
        return
    now = wall_clock()
    for side, other in ((a, b), (b, a)):
        retired = {str(r[0]) for r in side.tx.all("sync_retired_all")}
        for (peer,) in other.tx.all("sync_peers_all"):
            if peer != side.replica and str(peer) not in retired:
                side.tx.run("sync_peer_adopt", (peer, now, peer))


def compact(sides: Iterable[Side], report: Report) -> None:
    """Step 7: a tombstone every peer this store has synced with has received is
    needed by none of them (each deleted the message and holds its own tombstone)."""
    for side in sides:
        floor = side.tx.one("sync_compact_floor")[0]
        if floor:
            compacted = side.tx.run("sync_compact", (floor,))
            report.add(f"tombstones_compacted_on_{side.label}", compacted)

"""Conversations across a sync: title and metadata go by last writer wins; a
deletion (recorded by the triggers, or found) deletes the buffer on the other side,
with tombstones for what it held there, unless that side holds a turn the deleting
side never saw (observed-remove: a deletion removes what its side held, whatever
the clocks say)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from ..buffer import checked_json, valid_title
from ..errors import (
    InvalidArgument,
    SyncRefused,
)
from ..rules.merge import Version, latest, stamp
from .common import Address, Scopes
from .registers import ceiling_of, tick
from .report import Report
from .side import Side, deletion_kind


class Conversation(NamedTuple):
    """A conversation on one side as a sync found it: its version (None: never
    there), its buffer row (None: none) and what the side recorded of it."""

    version: Version | None
    row: tuple[Any, ...] | None
    recorded: tuple[str, bool] | None


def conversation_versions(
    a: Side, b: Side, addresses: set[Address], scopes: Scopes, since: dict[str, str]
) -> dict[Address, dict[str, Conversation]]:
    """Each candidate conversation's version on each side (None: never there).

    Candidates: the buffers this sync looks at, and the conversations either side
    renamed or deleted since the pair's mark less the margin
    (``flowdrop_sync_conversations``; every one at a pair's first sync). A buffer's version is
    stamped by its last rename here, else its creation, or its last append if
    later (a conversation written to after another side deleted it survives); a
    deleted one by its deletion. The text is its title and metadata.
    """
    ceiling = ceiling_of(a, b)
    recorded: dict[str, dict[Address, tuple[str, bool]]] = {}
    for side in (a, b):
        recorded[side.label] = {
            (str(r[0]), str(r[1]), str(r[2])): (stamp(str(r[3])), bool(r[4]))
            for r in side.tx.all("sync_conversations")
        }
    candidates = set(addresses)
    for label, found in recorded.items():  # renamed or deleted since the pair's mark
        after = stamp(since[label]) if since[label] else ""
        candidates |= {
            address for address, (when, _) in found.items() if address in scopes and when >= after
        }
    versions: dict[Address, dict[str, Conversation]] = {}
    for address in sorted(candidates):
        versions[address] = {}
        for side in (a, b):
            found = side.tx.one("sync_conversation_row", address)
            row = None if found is None else tuple(found)
            mark = recorded[side.label].get(address)
            version: Version | None
            if row is None:
                if mark is not None and mark[1]:  # deleted here, as the trigger recorded
                    version = Version(min(mark[0], ceiling), True, "")
                elif side.tx.one("sync_state_one", address) is not None:
                    # Held at the last sync and gone, with no record of it: deleted
                    # behind the library. Stamped when this sync finds it.
                    version = Version(min(stamp(side.now), ceiling), True, "")
                else:
                    version = None
            else:
                try:  # a peer's name is untrusted input, as a caller's set_title is
                    valid_title(str(row[1]))
                    checked_json(json.loads(str(row[2])))
                except InvalidArgument as error:
                    raise SyncRefused(
                        side.store.path, "/".join(address), f"(a conversation) has {error}"
                    ) from None
                named = mark[0] if mark is not None and not mark[1] else stamp(str(row[3]))
                last = stamp(str(row[5])) if row[5] else ""
                when = min(max(named, stamp(str(row[4])), last), ceiling)
                text = json.dumps([str(row[1]), json.loads(str(row[2]))], sort_keys=True)
                version = Version(when, False, text)
            versions[address][side.label] = Conversation(version, row, mark)
    return versions


def sync_conversations(
    a: Side, b: Side, versions: dict[Address, dict[str, Conversation]], report: Report
) -> set[Address]:
    """Give both sides the winning version of each conversation; return the
    addresses deleted on both (no merge follows for them). A side that holds the
    winner as recorded is left as it is (nothing written)."""
    deleted: set[Address] = set()
    for address, held in versions.items():
        winner = latest(held["a"].version, held["b"].version)
        if winner is None:
            continue
        if winner.deleted:
            winner = _kept_by_an_unseen_turn(a, b, held, winner)
        for side in (a, b):
            found = held[side.label]
            if found.version == winner and found.recorded == (winner.stamp, winner.deleted):
                if winner.deleted:
                    side.tx.run("sync_state_drop", address)  # nothing held: none to compare
                    deleted.add(address)
                continue
            row = found.row  # as read before the tombstones: its id, title and metadata stand
            if winner.deleted:
                if row is not None:
                    gone = side.entries(int(row[0]))
                    kinds = [(e.id, address, deletion_kind(e, by_merge=False)) for e in gone]
                    side.tombstone(kinds)
                    side.tx.run("delete_buffer", (int(row[0]),))
                    side.views.pop(address, None)
                    report.add(f"conversations_deleted_on_{side.label}", 1)
                side.tx.run("sync_conversation_put", (*address, winner.stamp, 1))
                side.tx.run("sync_state_drop", address)  # nothing held: none to compare
                deleted.add(address)
                continue
            title, metadata = json.loads(winner.text)
            text = json.dumps(metadata, ensure_ascii=False, sort_keys=True)
            made = row is None
            if made:
                side.tx.run("create_buffer", address)
                row = side.tx.one("sync_conversation_row", address)
                side.views.pop(address, None)
            assert row is not None
            other = held["b" if side is a else "a"].row
            created = other[3] if made and other is not None else None  # one created_at
            differs = (str(row[1]), json.loads(str(row[2]))) != (title, metadata)
            if made or differs:
                side.tx.run("import_conversation", (title, text, created, int(row[0])))
            if differs:
                report.add(f"conversations_named_on_{side.label}", 1)
            if found.recorded is not None or (title, metadata) != ("", {}) or made:
                side.tx.run("sync_conversation_put", (*address, winner.stamp, 0))
    return deleted


def _kept_by_an_unseen_turn(
    a: Side, b: Side, held: dict[str, Conversation], deletion: Version
) -> Version:
    """The version that stands against a conversation's deletion: the deletion, or,
    when the live side still holds a turn after the deletion's tombstones removed
    what the deleting side held (so one that side never saw), the live side's title
    and metadata, stamped just after the deletion so that no copy of the deletion
    wins again. A tool result alone is not a turn: it answers a call that went."""
    for side in (a, b):
        row = held[side.label].row
        version = held[side.label].version
        if row is None or version is None or version.deleted:
            continue
        if any(e.role != "tool" for e in side.entries(int(row[0]))):
            return Version(tick(max(deletion.stamp, version.stamp)), False, version.text)
    return deletion

"""Buffers that differ: ordered as every replica orders them (:mod:`.order`),
merged by :func:`flowdrop_local.rules.merge.merge`, healed on the first side,
copied to the second; edits carry generations, and what a merge dropped that was
not a duplicate is kept as a conflict."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import attrs

from ..engine import heal, remove_message
from ..errors import (
    SyncIdConflict,
    SyncRefused,
)
from ..plans import run_plan
from ..rules.merge import Entry, Merged, merge
from .common import Address, Scopes, wall_clock
from .order import Ordering, record_links, shared_order
from .report import Report
from .side import (
    MAX_MESSAGE_CHARS,
    MAX_SYNC_COUNT,
    Side,
    View,
    address_problem,
    deletion_kind,
    digest_of,
    held_of,
    is_placeholder_row,
    spares,
    summary_of,
)
from .write import settle, write_merged


def keep_state(side: Side, address: Address, digest: str, held: str, view: View) -> None:
    """Remember what the buffer holds now (its digest, and its ids for the next sync's
    deletions) and its summary now (so the next sync reads it only if it changed)."""
    found = side.tx.one("sync_summary_one", address)
    if found is None:  # no buffer (an empty one keeps its state: it has a summary)
        if view.state is not None:
            side.tx.run("sync_state_drop", address)
        return
    state = (digest, summary_of(found))
    if view.state != state:
        side.tx.run("sync_state_put", (*address, digest, held, state[1]))


@attrs.define
class _Read:
    """Both sides' rows of one buffer as a merge reads them.

    ``tail`` (a buffer both sides only appended to since they last held the same):
    the recorded last position, the count up to it and the recorded digest; then
    ``before`` holds each side's rows from ``start`` (the last user turn at or
    before that row) and ``context`` the ids both hold up to it."""

    buffer_ids: dict[str, int]
    before: dict[str, list[Entry]]
    tail: tuple[str, int, str] | None
    start: str = ""
    context: list[str] = attrs.field(factory=list)


def merge_buffer(
    address: Address,
    first: Side,
    second: Side,
    report: Report,
    *,
    grown: bool,
    stale: bool = False,
) -> tuple[str, str, bool] | None:
    """Merge one buffer: decide, write the first side, heal there, copy to the second.
    Returns the buffer's state as both sides now hold it (digest, held ids), and
    whether anything was merged.

    ``grown``: both sides only appended at the end since they last held the same
    rows (up to the recorded last row): read and merge from the last user turn at or
    before that row (the calls after it may be answered by either side), keep the
    rest as it is. None when that does not hold after all (nothing is written
    then): the caller merges the buffer whole. ``stale``: a tombstone changed the
    buffer in this sync, so rows read before are read again. None too when a side
    held a message the other deleted: it is deleted, and the buffer read again.
    """
    views = {side.label: side.views[address] for side in (first, second)}
    read = _read(address, first, second, grown=grown, stale=stale)
    if read is None:
        return None
    before, tail = read.before, read.tail
    if tail is not None and all(len(rows) == len(read.context) for rows in before.values()):
        return tail[2], views[first.label].held_at_last_sync_text(), False  # nothing new
    if _deleted_elsewhere(address, first, second, before, report):
        return None
    _refuse_one_id_two_roles(address, before)
    sides = {first.label: first, second.label: second}
    generations = {
        side.label: generations_of(
            side, before[side.label], {} if tail else views[side.label].held_at_last_sync()
        )
        for side in (first, second)
    }
    anchor = read.context[-1] if tail is not None and read.context else None
    ordering = shared_order((first, second), before, anchor)
    if ordering is None:  # a new row a third replica placed among the old ones
        return None
    merged: Merged = merge(
        before["a"],
        before["b"],
        ordering.order,
        generations["a"],
        generations["b"],
        ordering.links,
    )
    if tail is not None:  # the rows both held stay where they are, the new ones after
        inside = [p.entry.id for p in merged.placed if p.position <= tail[0]]
        if inside != read.context:
            return None
    _record_conflicts(merged, address, sides, report)
    report.add("replaced", merged.replaced)
    report.add("edited", merged.edited)
    final, healed = _write_both(first, second, read, merged, generations, ordering, report)
    _account(address, first, second, before, final, healed, report)
    return _state_after(first, read, final, views[first.label])


def _read(address: Address, first: Side, second: Side, *, grown: bool, stale: bool) -> _Read | None:
    """Each side's rows of the buffer (see :class:`_Read`); None when a grown
    buffer's rows up to the recorded last one differ after all."""
    views = {side.label: side.views[address] for side in (first, second)}
    read = _Read({}, {}, None)
    if grown:
        state = views[first.label].state
        assert state is not None
        _, _, last, tally = state[1].split("|")[:4]
        read.tail = (last, int(tally), state[0])
    for side in (first, second):
        buffer_id = side.tx.open_buffer(*address, None).id
        read.buffer_ids[side.label] = buffer_id
        view = views[side.label]
        if read.tail is not None:
            row = side.tx.one("sync_context_start", (buffer_id, read.tail[0]))
            read.start = "" if row is None or row[0] is None else str(row[0])
            read.before[side.label] = side.entries_from(buffer_id, read.start)
        else:
            fresh = view.read and not stale
            read.before[side.label] = view.entries if fresh else side.entries(buffer_id)
    if read.tail is not None:
        last = read.tail[0]
        read.context = [e.id for e in read.before[first.label] if e.position <= last]
        if read.context != [e.id for e in read.before[second.label] if e.position <= last]:
            return None
    return read


def _deleted_elsewhere(
    address: Address, first: Side, second: Side, before: dict[str, list[Entry]], report: Report
) -> bool:
    """A message one side holds and the other deleted (its tombstone was compacted on
    a third store that took the message back, say) is deleted, never sent; but a
    real result is not deleted by a placeholder's tombstone (it replaced the
    placeholder in place, MEM-10, where the deletion had not reached): it is sent.
    Whether any was deleted (then the buffer is read again, whole)."""
    held_ids = {label: {e.id for e in rows} for label, rows in before.items()}
    dropped = False
    for holder, other in ((first, second), (second, first)):
        rows = {e.id: e for e in before[holder.label] if e.id not in held_ids[other.label]}
        dead = other.tombstoned(rows)
        for id_, kind in sorted(dead.items()):
            if spares(kind, is_placeholder_row(rows[id_].role, rows[id_].metadata)):
                continue
            if run_plan(remove_message(id_, heal_now=False), holder.tx):
                holder.tombstone([(id_, address, kind)])
                report.add(f"deleted_on_{holder.label}", 1)
                dropped = True
    return dropped


def _refuse_one_id_two_roles(address: Address, before: dict[str, list[Entry]]) -> None:
    roles = {e.id: e.role for e in before["a"]}
    for e in before["b"]:
        if roles.get(e.id, e.role) != e.role:
            raise SyncIdConflict(
                f"message id {e.id} in buffer {'/'.join(address)} is a {roles[e.id]} message "
                f"on one side and a {e.role} message on the other: an id names one message; "
                "give one of them another id, then sync again"
            )


def _write_both(
    first: Side,
    second: Side,
    read: _Read,
    merged: Merged,
    generations: dict[str, dict[str, int]],
    ordering: Ordering,
    report: Report,
) -> tuple[list[Entry], list[str]]:
    """The merged rows on the first side, healed there (the engine's healing, as an
    append would), then copied to the second; each side keeps the generations of the
    versions kept, and both every link. Returns the rows both now hold and those
    healed."""
    sides = {first.label: first, second.label: second}
    before = read.before
    above = 0 if read.tail is None else read.tail[1] - len(read.context)  # older rows
    target = [
        (p.entry, p.position, sides[p.source[0]] if p.source != "ab" else first)
        for p in merged.placed
    ]
    first_id, second_id = read.buffer_ids[first.label], read.buffer_ids[second.label]
    write_merged(first, first_id, before[first.label], target, whole=read.tail is None)
    healed: list[str] = []
    count = above + len(target)
    run_plan(heal(first_id, None, 0, count, healed, before_users_only=True), first.tx)
    report.add("healed", len(healed))
    settle(first, first_id, count + len(healed))
    final = first.entries_from(first_id, read.start)
    kept_as = {e.id: e.fingerprint for e in final}
    winners = {  # each side's generations of the versions kept
        label: {
            e.id: generations[label][e.id]
            for e in before[label]
            if e.id in generations[label] and kept_as.get(e.id) == e.fingerprint
        }
        for label in before
    }
    keep_generations((first, second), final, winners)
    record_links(
        (first, second), final, ordering, whole=not read.start, answered=dict(merged.answered)
    )
    write_merged(
        second,
        second_id,
        before[second.label],
        [(e, e.position, first) for e in final],
        whole=read.tail is None,
    )
    settle(second, second_id, above + len(final))
    return final, healed


def _account(
    address: Address,
    first: Side,
    second: Side,
    before: dict[str, list[Entry]],
    final: list[Entry],
    healed: list[str],
    report: Report,
) -> None:
    """Every message that was on a side and is not now is a tombstone on both; the
    report counts what each side lost, received and re-keyed."""
    kept = {e.id for e in final}
    for side in (first, second):
        lost = sum(1 for e in before[side.label] if e.id not in kept)
        report.add(f"deleted_on_{side.label}", lost)
    removed: dict[str, int] = {}  # id -> the tombstone's kind: the stronger of its rows'
    for rows in before.values():
        for e in rows:
            if e.id not in kept:
                kind = deletion_kind(e, by_merge=True)
                removed[e.id] = min(kind, removed.get(e.id, kind))
    for side in (first, second):
        side.tombstone([(id_, address, kind) for id_, kind in sorted(removed.items())])
    new = set(healed)
    for side, other in ((first, second), (second, first)):
        have = {e.id for e in before[side.label]}
        report.add(
            f"sent_{other.label}_to_{side.label}",
            sum(1 for e in final if e.id not in have and e.id not in new),
        )
    was = {e.id: e.position for side in before.values() for e in side}
    rekeyed = [e.id for e in final if e.id in was and was[e.id] != e.position]
    report.add("rekeyed", len(rekeyed))


def _state_after(first: Side, read: _Read, final: list[Entry], view: View) -> tuple[str, str, bool]:
    """The buffer's recorded state after the merge: digest and held ids (of the
    rows after the recorded last one, added to what was recorded, for a grown one)."""
    rows = [(e.id, e.position, e.fingerprint) for e in final]
    tail = read.tail
    if tail is None:
        return digest_of(rows), held_of(rows), True
    if [row[0] for row in rows if row[1] <= tail[0]] != read.context:
        # Healing placed a row among the older ones: read the buffer whole.
        first_id = read.buffer_ids[first.label]
        rows = [(e.id, e.position, e.fingerprint) for e in first.entries(first_id)]
        return digest_of(rows), held_of(rows), True
    grown_rows = [row for row in rows if row[1] > tail[0]]
    held = " ".join(filter(None, (view.held_at_last_sync_text(), held_of(grown_rows))))
    return digest_of(grown_rows, tail[2]), held, True


def generations_of(side: Side, entries: Sequence[Entry], held: Mapping[str, str]) -> dict[str, int]:
    """The generation of each message's version on ``side`` (only those above 0).

    A version is generation 0 as written; each edit makes the next. The generation
    recorded for a message (``flowdrop_sync_versions``) is that of the version
    recorded with it; a message whose version differs from the one the side held
    at its last sync (``held``: id -> fingerprint prefix) was edited since: one
    more. Every sync that reads a message records its generation on both sides,
    so a later edit always carries a higher number than the version it replaced.
    """
    recorded = side.versions([e.id for e in entries])
    found: dict[str, int] = {}
    for e in entries:
        row = recorded.get(e.id)
        if row is not None and row[0] == e.fingerprint:
            generation = row[1]
        else:
            before = 0 if row is None else row[1]
            prefix = held.get(e.id)
            edited = prefix is not None and not e.fingerprint.startswith(prefix)
            kept = 0 if row is None else before
            generation = min(before + 1, MAX_SYNC_COUNT) if edited else kept
        if generation:
            found[e.id] = generation
    return found


def keep_generations(
    sides: Sequence[Side], final: Sequence[Entry], generations: Mapping[str, Mapping[str, int]]
) -> None:
    """Record, on both sides, the generation of each version both now hold: the
    highest of the generations either side had for that very version."""
    rows = []
    for e in final:
        generation = max((found.get(e.id, 0) for found in generations.values()), default=0)
        if generation:
            rows.append((e.id, e.fingerprint, generation))
    if rows:
        for side in sides:
            side.tx.many("sync_version_put", rows)


def _record_conflicts(
    merged: Merged, address: Address, sides: dict[str, Side], report: Report
) -> None:
    """Conflicts keep the whole dropped message, on both sides."""
    if not merged.conflicts:
        return
    now = wall_clock()
    rows = []
    for conflict in merged.conflicts:
        holder = sides["a" if conflict.dropped_side == "ab" else conflict.dropped_side]
        content, parts = holder.contents([conflict.dropped.id])[conflict.dropped.id]
        message = {
            "id": conflict.dropped.id,
            "role": conflict.dropped.role,
            "content": json.loads(content) if parts else content,
            "metadata": json.loads(conflict.dropped.metadata),
            "created_at": conflict.dropped.created_at,
        }
        rows.append(
            (
                conflict.dropped.id,
                conflict.dropped.fingerprint,
                conflict.rule,
                *address,
                conflict.call_id,
                conflict.kept_id,
                json.dumps(message, ensure_ascii=False),
                now,
            )
        )
        report.conflict(conflict.rule)
    for side in sides.values():
        side.tx.many("sync_conflict_put", rows)


def merge_buffers(
    sides: tuple[Side, Side],
    order: Sequence[Side],
    addresses: Iterable[Address],
    touched: set[Address],
    full: bool,
    report: Report,
) -> None:
    """Step 3: each buffer that differs merges, only its new rows when both sides
    only grew at the end since they last held the same (equal recorded digests),
    else whole; one both hold alike keeps its generations and recorded state."""
    for address in sorted(addresses):
        views = {side.label: side.view(address, full) for side in sides}
        kinds = {views[label].kind for label in views}
        recorded = {view.state[0] if view.state else None for view in views.values()}
        state: tuple[str, str, bool] | None = None
        if address in touched:
            pass
        elif kinds <= {"unchanged", "grown"} and len(recorded) == 1:
            if kinds == {"unchanged"}:
                continue
            state = merge_buffer(address, order[0], order[1], report, grown=True)
        elif views["a"].digest == views["b"].digest:
            read = [side for side in sides if views[side.label].read]
            found = {
                s.label: generations_of(
                    s, views[s.label].entries, views[s.label].held_at_last_sync()
                )
                for s in read
            }
            if read:  # both hold the same versions: their generations, on both
                keep_generations(sides, views[read[0].label].entries, found)
            for side in read:  # its recorded state may be out of date
                view = views[side.label]
                keep_state(side, address, digest_of(view.rows), held_of(view.rows), view)
            continue
        stale = address in touched
        while state is None:  # None: it dropped messages the other side deleted: again
            state = merge_buffer(address, order[0], order[1], report, grown=False, stale=stale)
            stale = True
        report.add("buffers_merged", int(state[2]))
        for side in sides:
            keep_state(side, address, state[0], state[1], views[side.label])


def share_conflicts(a: Side, b: Side, scopes: Scopes) -> None:
    """What a merge dropped that was not a duplicate is kept on every replica, not
    only on the pair whose merge dropped it: a replica that later loses its own
    version by taking the pair's merge finds the record too. A peer's record is
    untrusted input: checked as a message row would be, and only in the scopes the
    sync covers."""
    records = {side.label: side.tx.all("sync_conflicts_all") for side in (a, b)}
    for source, target in ((a, b), (b, a)):
        have = {(str(r[0]), str(r[1])) for r in records[target.label]}
        for row in records[source.label]:
            address = (str(row[3]), str(row[4]), str(row[5]))
            if (str(row[0]), str(row[1])) in have or address not in scopes:
                continue
            problem = address_problem(*address)
            if problem is None and len(str(row[8])) > MAX_MESSAGE_CHARS:
                problem = f"is longer than {MAX_MESSAGE_CHARS:,} characters"
            if problem is None:
                try:
                    json.loads(str(row[8]))
                except ValueError:
                    problem = "is not JSON"
            if problem is not None:
                raise SyncRefused(source.store.path, str(row[0]), problem, kind="conflict record")
            target.tx.run("sync_conflict_put", tuple(row))

"""Writing a merged buffer back on one side: rows placed, moved or removed as the
merge decided, the ledger refreshed, the count settled."""

from __future__ import annotations

import json

from ..engine import MessageRow
from ..errors import (
    SyncRefused,
)
from ..rules.merge import Entry
from ..rules.pairing import declared_call_ids
from .side import MAX_SYNC_POSITION, Side, message_problem, placeholder_problem


def write_merged(
    side: Side,
    buffer_id: int,
    current: list[Entry],
    target: list[tuple[Entry, str, Side]],
    *,
    whole: bool,
) -> None:
    """Make one side's buffer hold ``target`` (entry, position, the side holding its
    version) where it holds ``current``: delete what goes or moves, insert what
    comes or moved, update what changed in place. ``whole``: ``current`` is the
    whole buffer, and the ledger is rebuilt from ``target``; else (the rows from a
    user turn on) the ledger keeps its answered calls, and the turns of ``target``
    declare theirs again (INSERT OR IGNORE), each with the result answering it."""
    have = {e.id: e for e in current}
    inserts = [
        (e, position, source)
        for e, position, source in target
        if e.id not in have or have[e.id].position != position
    ]
    updates = [
        (e, source)
        for e, position, source in target
        if e.id in have
        and have[e.id].position == position
        and have[e.id].fingerprint != e.fingerprint
    ]
    wanted = {e.id: position for e, position, _ in target}
    deletes = [e.id for e in current if wanted.get(e.id) != e.position]
    if not (inserts or updates or deletes):
        return
    contents: dict[str, tuple[str, int]] = {}
    by_source: dict[int, tuple[Side, list[str]]] = {}
    for e, _, source in inserts:
        by_source.setdefault(id(source), (source, []))[1].append(e.content_of or e.id)
    for e, source in updates:
        by_source.setdefault(id(source), (source, []))[1].append(e.content_of or e.id)
    for source, ids in by_source.values():
        contents.update(source.contents(ids))
    for e, _, _ in inserts:
        if e.content_of:
            contents[e.id] = contents[e.content_of]
    for e, _ in updates:
        if e.content_of:
            contents[e.id] = contents[e.content_of]
    for e, source in [(e, source) for e, _, source in inserts] + updates:
        content, parts = contents[e.id]
        problem = placeholder_problem(e, content) or message_problem(e, content, parts)
        if problem is not None:
            raise SyncRefused(source.store.path, e.id, problem)
    for e, position, _ in inserts:  # a key the merge made between a peer's keys
        if len(position) > MAX_SYNC_POSITION:
            raise SyncRefused(
                side.store.path, e.id, f"would take a key of {len(position):,} characters"
            )
    tx = side.tx
    if whole:
        tx.run("clear_ledger", (buffer_id,))  # no ledger while rows move: rebuilt below
    for id_ in deletes:  # (the ledger's rows of a deleted turn go with it)
        tx.run("delete_message", (buffer_id, id_))
    if not whole:  # unanswered calls are declared after the last user turn: in target
        tx.run("sync_drop_unanswered", (buffer_id,))
    if inserts:
        tx.many(
            "insert_message",
            [
                MessageRow(
                    e.id, buffer_id, position, e.role, *contents[e.id], e.metadata, e.created_at, 0
                )
                for e, position, _ in sorted(inserts, key=lambda i: i[1])
            ],
        )
    for e, _ in updates:
        content, parts = contents[e.id]
        tx.write("replace_placeholder", (content, parts, e.metadata, buffer_id, e.id))
    declarations = []
    for e, _, _ in target:
        if e.role == "assistant":
            for ordinal, call_id in enumerate(declared_call_ids(json.loads(e.metadata))):
                declarations.append((buffer_id, call_id, e.id, ordinal))
    if declarations:
        tx.many("declare_call", declarations)
    if not whole:
        tx.run("sync_answered_refresh", (buffer_id,))
    tx.write("touch_edited", (buffer_id,))


def settle(side: Side, buffer_id: int, count: int) -> None:
    """The count on the last row (schema.sql: only the last row's tally counts)."""
    row = side.tx.one("tail", (buffer_id,))
    if row is not None and row[0] is not None:
        side.tx.write("set_tally", (count, buffer_id, row[0]))

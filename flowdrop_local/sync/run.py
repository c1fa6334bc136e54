"""One sync of two stores (``sync(a, b)``), its stages in order.

What a sync does, in one write transaction on each side (taken in the order of
the two replica ids, so two syncs of the same pair never deadlock; a crash
leaves each side before or after the whole sync):

0. **What to look at.** Per peer and scope set each store keeps a mark: its clock
   when the pair's last sync began (``flowdrop_sync_marks``). Only buffers written
   since (``buffers.updated_at``, less :data:`MARGIN`) or deleted whole are looked
   at; with no matching marks, every buffer. Of those, a buffer whose summary is
   the one recorded at the last sync is unchanged (not read); one only appended to
   at the end is read from the last user turn before its recorded last row; any
   other is read whole (:class:`_View`).
1. **Deletions become tombstones.** A buffer read whole is compared with the ids
   it held at its last sync (``flowdrop_sync_state``): a message that was there and
   is gone was deleted here and is recorded as a tombstone with the next number of
   the side's change sequence.
2. **Tombstones travel.** Each side receives the tombstones the other numbered
   past its high-water mark for it, and deletes those messages with the engine's
   own ``remove_message`` (which keeps the ledger and heals, MEM-3). A deleted
   message never comes back from a peer that still holds it.
3. **Buffers that differ merge**, by :func:`flowdrop_local.rules.merge.merge`
   (contiguous blocks, the rules): written to the first side, healed there by
   :func:`flowdrop_local.engine.heal`, and copied from it to the second, so both
   hold the same rows. A buffer both sides only grew at the end merges only its
   new rows.
4. **Sessions, grants, memory.** Session rows merge field by field
   (:func:`~flowdrop_local.rules.merge.merge_session`); viewer grants and memory
   values go by last writer wins (:func:`~flowdrop_local.rules.merge.latest`), a
   revoke or ``memory_delete`` being a tombstone stamped when the sync finds it.
5. **Marks and compaction.** After a sync of everything each side learns the
   other's mark of its tombstones and its peers, and drops the tombstones every
   known peer has received.

Cost: the rows read and written follow what changed since the pair last synced
(``SyncReport.rows_read``), plus a summary per buffer written in the last
:data:`MARGIN` before that. Memory values and grants are read whole when either
side changed them since (else not at all: :func:`_kv_unchanged`); session rows
whole when in scope.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import uuid
from collections.abc import Iterable
from typing import Final

from ..errors import (
    CorruptRow,
    InvalidArgument,
    ReplicaConflict,
    ReplicaRetired,
    SyncIdConflict,
)
from ..store import Store
from . import tombstones
from .common import Address, Scopes, left_out
from .conversations import conversation_versions, sync_conversations
from .merge import merge_buffers, share_conflicts
from .registers import MEMORY, VIEWERS, kv_shape, sync_all_registers
from .replicas import ensure_tables, replica_id
from .report import Report, SyncReport
from .scan import MARGIN, changed_since, last_marks, stamp_before, whole_digest
from .side import Side


class _DryRun(Exception):
    """Raised at the end of a dry run, so both transactions roll back."""


# ---------------------------------------------------------------------- sync


def sync(
    a: Store,
    b: Store,
    scopes: Iterable[object] | str | None = None,
    *,
    dry_run: bool = False,
    full: bool = False,
) -> SyncReport:
    """Merge two stores both ways; afterwards both hold the same buffers, memory,
    sessions and grants (in ``scopes``).

    Args:
        a: one store (any backend).
        b: the other store (any backend).
        scopes: which buffers: ``None`` (default) every non-identity scope
            (``global``, ``workflow``, ``pipeline``, ``execution``); name ``user``
            and ``session`` buffers explicitly: ``("user", "42")``, ``"user:42"``,
            ``"session"`` (all sessions), or ``"all"``.
        dry_run: do everything, report it, and roll both sides back.
        full: read every message of both stores instead of the buffers written since
            the two last synced: for a store written behind the library (plain SQL
            that did not move ``buffers.updated_at``) or a clock set back by more
            than :data:`MARGIN`.

    Raises:
        ReplicaConflict: ``a`` and ``b`` share a replica id but differ (a file copied
            by hand); :func:`new_replica` on the copy fixes it.
        ReplicaRetired: one side retired the other with :func:`forget_peer`.
        InvalidArgument: a scope that is not one.
    """
    wanted = Scopes(scopes if not isinstance(scopes, str) else [scopes])
    for store in (a, b):
        if not isinstance(store, Store):
            raise InvalidArgument(f"sync takes two Store objects, not {type(store).__name__}")
        store.backend.ensure_open()
    report = Report(a.path, b.path, dry_run)
    ids = {label: replica_id(store) for label, store in (("a", a), ("b", b))}
    same_file = _same_file(a, b)
    if same_file or (ids["a"] is not None and ids["a"] == ids["b"]):
        if same_file or whole_digest(a) == whole_digest(b):
            return report.done()  # one store (or an exact copy): nothing to do
        raise ReplicaConflict(
            f"{a.path} and {b.path} carry the same replica id {ids['a']} but hold different "
            "histories: one is a copy of the other made outside flowdrop_local. Give the copy "
            "its own id (flowdrop_local.syncing.new_replica(store), or "
            "'flowdrop-local sync --new-replica COPY'), then sync again"
        )
    # Locks in the order of replica ids (a store without one yet makes it first).
    order = sorted([("a", a), ("b", b)], key=lambda s: (ids[s[0]] or "~", s[0]))
    # A PostgreSQL server that many stores sync with at once may pick this sync as
    # a deadlock's victim (or fail it for serialisation): both sides rolled back,
    # so it runs again, a few times, after a short random wait.
    for attempt in range(SYNC_RETRIES):
        try:
            report = Report(a.path, b.path, dry_run)
            _sync_once(a, b, order, wanted, report, full, dry_run)
            break
        except Exception as error:
            if getattr(error, "sqlstate", None) not in _RETRIED_STATES:
                raise
            if attempt == SYNC_RETRIES - 1:
                failed = a if getattr(a.backend, "kind", "") == "postgresql" else b
                raise failed.backend._translated(error) from None  # type: ignore[attr-defined]
            time.sleep(random.uniform(0, min(0.5, 0.02 * 2**attempt)))
    for store in (a, b):
        backend = store.backend
        forget = getattr(backend, "forget_tails", None)
        if forget is not None:
            forget()
    return report.done()


SYNC_RETRIES: Final = 12
"""How many times a sync runs before a deadlock, a serialisation failure or a lock
it waited too long for (PostgreSQL) is raised."""


# deadlock_detected, serialization_failure, lock_not_available (the lock timeout)
_RETRIED_STATES = ("40P01", "40001", "55P03")


def _sync_once(
    a: Store,
    b: Store,
    order: list[tuple[str, Store]],
    wanted: Scopes,
    report: Report,
    full: bool,
    dry_run: bool,
) -> None:
    """One attempt: both sides' write transactions, the whole sync, both commits."""
    try:
        with contextlib.ExitStack() as stack:
            sides: dict[str, Side] = {}
            for label, store in order:
                writing = (
                    store.backend.write(syncing=True)  # type: ignore[call-arg]
                    if store.backend.kind == "postgresql"
                    else store.backend.write()
                )
                tx = stack.enter_context(writing)
                sides[label] = Side(label, store, tx, ensure_tables(tx, store))
            for side, other in ((sides["a"], sides["b"]), (sides["b"], sides["a"])):
                if other.replica in {str(r[0]) for r in side.tx.all("sync_retired_all")}:
                    raise ReplicaRetired(
                        f"{side.store.path} retired the replica {other.replica} "
                        f"({other.store.path}) with forget_peer: deletions it never "
                        "received may be compacted, so its history could bring deleted "
                        "messages back. Replace that store with a fresh backup of a "
                        "current one"
                    )
            _run(sides["a"], sides["b"], [sides[label] for label, _ in order], wanted, report, full)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    except Exception as error:
        integrity = type(error).__name__ in (
            "IntegrityError",
            "UniqueViolation",
            "NotNullViolation",
        )
        if not integrity:  # sqlite3's or psycopg's
            raise
        # Both transactions rolled back: neither side changed.
        text = str(error)
        if "UNIQUE" in text or "duplicate key" in text:
            raise SyncIdConflict(
                f"cannot merge {a.path} and {b.path}: a message id names different messages "
                f"on the two sides ({error}); neither side changed"
            ) from None
        raise CorruptRow(
            f"cannot merge {a.path} and {b.path}: a row could not be written ({error}); "
            "neither side changed. Run 'flowdrop-local check' on both"
        ) from None


def _same_file(a: Store, b: Store) -> bool:
    if a.backend.kind != "sqlite" or b.backend.kind != "sqlite":
        return a.backend.kind == b.backend.kind == "postgresql" and a.path == b.path
    if ":memory:" in (a.path, b.path):
        return a is b
    with contextlib.suppress(OSError):
        return os.path.samefile(a.path, b.path)
    return False


def _run(a: Side, b: Side, order: list[Side], scopes: Scopes, report: Report, full: bool) -> None:
    """The stages of one sync, in order, on both sides' open transactions."""
    sides = (a, b)
    tombstones.learn_acknowledgements(a, b)
    for side in sides:  # what these scopes leave out, so "in sync" never hides it
        buffers, memory = left_out(side.tx, scopes)
        report.add(f"buffers_left_out_{side.label}", buffers)
        report.add(f"memory_left_out_{side.label}", memory)
    # 0. What to look at: with a mark of this pair on both sides, only buffers
    # written since on either side (a buffer whose summary is the one recorded at
    # the last sync is not read); else every buffer.
    marks = last_marks(a, b, scopes) if not full else None
    since = {s.label: stamp_before(marks[s.label], MARGIN) if marks else "" for s in sides}
    addresses: set[Address] = set()
    for side in sides:
        addresses |= changed_since(side, since[side.label], scopes)
    for address in sorted(addresses):  # one not known unchanged or grown is read whole
        for side in sides:
            view = side.view(address, full)
            if view.kind == "other":
                view.entries  # noqa: B018 (read now: the checks below use its rows)
    _refuse_one_id_in_two_buffers(a, b)
    # Conversations (title, metadata, existence) as they stand before anything moves.
    conversations = conversation_versions(a, b, addresses, scopes, since)
    # 1-2. Deletions: what was found deleted since becomes tombstones, tombstones
    # travel, each side deletes what the other deleted.
    tombstones.record_found(sides, addresses)
    touched = tombstones.exchange(a, b, scopes, full, report)
    # 2b. Conversations: the last change wins, a deletion included.
    gone_whole = sync_conversations(a, b, conversations, report)
    touched -= gone_whole
    # 3. Buffers that differ merge.
    addresses |= touched
    report.add("buffers_compared", len(addresses))
    merge_buffers(sides, order, addresses - gone_whole, touched, full, report)
    share_conflicts(a, b, scopes)
    # 4. Sessions (before their grants), viewer grants, memory: last writer wins.
    sync_id = str(uuid.uuid4())
    sync_all_registers(a, b, scopes, report, sync_id, unchanged_known=marks is not None)
    # 5. What each side now holds of the other's tombstones, and the peers it learns.
    tombstones.advance_marks(a, b, scopes)
    for side in sides:  # the quiet mark goes before the commit (SQLite keeps it)
        side.tx.run("sync_loud")
    report.add("buffers_read", a.buffers_read + b.buffers_read)
    report.add("rows_read", a.rows_read + b.rows_read)
    # 6. The marks of this pair: both now hold the same buffers (in these scopes).
    for side, other in ((a, b), (b, a)):
        kv = json.dumps({kind.name: kv_shape(side, kind) for kind in (VIEWERS, MEMORY)})
        side.tx.run("sync_mark_put", (other.replica, scopes.key, side.mark, sync_id, kv))
    # 7. Compaction of what every known peer has acknowledged.
    tombstones.compact(sides, report)


def _refuse_one_id_in_two_buffers(a: Side, b: Side) -> None:
    """SyncIdConflict if a message id the two sides read is in different buffers."""
    home: dict[str, dict[str, Address]] = {"a": {}, "b": {}}
    for side in (a, b):
        for address, view in side.views.items():
            if view.read:
                for e in view.entries:
                    home[side.label][e.id] = address
    for id_ in home["a"].keys() & home["b"].keys():
        if home["a"][id_] != home["b"][id_]:
            raise SyncIdConflict(
                f"message id {id_} is in buffer {'/'.join(home['a'][id_])} on {a.store.path} "
                f"and in buffer {'/'.join(home['b'][id_])} on {b.store.path}: an id names one "
                "message in a store; give one of them another id, then sync again"
            )

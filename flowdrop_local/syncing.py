"""Offline sync: two stores that diverged merge into one history (``sync(a, b)``).

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
import datetime
import hashlib
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple

import attrs

from ._sync_sql import SQLITE_DELETE_TRIGGERS, schema_steps
from .access import IDENTITY_SCOPES, resolve_address
from .backends.base import Tx
from .buffer import check_title, checked_json
from .engine import drive, heal, remove_message
from .errors import (
    InvalidAddress,
    InvalidArgument,
    ReplicaConflict,
    ReplicaRetired,
    SyncIdConflict,
    SyncRefused,
    shown,
)
from .portability import MAX_LINE_CHARS
from .positions import is_valid_key
from .rules.merge import Entry, Merged, Version, canonical, latest, merge, merge_session, stamp
from .rules.pairing import PLACEHOLDER_CONTENT, declared_call_ids, placeholder_metadata
from .store import Store

Address = tuple[str, str, str]

__all__ = [
    "SyncReport",
    "conflicts",
    "enable",
    "forget_peer",
    "new_replica",
    "peers",
    "replica_id",
    "sync",
]


@attrs.frozen
class SyncReport:
    """What one ``sync(a, b)`` moved. ``a``/``b`` name the stores as passed in.

    ``sent_a_to_b``: messages ``b`` received from ``a`` (and the other way);
    ``deleted_on_a``: messages removed from ``a`` (tombstones from ``b`` and the
    merge's drops); ``conflicts``: per rule (``MEM-1``, ``MEM-2``, ``edit``), the
    messages dropped and kept in ``flowdrop_sync_conflicts``; ``replaced``:
    placeholders a real result replaced (MEM-10); ``edited``: messages edited on one
    side only since the last sync, whose edit both now hold; ``healed``: placeholders made
    after the merge (MEM-3); ``rekeyed``: messages given a new position.
    ``buffers_compared``: buffers looked at (those written on either side since the
    two last synced, or every buffer at their first sync); ``buffers_read``: of those,
    the sides read whole (the others were known unchanged by their summary, or only
    appended to, and only their new rows were read); ``rows_read``: message rows read
    on both sides (what a sync's cost follows); ``buffers_merged``: buffers that
    differed.
    ``memory_a_to_b``: memory values ``b`` took from ``a``; ``memory_deleted_on_a``:
    keys deleted on ``a`` (a tombstone won); ``sessions_updated_on_a``: session rows
    written on ``a``; ``viewer_a_to_b``/``viewer_deleted_on_a``: grants copied and
    revoked. ``kv_skipped``: kinds of keyed values (memory values, viewer grants)
    known unchanged on both sides since their last sync, so not read (not in
    ``moved``). ``buffers_left_out_a``/``memory_left_out_a``: buffers and memory
    values on ``a`` outside the sync's scopes, not compared (``left_out``: all four).
    ``conversations_named_on_a``/``conversations_deleted_on_a``: conversations whose
    title or metadata ``a`` took from ``b``, and that ``a`` deleted because ``b``
    deleted them last.
    ``tombstones_refused``: tombstones naming a message the receiver holds in another
    buffer than they claim (a forged or corrupt peer), neither kept nor applied.
    ``tombstones_compacted_on_a``: tombstones every known peer of ``a`` has
    acknowledged, dropped (not counted in ``moved``: no message changes).
    """

    a: str
    b: str
    dry_run: bool
    buffers_compared: int = 0
    buffers_read: int = 0
    rows_read: int = 0
    buffers_merged: int = 0
    sent_a_to_b: int = 0
    sent_b_to_a: int = 0
    deleted_on_a: int = 0
    deleted_on_b: int = 0
    tombstones_a_to_b: int = 0
    tombstones_b_to_a: int = 0
    conflicts: dict[str, int] = attrs.field(factory=dict)
    replaced: int = 0
    edited: int = 0
    healed: int = 0
    rekeyed: int = 0
    memory_a_to_b: int = 0
    memory_b_to_a: int = 0
    memory_deleted_on_a: int = 0
    memory_deleted_on_b: int = 0
    sessions_updated_on_a: int = 0
    sessions_updated_on_b: int = 0
    viewer_a_to_b: int = 0
    viewer_b_to_a: int = 0
    viewer_deleted_on_a: int = 0
    viewer_deleted_on_b: int = 0
    tombstones_compacted_on_a: int = 0
    tombstones_compacted_on_b: int = 0
    kv_skipped: int = 0
    tombstones_refused: int = 0
    conversations_named_on_a: int = 0
    conversations_named_on_b: int = 0
    conversations_deleted_on_a: int = 0
    conversations_deleted_on_b: int = 0
    buffers_left_out_a: int = 0
    buffers_left_out_b: int = 0
    memory_left_out_a: int = 0
    memory_left_out_b: int = 0

    @property
    def left_out(self) -> int:
        """Buffers and memory values the sync's scopes did not cover, on both sides."""
        return (
            self.buffers_left_out_a
            + self.buffers_left_out_b
            + self.memory_left_out_a
            + self.memory_left_out_b
        )

    @property
    def moved(self) -> int:
        """Everything that changed either store (0: the stores were in sync)."""
        return (
            self.sent_a_to_b
            + self.sent_b_to_a
            + self.deleted_on_a
            + self.deleted_on_b
            + self.healed
            + self.replaced
            + self.edited
            + self.rekeyed
            + self.memory_a_to_b
            + self.memory_b_to_a
            + self.memory_deleted_on_a
            + self.memory_deleted_on_b
            + self.sessions_updated_on_a
            + self.sessions_updated_on_b
            + self.viewer_a_to_b
            + self.viewer_b_to_a
            + self.viewer_deleted_on_a
            + self.viewer_deleted_on_b
            + self.conversations_named_on_a
            + self.conversations_named_on_b
            + self.conversations_deleted_on_a
            + self.conversations_deleted_on_b
            + sum(self.conflicts.values())
        )

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``flowdrop-local sync --json``)."""
        return {**attrs.asdict(self), "moved": self.moved, "left_out": self.left_out}


# ------------------------------------------------------------------- scopes


class _Scopes:
    """Which buffer addresses a sync covers.

    Default (``None``): every scope that is not an identity scope: ``global``,
    ``workflow``, ``pipeline``, ``execution`` and every scope the application named
    itself (``store.buffer("chat", ...)``). ``user`` and ``session`` buffers move only
    when named: ``("user", "42")`` or ``"user:42"`` one identity, ``"user"`` every
    user's. An application's scope is named the same way (``"chat"``,
    ``"chat:ana"``). ``"all"``: every buffer, whatever its scope.
    """

    def __init__(self, scopes: Iterable[object] | None) -> None:
        self.named = scopes is not None
        self.all = False
        self.default = scopes is None
        self.whole: set[str] = set()
        self.ids: set[tuple[str, str]] = set()
        if scopes is None:
            return
        if isinstance(scopes, str | tuple):
            scopes = [scopes]
        for item in scopes:
            scope, scope_id = _parse_scope(item)
            if scope == "all":
                self.all = True
            elif scope_id is None:
                self.whole.add(scope)
            else:
                self.ids.add((scope, scope_id))

    @property
    def everything(self) -> bool:
        return self.all

    @property
    def key(self) -> str:
        """These scopes as text, the same for the same set ('all' for everything)."""
        if self.all:
            return "all"
        if self.default:
            return "default"
        return " ".join(sorted(self.whole) + sorted(f"{s}:{i}" for s, i in self.ids))

    def __contains__(self, address: Sequence[str]) -> bool:
        if self.all or (self.default and address[0] not in IDENTITY_SCOPES):
            return True
        return address[0] in self.whole or (address[0], address[1]) in self.ids


def _parse_scope(item: object) -> tuple[str, str | None]:
    if isinstance(item, str):
        scope, _, scope_id = item.partition(":")
        parsed: tuple[str, str | None] = (scope, scope_id if _ else None)
    elif (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], str)
    ):
        parsed = (item[0], item[1])
    else:
        raise InvalidArgument(
            f"a sync scope is 'SCOPE', 'SCOPE:ID' or (scope, id), not {shown(item)}"
        )
    if parsed[0] == "all":
        if parsed[1] is not None:
            raise InvalidArgument("'all' takes no id")
        return parsed
    try:  # an application's own scope is named as an address names it
        resolve_address(parsed[0], "x")
    except InvalidAddress as error:
        raise InvalidArgument(f"{error} (a sync scope, or 'all')") from None
    if parsed[1] is not None and parsed[1].strip() in ("", "0") and parsed[0] in IDENTITY_SCOPES:
        raise InvalidArgument(f"{parsed[0]}:{parsed[1]!r} names no identity")
    return parsed


def _left_out(tx: Tx, scopes: _Scopes) -> tuple[int, int]:
    """The buffers and memory values of one side that ``scopes`` leave out."""
    if scopes.all:
        return 0, 0
    buffers = sum(n for s, i, n in tx.all("sync_buffer_owners") if (s, i) not in scopes)
    memory = sum(n for s, i, n in tx.all("sync_memory_owners") if (s, i) not in scopes)
    return buffers, memory


# ------------------------------------------------------------------ replicas


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ensure_tables(tx: Tx, store: Store) -> str:
    """Take the steps of sync's schema the store has not taken (none once it is
    current: concurrent syncs on PostgreSQL would deadlock on DDL); return the
    replica id (made on first use)."""
    postgresql = store.backend.kind == "postgresql"
    steps = schema_steps(postgresql)

    def taken() -> int:
        if not tx.one("sync_schema_table")[0]:
            return 0
        row = tx.one("sync_schema_step")
        return 0 if row is None else int(row[0])

    if taken() < len(steps):
        if postgresql:  # one store takes them, the others wait for it, then find them taken
            tx.script(
                "SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.flowdrop_sync_ddl'))"
            )
        for step in range(taken(), len(steps)):
            for ddl in steps[step]:
                tx.script(ddl)
            tx.run("sync_schema_put", (step + 1,))
        if not postgresql:  # this connection's (the others' at their next write)
            for ddl in SQLITE_DELETE_TRIGGERS:
                tx.script(ddl)
    row = tx.one("sync_replica")
    if row is not None:
        return str(row[0])
    replica = str(uuid.uuid4())
    tx.run("sync_replica_put", (replica, _now()))
    return replica


def replica_id(store: Store) -> str | None:
    """The store's replica id, or None before its first sync."""
    with store.backend.read() as tx:
        if not tx.one("sync_tables")[0]:
            return None
        row = tx.one("sync_replica")
        return None if row is None else str(row[0])


def new_replica(store: Store) -> str:
    """Give ``store`` a new replica id: the fix for a file copied by hand
    (:class:`ReplicaConflict`). Its sync state is kept. Returns the new id."""
    with store.backend.write() as tx:
        _ensure_tables(tx, store)
        tx.run("sync_replica_drop")
        return _ensure_tables(tx, store)


def peers(store: Store) -> list[str]:
    """The replica ids ``store`` knows as peers (synced with, backed up to, or learnt
    from a peer): a message tombstone is compacted once every one of them has it."""
    with store.backend.read() as tx:
        if not tx.one("sync_tables")[0]:
            return []
        return sorted(str(row[0]) for row in tx.all("sync_peers_all"))


def forget_peer(store: Store, replica: str) -> bool:
    """Stop waiting for ``replica`` (a device retired for good) before compacting
    tombstones, and refuse to sync with it from now on (:class:`ReplicaRetired`):
    what it holds could bring back deletions compacted since. The retirement is
    this store's alone: a peer never adopts it (a forged list could cut honest
    replicas apart), so call it on every store that should stop waiting; this store
    never learns the retired replica back from a peer. False if ``store`` did not
    know it as a peer."""
    with store.backend.write() as tx:
        if not tx.one("sync_tables")[0]:
            return False
        _ensure_tables(tx, store)
        return _retire(tx, replica)


def _retire(tx: Tx, replica: str) -> bool:
    tx.run("sync_retire", (replica,))
    tx.run("sync_ack_forget", (replica,))
    return tx.run("sync_peer_forget", (replica,)) > 0


def enable(store: Store) -> str:
    """Start tracking deletions now: record what every buffer holds, every memory key
    and every viewer grant (a sync does this too). A message deleted before a store's
    first sync or ``enable`` is not known as deleted; so enable a store before copying
    it (``backup``) for another device. Returns the replica id."""
    with store.backend.write() as tx:
        replica = _ensure_tables(tx, store)
        everything = _Scopes(["all"])
        known = {(r[0], r[1], r[2]) for r in tx.all("sync_state_all")}
        summaries = {(r[0], r[1], r[2]): _summary(r) for r in tx.all("sync_candidates", ("",))}
        for address, buffer in _scan(tx, everything).items():
            if address not in known:
                row = (*address, buffer.digest, _held(buffer.rows), summaries[address])
                tx.run("sync_state_put", row)
        for kind in (_MEMORY, _VIEWERS):
            for key in kind.read(tx, everything):
                tx.run("sync_kv_state_put", (kind.name, *key))
        for row in tx.all("export_session"):
            tx.run("sync_kv_state_forget", ("session", row[0]))
            tx.run("sync_kv_state_put", ("session", row[0], json.dumps(list(row)), ""))
        return replica


def conflicts(store: Store) -> list[dict[str, Any]]:
    """What syncs dropped that was not a duplicate, oldest first (each with its message)."""
    with store.backend.read() as tx:
        if not tx.one("sync_tables")[0]:
            return []
        names = ("dropped_id", "rule", "scope", "scope_id", "key", "call_id", "kept_id")
        return [
            {
                **dict(zip(names, row[:7], strict=True)),
                "message": json.loads(row[7]),
                "recorded_at": row[8],
            }
            for row in tx.all("sync_conflicts")
        ]


# ------------------------------------------------------------------- digests


def _digest(rows: Iterable[tuple[str, str, str]], start: str = "") -> str:
    """A buffer's digest: a chain over its ids, positions and content fingerprints,
    in order, so the digest of a buffer grown at the end follows from the digest
    of what it held before and the new rows alone."""
    digest = start
    for id_, position, fingerprint in rows:
        line = f"{digest} {id_} {position} {fingerprint}"
        digest = hashlib.md5(line.encode(), usedforsecurity=False).hexdigest()
    return digest


class _Buffer:
    """A buffer as the scan saw it: its rows (id, position, fingerprint)."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    @property
    def ids(self) -> list[str]:
        return [row[0] for row in self.rows]

    @property
    def digest(self) -> str:
        return _digest(self.rows)


def _scan(tx: Tx, scopes: _Scopes) -> dict[Address, _Buffer]:
    found: dict[Address, _Buffer] = {}
    for scope, scope_id, key, id_, position, fingerprint in tx.all("sync_scan"):
        address = (scope, scope_id, key)
        if address in scopes:
            found.setdefault(address, _Buffer()).rows.append((id_, position, fingerprint))
    return found


def _whole_digest(store: Store) -> str:
    """Everything a sync moves, as one digest: every buffer's messages, and the
    memory values, sessions, grants and conversation names (two copies of one
    replica that differ in any of them are not one store)."""
    with store.backend.read() as tx:
        scanned = _scan(tx, _Scopes(["all"]))
        rest = [
            (kind, json.dumps([str(v) for v in row], ensure_ascii=False), "")
            for kind in ("memory", "session", "viewer", "conversation")
            for row in tx.all(f"export_{kind}")
        ]
    return _digest([*((f"{a}", b.digest, "") for a, b in sorted(scanned.items())), *rest])


# ---------------------------------------------------------------------- sides


class _View:
    """One buffer on one side, as this sync sees it.

    ``summary``: the buffer's row id, ``updated_at`` and last row (position, tally,
    id), or None when the buffer is absent. Every library write changes it (an append
    the last row; a delete or an edit in place a strictly later ``updated_at``), and
    every change that is not an append at the end also blanks the summary recorded
    with the buffer's state at the last sync (``engine.edited``). So, against that
    recorded state, a buffer is ``unchanged`` (same summary: the recorded digest is
    its digest, nothing is read), ``grown`` (only appended to at the end since:
    only the new rows need reading), or ``other`` (read whole; also with ``full``).
    """

    __slots__ = (
        "_entries",
        "_grown",
        "_held",
        "address",
        "buffer_id",
        "full",
        "side",
        "state",
        "summary",
    )

    def __init__(self, side: _Side, address: Address, full: bool) -> None:
        self.side, self.address, self.full = side, address, full
        self._held: str | None = None
        self._entries: list[Entry] | None = None
        self._grown: bool | None = None
        found = side.tx.one("sync_summary_one", address)
        if found is not None:  # lock it (PostgreSQL), then read it again: no append
            side.tx.one("lock_buffer", (found[3],))  # can slip in before the commit
            found = side.tx.one("sync_summary_one", address)
        row = side.tx.one("sync_state_one", address)
        # (digest, summary) recorded at the last sync; what it held is read if needed
        self.state: tuple[str, str] | None = None if row is None else (str(row[0]), str(row[1]))
        self.buffer_id: int | None = None if found is None else int(found[3])
        self.summary = None if found is None else _summary(found)

    @property
    def kind(self) -> str:
        """``absent``, ``unchanged``, ``grown`` or ``other`` (see the class)."""
        if self.buffer_id is None:
            return "absent"
        if self.full or self.state is None or not self.state[1]:
            return "other"
        if self.state[1] == self.summary:
            return "unchanged"
        if self._grown is None:  # the recorded last row still stands where it stood
            buffer_id, _, last, _, last_id = self.state[1].split("|")[:5]
            found = self.side.tx.one("sync_row_at", (self.buffer_id, last)) if last else None
            self._grown = buffer_id == str(self.buffer_id) and (
                not last or (found is not None and str(found[0]).lower() == last_id.lower())
            )
        return "grown" if self._grown else "other"

    @property
    def entries(self) -> list[Entry]:
        """Every message of the buffer, read once (and counted in ``buffers_read``)."""
        if self._entries is None:
            self._entries = [] if self.buffer_id is None else self.side.entries(self.buffer_id)
            self.side.buffers_read += 1
        return self._entries

    @property
    def read(self) -> bool:
        return self._entries is not None

    @property
    def rows(self) -> list[tuple[str, str, str]]:
        return [(e.id, e.position, e.fingerprint) for e in self.entries]

    @property
    def digest(self) -> str | None:
        if self.buffer_id is None:
            return None
        if self.kind == "unchanged":
            assert self.state is not None
            return self.state[0]
        return _digest(self.rows)

    def held_text(self) -> str:
        """The recorded ids (and fingerprint prefixes) of the last sync ('' if none)."""
        if self._held is None:
            row = self.side.tx.one("sync_state_held", self.address) if self.state else None
            self._held = "" if row is None else str(row[0])
        return self._held

    def held(self) -> dict[str, str]:
        """What the buffer held at the last sync: id -> fingerprint prefix ({} if none)."""
        return _parse_held(self.held_text())


def _held(rows: Iterable[tuple[str, str, str]]) -> str:
    """What a buffer held, as its state keeps it: each message's id and a prefix of
    its fingerprint (for the next sync's deletions, and its one-sided edits)."""
    return " ".join(f"{id_}:{fingerprint[:12]}" for id_, _, fingerprint in rows)


def _parse_held(text: str) -> dict[str, str]:
    held = {}
    for token in text.split():
        id_, _, fingerprint = token.partition(":")
        held[id_] = fingerprint
    return held


def _summary(row: Sequence[Any]) -> str:
    """A buffer's summary from a ``sync_candidates`` row (see :class:`_View`)."""
    return f"{row[3]}|{row[4]}|{row[5] or ''}|{row[6] or 0}|{row[7] or ''}"


class _Side:
    """One store inside the sync's transaction."""

    def __init__(self, label: str, store: Store, tx: Tx, replica: str) -> None:
        self.label = label
        self.store = store
        self.tx = tx
        self.replica = replica
        # Deletions made meanwhile are numbered after this sync (PostgreSQL: the
        # lock the deletion triggers take); this sync's own are not recorded by them.
        tx.one("sync_seq_lock")
        # What a sync reads of memory, sessions and grants it may overwrite: no write
        # may commit between its read and its write (PostgreSQL: they wait for it).
        tx.run("sync_lock_registers")
        # From here a wait is short or a deadlock in the making (a delete holding a
        # buffer this sync reads, waiting for the change numbers it holds): PostgreSQL
        # gives up on it soon, and the sync runs again (SYNC_RETRIES).
        tx.run("sync_lock_timeout")
        tx.run("sync_quiet")
        self.seq: int = tx.one("sync_last_seq")[0]
        self.first_seq = self.seq  # at the start of this sync
        self.now = str(tx.one("sync_now")[0])  # this store's clock (its stamps' bound)
        self.mark = str(tx.one("sync_mark_clock")[0])  # its newest buffer stamp
        self.views: dict[Address, _View] = {}
        self.kv_then: dict[str, str] = {}  # the kv of the pair's matching mark
        self.buffers_read = 0
        self.rows_read = 0

    def view(self, address: Address, full: bool) -> _View:
        if address not in self.views:
            self.views[address] = _View(self, address, full)
        return self.views[address]

    def rows_for(self, statement: str, ids: Iterable[str]) -> Iterator[Any]:
        """The rows a statement taking a list of message ids gives, 500 ids a time."""
        wanted = list(dict.fromkeys(ids))
        for start in range(0, len(wanted), 500):
            yield from self.tx.all(statement, (wanted[start : start + 500],))

    def where(self, ids: Iterable[str]) -> dict[str, Address]:
        """The buffer each of these message ids is in (absent ids are left out)."""
        return {
            str(row[0]).lower(): (str(row[1]), str(row[2]), str(row[3]))
            for row in self.rows_for("sync_where", ids)
        }

    def versions(self, ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        """The recorded (fingerprint, generation) of these messages' versions."""
        return {
            str(row[0]): (str(row[1]), int(row[2]))
            for row in self.rows_for("sync_versions_of", ids)
        }

    def moves(self, entries: Sequence[Entry]) -> dict[str, int]:
        """How many times syncs moved each of these messages to where it stands here
        (only those above 0; a row for another position is an older move's)."""
        stands = {e.id: e.position for e in entries}
        return {
            str(row[0]): int(row[2])
            for row in self.rows_for("sync_moves_of", stands)
            if stands.get(str(row[0])) == str(row[1]) and int(row[2])
        }

    def tombstoned(self, ids: Iterable[str]) -> set[str]:
        """Which of these message ids this store holds a tombstone for."""
        return {str(row[0]) for row in self.rows_for("sync_tombstones_held", ids)}

    def tombstone(self, rows: Sequence[tuple[str, Address]]) -> None:
        """Record deleted message ids with this side's next sequence numbers."""
        now = _now()
        params = []
        for id_, address in rows:
            self.seq += 1
            params.append((id_, *address, self.seq, now))
        if params:
            self.tx.many("sync_tombstone_put", params)

    def entries(self, buffer_id: int) -> list[Entry]:
        found = [self._checked(Entry(*row)) for row in self.tx.all("sync_light", (buffer_id,))]
        self.rows_read += len(found)
        return found

    def entries_from(self, buffer_id: int, start: str) -> list[Entry]:
        """The buffer's messages at and after position ``start`` ('': all)."""
        if not start:
            return self.entries(buffer_id)
        rows = self.tx.all("sync_light_from", (buffer_id, start))
        found = [self._checked(Entry(*row)) for row in rows]
        self.rows_read += len(found)
        return found

    def contents(self, ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        found = {str(row[0]): (row[1], row[2]) for row in self.rows_for("sync_contents", ids)}
        for id_, (content, _) in found.items():
            if len(content) > MAX_MESSAGE_CHARS:
                raise SyncRefused(
                    self.store.path, id_, f"is longer than {MAX_MESSAGE_CHARS:,} characters"
                )
        return found

    def _checked(self, entry: Entry) -> Entry:
        """An entry as read from this side, refused unless an import would take it."""
        problem = _row_problem(entry)
        if problem is not None:
            raise SyncRefused(self.store.path, entry.id, problem)
        return entry


# What a sync takes from a side, as an import would (a peer is untrusted input):
MAX_SYNC_POSITION: Final = 255
"""The longest position key a sync takes (a longer one makes every key after it as
long; the library's own keys stay under 10 characters in any ordinary history)."""
MAX_MESSAGE_CHARS: Final = MAX_LINE_CHARS
"""The largest content a sync takes: an import's longest line."""


def _row_problem(entry: Entry) -> str | None:
    """Why a row may not travel (None: it may): its key, its size, its healed mark."""
    if not is_valid_key(entry.position):
        return f"has the malformed position key {entry.position[:40]!r}"
    if len(entry.position) > MAX_SYNC_POSITION:
        return (
            f"has a position key of {len(entry.position):,} characters "
            f"(at most {MAX_SYNC_POSITION})"
        )
    if len(entry.metadata) > MAX_MESSAGE_CHARS:
        return f"has metadata longer than {MAX_MESSAGE_CHARS:,} characters"
    if entry.role == "tool" or "healed" in entry.metadata:  # (JSON may escape the key)
        metadata = json.loads(entry.metadata)
        if metadata.get("healed") is True:
            call_id = metadata.get("tool_call_id")
            if (
                entry.role != "tool"
                or not isinstance(call_id, str)
                or metadata != placeholder_metadata(call_id)
            ):
                return "is marked healed but is no placeholder"
    return None


def _placeholder_problem(entry: Entry, content: str) -> str | None:
    """A healed mark on a row whose content is not the placeholder's."""
    if (
        entry.role == "tool"
        and content != PLACEHOLDER_CONTENT
        and json.loads(entry.metadata).get("healed") is True
    ):
        return "is marked healed but is no placeholder"
    return None


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
        a, b: the stores (any backends).
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
    wanted = _Scopes(scopes if not isinstance(scopes, str) else [scopes])
    for store in (a, b):
        if not isinstance(store, Store):
            raise InvalidArgument(f"sync takes two Store objects, not {type(store).__name__}")
        store.backend.ensure_open()
    report = _Report(a.path, b.path, dry_run)
    ids = {label: replica_id(store) for label, store in (("a", a), ("b", b))}
    same_file = _same_file(a, b)
    if same_file or (ids["a"] is not None and ids["a"] == ids["b"]):
        if same_file or _whole_digest(a) == _whole_digest(b):
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
            report = _Report(a.path, b.path, dry_run)
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
    wanted: _Scopes,
    report: _Report,
    full: bool,
    dry_run: bool,
) -> None:
    """One attempt: both sides' write transactions, the whole sync, both commits."""
    try:
        with contextlib.ExitStack() as stack:
            sides: dict[str, _Side] = {}
            for label, store in order:
                writing = (
                    store.backend.write(syncing=True)  # type: ignore[call-arg]
                    if store.backend.kind == "postgresql"
                    else store.backend.write()
                )
                tx = stack.enter_context(writing)
                sides[label] = _Side(label, store, tx, _ensure_tables(tx, store))
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
        if type(error).__name__ != "IntegrityError":  # sqlite3's or psycopg's
            raise
        # Both transactions rolled back: neither side changed.
        raise SyncIdConflict(
            f"cannot merge {a.path} and {b.path}: a message id names different messages "
            f"on the two sides ({error}); neither side changed"
        ) from None


def _same_file(a: Store, b: Store) -> bool:
    if a.backend.kind != "sqlite" or b.backend.kind != "sqlite":
        return a.backend.kind == b.backend.kind == "postgresql" and a.path == b.path
    if ":memory:" in (a.path, b.path):
        return a is b
    with contextlib.suppress(OSError):
        return os.path.samefile(a.path, b.path)
    return False


class _Report:
    """The counts as a sync makes them, labelled by side."""

    def __init__(self, a: str, b: str, dry_run: bool) -> None:
        self.fields: dict[str, Any] = {"a": a, "b": b, "dry_run": dry_run, "conflicts": {}}

    def add(self, name: str, n: int) -> None:
        self.fields[name] = self.fields.get(name, 0) + n

    def conflict(self, rule: str) -> None:
        self.fields["conflicts"][rule] = self.fields["conflicts"].get(rule, 0) + 1

    def done(self) -> SyncReport:
        return SyncReport(**self.fields)


# A buffer changed since the last sync of a pair has ``updated_at`` at or after the
# mark (the newest buffer stamp when that sync began) less this: every stamp comes
# from the store's clock, which never goes back (_sync_sql.SQLITE_STORE_CLOCK), and
# an append writes ``updated_at`` when it is a minute behind that clock
# (engine.UPDATED_AT_GRANULARITY). The margin is that minute and one more; it costs
# a summary read per buffer written in it, no more. The wall clock plays no part.
MARGIN = datetime.timedelta(minutes=2)


def _before(moment: str, margin: datetime.timedelta) -> str:
    if not moment:  # no stamp at all (a store without buffers): from the beginning
        return ""
    when = datetime.datetime.fromisoformat(moment.replace("Z", "+00:00")) - margin
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _changed(side: _Side, since: str, scopes: _Scopes) -> set[Address]:
    """Addresses that may have changed on ``side`` since ``since`` ('': every buffer):
    buffers written since (the ``buffers_recent`` index) and buffers deleted whole."""
    found = {(str(r[0]), str(r[1]), str(r[2])) for r in side.tx.all("sync_candidates", (since,))}
    found |= {(str(r[0]), str(r[1]), str(r[2])) for r in side.tx.all("sync_state_gone")}
    return {address for address in found if address in scopes}


def _last_marks(a: _Side, b: _Side, scopes: _Scopes) -> dict[str, str] | None:
    """Each side's clock at the start of the pair's last completed sync over these
    scopes (or everything), or None: both sides must name the same sync (a sync
    killed between its two commits left a mark on one side only). Each side's
    ``kv`` of that mark goes to :attr:`_Side.kv_then`."""
    found = {}
    for side, other in ((a, b), (b, a)):
        rows = side.tx.all("sync_marks", (other.replica, scopes.key))
        found[side.label] = {str(r[0]): (str(r[1]), str(r[2]), str(r[3])) for r in rows}
    shared = [
        key
        for key in found["a"].keys() & found["b"].keys()
        if found["a"][key][1] == found["b"][key][1]
    ]
    if not shared:
        return None
    key = max(shared, key=lambda k: found["a"][k][0])
    for side in (a, b):
        side.kv_then = json.loads(found[side.label][key][2] or "{}")
    return {label: found[label][key][0] for label in ("a", "b")}


def _run(
    a: _Side, b: _Side, order: list[_Side], scopes: _Scopes, report: _Report, full: bool
) -> None:
    sides = (a, b)
    # What each side knows the other holds of its tombstones is what the other
    # committed (its high-water mark of this side, read now, inside its transaction),
    # never what a sync sent: a sync whose other half was lost acknowledged nothing.
    for source, target in ((a, b), (b, a)):
        row = target.tx.one("sync_peer", (source.replica,))
        if row is not None:  # a peer cannot have received a number never given
            acked = min(max(0, int(row[0])), source.first_seq)
            source.tx.run("sync_ack_put", (target.replica, acked))
    for side in sides:  # what these scopes leave out, so "in sync" never hides it
        buffers, memory = _left_out(side.tx, scopes)
        report.add(f"buffers_left_out_{side.label}", buffers)
        report.add(f"memory_left_out_{side.label}", memory)
    # 0. What to look at. With a mark on both sides (the time each store finished
    # its last sync with the other over these scopes), only buffers written since on
    # either side; else every buffer. A buffer whose summary is the one recorded at
    # the last sync is not read (its digest is the recorded one).
    marks = _last_marks(a, b, scopes) if not full else None
    since = {s.label: _before(marks[s.label], MARGIN) if marks else "" for s in sides}
    addresses: set[Address] = set()
    for side in sides:
        addresses |= _changed(side, since[side.label], scopes)
    # A buffer not known unchanged or grown only at the end is read whole.
    for address in sorted(addresses):
        for side in sides:
            view = side.view(address, full)
            if view.kind == "other":
                view.entries  # noqa: B018 (read now: the checks below use its rows)
    home: dict[str, dict[str, Address]] = {"a": {}, "b": {}}
    for side in sides:
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
    # Conversations (title, metadata, existence) as they stand before anything moves.
    conversations = _conversation_versions(a, b, addresses, scopes, since)
    # 1. What each side deleted since its last sync becomes its tombstones (a buffer
    # unchanged or only appended to since has lost nothing).
    for side in sides:
        gone: list[tuple[str, Address]] = []
        for address in sorted(addresses):
            view = side.views[address]
            if view.state is None or view.kind in ("unchanged", "grown"):
                continue
            present = {e.id for e in view.entries}
            gone += [(id_, address) for id_ in view.held() if id_ not in present]
        # (the library recorded its own deletions when they happened: these are
        # a writer's behind it)
        dead = side.tombstoned([id_ for id_, _ in gone])
        side.tombstone([item for item in gone if item[0] not in dead])
    # 2. Tombstones travel; each side deletes what the other deleted.
    touched: set[Address] = set()
    for source, target in ((a, b), (b, a)):
        mark_row = target.tx.one("sync_peer", (source.replica,))
        mark = 0 if mark_row is None else int(mark_row[0])
        rows = source.tx.all("sync_tombstones_after", (mark,))
        arriving = [(str(r[0]), (r[1], r[2], r[3])) for r in rows if (r[1], r[2], r[3]) in scopes]
        known = target.tombstoned([id_ for id_, _ in arriving])  # sent again, or relayed
        arriving = [item for item in arriving if item[0] not in known]
        # A tombstone is judged by the receiver's own row: one naming a message the
        # receiver holds in another buffer than it claims is refused (a peer could
        # otherwise delete, then relay the deletion of, a message outside the scopes
        # it syncs), and not kept.
        held = target.where([id_ for id_, _ in arriving])
        refused = [item for item in arriving if held.get(item[0].lower(), item[1]) != item[1]]
        arriving = [item for item in arriving if item not in refused]
        report.add("tombstones_refused", len(refused))
        target.tombstone(arriving)
        report.add(f"tombstones_{source.label}_to_{target.label}", len(arriving))
        for id_, _ in arriving:
            address_of = held.get(id_.lower())
            if address_of is not None and address_of in scopes:
                source.view(address_of, full)  # as it was before the deletion
                target.view(address_of, full)
                if drive(remove_message(id_, heal_now=False), target.tx):
                    touched.add(address_of)
                    report.add(f"deleted_on_{target.label}", 1)
    # 2b. Conversations: the last change wins, a deletion included (its buffer goes
    # on the other side, with tombstones for what it held there).
    gone_whole = _sync_conversations(a, b, conversations, report)
    touched -= gone_whole
    # 3. Buffers that differ merge: only their new rows when both sides only grew at
    # the end since they last held the same (equal recorded digests), else whole.
    addresses |= touched
    report.add("buffers_compared", len(addresses))
    for address in sorted(addresses - gone_whole):
        views = {side.label: side.view(address, full) for side in sides}
        kinds = {views[label].kind for label in views}
        recorded = {view.state[0] if view.state else None for view in views.values()}
        state: tuple[str, str, bool] | None = None
        if address in touched:
            pass
        elif kinds <= {"unchanged", "grown"} and len(recorded) == 1:
            if kinds == {"unchanged"}:
                continue
            state = _merge_buffer(address, order[0], order[1], report, grown=True)
        elif views["a"].digest == views["b"].digest:
            read = [side for side in sides if views[side.label].read]
            found = {
                s.label: _generations(s, views[s.label].entries, views[s.label].held())
                for s in read
            }
            if read:  # both hold the same versions: their generations, on both
                _keep_generations(sides, views[read[0].label].entries, found)
            for side in read:  # its recorded state may be out of date
                view = views[side.label]
                _keep_state(side, address, _digest(view.rows), _held(view.rows), view)
            continue
        stale = address in touched
        while state is None:  # None: it dropped messages the other side deleted: again
            state = _merge_buffer(address, order[0], order[1], report, grown=False, stale=stale)
            stale = True
        report.add("buffers_merged", int(state[2]))
        for side in sides:
            _keep_state(side, address, state[0], state[1], views[side.label])
    # 4. Sessions (before their grants), viewer grants, memory: last writer wins.
    _sync_sessions(a, b, scopes, report)
    sync_id = str(uuid.uuid4())
    for kind in (_VIEWERS, _MEMORY):
        if marks is not None and all(_kv_unchanged(side, kind) for side in sides):
            report.add("kv_skipped", 1)
            continue
        _sync_registers(a, b, kind, scopes, report)
        for side in sides:
            side.tx.run("sync_kv_clock_put", (kind.name, sync_id))
    # 5. The high-water marks: each side now holds every tombstone the other has
    # (those it sent, received and made in the merges). A scoped sync moves no mark:
    # the tombstones it skipped must still come later.
    # The mark is the source's number at the start of this sync, not its last: were
    # this sync killed between its two commits, the side that did not commit gives
    # its numbers after that again, to other tombstones (sent again next time, the
    # ones this sync numbered are skipped as known).
    for source, target in ((a, b), (b, a)):
        row = target.tx.one("sync_peer", (source.replica,))
        mark = source.first_seq if scopes.everything else (0 if row is None else int(row[0]))
        target.tx.run("sync_peer_put", (source.replica, mark, _now()))
    # Each learns the other's peers (a backup of a backup, say): a tombstone is
    # compacted only when every replica either knows of has received it.
    if scopes.everything:
        # A peer's retirements are its own: a store retires a replica only by its
        # own forget_peer (a forged list would cut honest replicas apart), and
        # never adopts a peer it retired.
        now = _now()
        for side, other in ((a, b), (b, a)):
            retired = {str(r[0]) for r in side.tx.all("sync_retired_all")}
            for (peer,) in other.tx.all("sync_peers_all"):
                if peer != side.replica and str(peer) not in retired:
                    side.tx.run("sync_peer_adopt", (peer, now, peer))
    for side in sides:  # the quiet mark goes before the commit (SQLite keeps it)
        side.tx.run("sync_loud")
    report.add("buffers_read", a.buffers_read + b.buffers_read)
    report.add("rows_read", a.rows_read + b.rows_read)
    # 6. The marks of this pair: both now hold the same buffers (in these scopes).
    for side, other in ((a, b), (b, a)):
        kv = json.dumps({kind.name: _kv_shape(side, kind) for kind in (_VIEWERS, _MEMORY)})
        side.tx.run("sync_mark_put", (other.replica, scopes.key, side.mark, sync_id, kv))
    # 7. Compaction: a tombstone every peer this store has synced with has received
    # is needed by none of them (each deleted the message and holds its own tombstone).
    for side in sides:
        floor = side.tx.one("sync_compact_floor")[0]
        if floor:
            compacted = side.tx.run("sync_compact", (floor,))
            report.add(f"tombstones_compacted_on_{side.label}", compacted)


Key = tuple[str, str, str]


@attrs.frozen
class _Kind:
    """A keyed value that syncs by last writer wins, with deletions as tombstones."""

    name: str  # the report's prefix and the kv tables' kind
    read: Callable[[Tx, _Scopes], dict[Key, tuple[Version, tuple[Any, ...]]]]
    put: Callable[[Tx, tuple[Any, ...]], None]
    drop: Callable[[Tx, Key], object]
    stamp_at: int  # where a row (as read gives it) holds its last-writer-wins stamp


# A last-writer-wins stamp later than the earlier of the two stores' clocks plus
# this counts as exactly that (and is written so, on both sides): a device whose
# clock runs ahead, or a file stamped in the year 9999, wins no value for longer.
CLOCK_BOUND = datetime.timedelta(minutes=5)


def _ceiling(a: _Side, b: _Side) -> str:
    """The latest stamp this sync takes as it is (see :data:`CLOCK_BOUND`)."""
    return stamp(_before(min(a.now, b.now, key=stamp), -CLOCK_BOUND))


def _clamp_row(row: tuple[Any, ...], at: int, ceiling: str) -> tuple[tuple[Any, ...], bool]:
    """``row`` with its stamp at ``at`` no later than ``ceiling``; whether it changed."""
    if stamp(str(row[at])) <= ceiling:
        return row, False
    return (*row[:at], ceiling, *row[at + 1 :]), True


def _read_memory(tx: Tx, scopes: _Scopes) -> dict[Key, tuple[Version, tuple[Any, ...]]]:
    found = {}
    for row in tx.all("export_memory"):
        key = (str(row[0]), str(row[1]), str(row[2]))
        if key in scopes:
            # The value, then created_at: equal versions read the same on both sides.
            text = f"{canonical(str(row[3]))}\x1f{stamp(str(row[4]))}"
            found[key] = (Version(stamp(str(row[5])), False, text), tuple(row))
    return found


def _put_memory(tx: Tx, row: tuple[Any, ...]) -> None:
    tx.run("memory_remove", row[:3])
    tx.run("import_memory", row)


def _read_viewers(tx: Tx, scopes: _Scopes) -> dict[Key, tuple[Version, tuple[Any, ...]]]:
    found = {}
    for session_id, user_id, granted_at in tx.all("export_viewer"):
        if ("session", session_id) in scopes:
            row = (str(session_id), str(user_id), str(granted_at))
            found[(row[0], row[1], "")] = (Version(stamp(row[2]), False, ""), row)
    return found


def _put_viewer(tx: Tx, row: tuple[Any, ...]) -> None:
    tx.run("viewer_remove", row[:2])
    tx.run("import_viewer", row)


_MEMORY = _Kind("memory", _read_memory, _put_memory, lambda tx, k: tx.run("memory_remove", k), 5)
_VIEWERS = _Kind(
    "viewer", _read_viewers, _put_viewer, lambda tx, k: tx.run("viewer_remove", k[:2]), 2
)


def _kv_shape(side: _Side, kind: _Kind) -> str:
    """The last sync that wrote this kind here, and a digest of every key and stamp
    (as the pair's mark keeps it): a set, grant, delete, revoke or import changes it
    (an update stamps strictly later than the value it replaces), whatever the wall
    clock did."""
    clock = {str(r[0]): str(r[1]) for r in side.tx.all("sync_kv_clock")}
    stamps = sorted(tuple(map(str, row)) for row in side.tx.all(f"sync_kv_stamps_{kind.name}"))
    digest = hashlib.sha256(json.dumps(stamps).encode()).hexdigest()[:32]
    return f"{clock.get(kind.name, '')}|{len(stamps)}|{digest}"


def _kv_unchanged(side: _Side, kind: _Kind) -> bool:
    """Nothing of this kind changed here since the pair's last sync: its shape is
    the one recorded then. Then it is what both held at that sync, not read again."""
    return side.kv_then.get(kind.name) == _kv_shape(side, kind)


def _sync_registers(a: _Side, b: _Side, kind: _Kind, scopes: _Scopes, report: _Report) -> None:
    """Memory values or viewer grants: a key that was there at the last sync and is
    gone becomes a tombstone stamped now (sync finds deletions, it is not told of
    them); then per key the :func:`~flowdrop_local.rules.merge.latest` version of the
    two sides goes to both."""
    ceiling = _ceiling(a, b)
    rows: dict[str, dict[Key, tuple[Version, tuple[Any, ...]]]] = {}
    tombs: dict[str, dict[Key, Version]] = {}
    rewrite: dict[str, set[Key]] = {"a": set(), "b": set()}  # stamps clamped here
    for side in (a, b):
        found = {}
        for key, (version, row) in kind.read(side.tx, scopes).items():
            row, clamped = _clamp_row(row, kind.stamp_at, ceiling)
            if clamped:
                version = version._replace(stamp=ceiling)
                rewrite[side.label].add(key)
            found[key] = (version, row)
        dead = {}
        for r in side.tx.all("sync_kv_tombstones", (kind.name,)):
            key = (str(r[0]), str(r[1]), str(r[2]))
            dead[key] = Version(min(stamp(str(r[3])), ceiling), True, "")
            if stamp(str(r[3])) > ceiling:
                rewrite[side.label].add(key)
        # A deletion found now happened after every stamp a sync wrote here before
        # (the side's hybrid clock): it beats what it deleted, whatever clocks said.
        clock = side.tx.one("sync_hlc", (kind.name,))
        now = min(max(stamp(_now()), _tick(str(clock[0])) if clock else ""), ceiling)
        for r in side.tx.all("sync_kv_state", (kind.name,)):
            key = (str(r[0]), str(r[1]), str(r[2]))
            if key not in found and _in_scope(kind, key, scopes):  # deleted here since
                dead[key] = Version(now, True, "")
                side.tx.run("sync_kv_tombstone_put", (kind.name, *key, now))
        rows[side.label], tombs[side.label] = found, dead
    keys = sorted(set(rows["a"]) | set(rows["b"]) | set(tombs["a"]) | set(tombs["b"]))
    written = ""
    for key in keys:
        if not _in_scope(kind, key, scopes):
            continue
        held = {
            side.label: latest(rows[side.label].get(key, (None,))[0], tombs[side.label].get(key))
            for side in (a, b)
        }
        winner = latest(*held.values())
        assert winner is not None
        written = max(written, winner.stamp)
        for side, other in ((a, b), (b, a)):
            tx = side.tx
            if winner.deleted:
                if key in rows[side.label]:
                    kind.drop(tx, key)
                    report.add(f"{kind.name}_deleted_on_{side.label}", 1)
                if tombs[side.label].get(key) != winner or key in rewrite[side.label]:
                    tx.run("sync_kv_tombstone_put", (kind.name, *key, winner.stamp))
                tx.run("sync_kv_state_drop", (kind.name, *key))
                continue
            if held[side.label] != winner:
                kind.put(tx, rows[other.label][key][1])
                report.add(f"{kind.name}_{other.label}_to_{side.label}", 1)
            elif key in rewrite[side.label]:  # its own value, with the stamp clamped
                kind.put(tx, rows[side.label][key][1])
            if key in tombs[side.label]:
                tx.run("sync_kv_tombstone_drop", (kind.name, *key))
            tx.run("sync_kv_state_put", (kind.name, *key))

    if written:
        for side in (a, b):
            clock = side.tx.one("sync_hlc", (kind.name,))
            if clock is None or stamp(str(clock[0])) < written:
                side.tx.run("sync_hlc_put", (kind.name, written))


class _Conversation(NamedTuple):
    """A conversation on one side as a sync found it: its version (None: never
    there), its buffer row (None: none) and what the side recorded of it."""

    version: Version | None
    row: tuple[Any, ...] | None
    recorded: tuple[str, bool] | None


def _conversation_versions(
    a: _Side, b: _Side, addresses: set[Address], scopes: _Scopes, since: dict[str, str]
) -> dict[Address, dict[str, _Conversation]]:
    """Each candidate conversation's version on each side (None: never there).

    Candidates: the buffers this sync looks at, and the conversations either side
    renamed or deleted since the pair's mark less the margin
    (``flowdrop_sync_conversations``; every one at a pair's first sync). A buffer's version is
    stamped by its last rename here, else its creation, or its last append if
    later (a conversation written to after another side deleted it survives); a
    deleted one by its deletion. The text is its title and metadata.
    """
    ceiling = _ceiling(a, b)
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
    versions: dict[Address, dict[str, _Conversation]] = {}
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
                    check_title(str(row[1]))
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
            versions[address][side.label] = _Conversation(version, row, mark)
    return versions


def _sync_conversations(
    a: _Side, b: _Side, versions: dict[Address, dict[str, _Conversation]], report: _Report
) -> set[Address]:
    """Give both sides the winning version of each conversation; return the
    addresses deleted on both (no merge follows for them). A side that holds the
    winner as recorded is left as it is (nothing written)."""
    deleted: set[Address] = set()
    for address, held in versions.items():
        winner = latest(held["a"].version, held["b"].version)
        if winner is None:
            continue
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
                    ids = [e.id for e in side.entries(int(row[0]))]
                    dead = side.tombstoned(ids)
                    side.tombstone([(id_, address) for id_ in ids if id_ not in dead])
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
            if found.recorded is not None or (title, metadata) != ("", {}):
                side.tx.run("sync_conversation_put", (*address, winner.stamp, 0))
    return deleted


def _tick(moment: str) -> str:
    """The stamp one microsecond after ``moment``."""
    when = datetime.datetime.fromisoformat(stamp(moment).replace("Z", "+00:00"))
    return (when + datetime.timedelta(microseconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _in_scope(kind: _Kind, key: Key, scopes: _Scopes) -> bool:
    return ("session", key[0]) in scopes if kind is _VIEWERS else key in scopes


def _sync_sessions(a: _Side, b: _Side, scopes: _Scopes, report: _Report) -> None:
    """Session rows (only when the ``session`` scope or the session's id is named):
    :func:`~flowdrop_local.rules.merge.merge_session` of the two rows, on both sides.
    Deleting a session is not synced (no API deletes one)."""
    held: dict[str, dict[str, tuple[Any, ...]]] = {}
    ceiling = _ceiling(a, b)
    for side in (a, b):
        rows = side.tx.all("export_session")
        held[side.label] = {str(r[0]): tuple(r) for r in rows if ("session", r[0]) in scopes}
    # A row updated "later" than the bound merges as updated at the bound (and is
    # written so): a clock far ahead does not make every field of it win for ever.
    stamped = {
        label: {k: _clamp_row(row, 8, ceiling)[0] for k, row in rows_of.items()}
        for label, rows_of in held.items()
    }

    # The merge base of a session is its row as this pair last synced it (each side
    # keeps one per peer): the row as of a side's last sync with anyone is no base
    # for this pair, as a third store may have moved it since. A pair without one
    # yet falls back to the per-store row when both sides hold the same.
    def bases_of(kind: str) -> dict[str, dict[str, tuple[Any, ...]]]:
        return {
            side.label: {
                str(r[0]): tuple(json.loads(r[1]))
                for r in side.tx.all("sync_kv_state", (kind.format(other=other.replica),))
            }
            for side, other in ((a, b), (b, a))
        }

    paired, anyone = bases_of("session:{other}"), bases_of("session")
    for session_id in sorted(set(held["a"]) | set(held["b"])):
        x, y = stamped["a"].get(session_id), stamped["b"].get(session_id)
        base = paired["a"].get(session_id)
        if base is None or base != paired["b"].get(session_id):
            base = anyone["a"].get(session_id)
            if paired["a"].get(session_id) is not None or base != anyone["b"].get(session_id):
                base = None  # the two last synced apart: no common base
        merged = merge_session(x, y, base) if x is not None and y is not None else (x or y)
        assert merged is not None
        for side in (a, b):
            current = held[side.label].get(session_id)
            if current != merged:
                if current is None:
                    side.tx.run("import_session", merged)
                else:
                    side.tx.run("sync_session_update", (*merged[1:], session_id))
                report.add(f"sessions_updated_on_{side.label}", 1)
            other = b if side is a else a
            row = json.dumps(list(merged))
            for kind, known in (("session", anyone), (f"session:{other.replica}", paired)):
                if known[side.label].get(session_id) != merged:
                    side.tx.run("sync_kv_state_forget", (kind, session_id))
                    side.tx.run("sync_kv_state_put", (kind, session_id, row, ""))


def _keep_state(side: _Side, address: Address, digest: str, held: str, view: _View) -> None:
    """Remember what the buffer holds now (its digest, and its ids for the next sync's
    deletions) and its summary now (so the next sync reads it only if it changed)."""
    found = side.tx.one("sync_summary_one", address)
    if found is None:  # no buffer (an empty one keeps its state: it has a summary)
        if view.state is not None:
            side.tx.run("sync_state_drop", address)
        return
    state = (digest, _summary(found))
    if view.state != state:
        side.tx.run("sync_state_put", (*address, digest, held, state[1]))


def _merge_buffer(
    address: Address,
    first: _Side,
    second: _Side,
    report: _Report,
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
    buffer in this sync, so rows read before are read again.
    """
    views = {side.label: side.views[address] for side in (first, second)}
    buffer_ids = {}
    before: dict[str, list[Entry]] = {}
    tail: tuple[str, int, str] | None = None  # last position, count up to it, digest
    start = ""
    if grown:
        state = views[first.label].state
        assert state is not None
        _, _, last, tally = state[1].split("|")[:4]
        tail = (last, int(tally), state[0])
    for side in (first, second):
        buffer_id = side.tx.open("open_buffer", (*address, None)).id
        buffer_ids[side.label] = buffer_id
        view = views[side.label]
        if tail is not None:
            row = side.tx.one("sync_context_start", (buffer_id, tail[0]))
            start = "" if row is None or row[0] is None else str(row[0])
            before[side.label] = side.entries_from(buffer_id, start)
        else:
            fresh = view.read and not stale
            before[side.label] = view.entries if fresh else side.entries(buffer_id)
    context: list[str] = []
    if tail is not None:
        context = [e.id for e in before[first.label] if e.position <= tail[0]]
        if context != [e.id for e in before[second.label] if e.position <= tail[0]]:
            return None
        if all(len(rows) == len(context) for rows in before.values()):
            return tail[2], views[first.label].held_text(), False  # nothing new
    # A message one side holds and the other deleted (its tombstone was compacted on a
    # third store that took the message back, say) is deleted, never sent.
    held_ids = {label: {e.id for e in rows} for label, rows in before.items()}
    dropped = False
    for holder, other in ((first, second), (second, first)):
        alone = [i for i in held_ids[holder.label] if i not in held_ids[other.label]]
        for id_ in sorted(other.tombstoned(alone)):
            if drive(remove_message(id_, heal_now=False), holder.tx):
                holder.tombstone([(id_, address)])
                report.add(f"deleted_on_{holder.label}", 1)
                dropped = True
    if dropped:
        return None  # read again, whole
    roles = {e.id: e.role for e in before[first.label]}
    for e in before[second.label]:
        if roles.get(e.id, e.role) != e.role:
            raise SyncIdConflict(
                f"message id {e.id} in buffer {'/'.join(address)} is a {roles[e.id]} message "
                f"on one side and a {e.role} message on the other: an id names one message; "
                "give one of them another id, then sync again"
            )
    sides_by_label = {first.label: first, second.label: second}
    generations = {
        side.label: _generations(side, before[side.label], {} if tail else views[side.label].held())
        for side in (first, second)
    }
    moves = {label: sides_by_label[label].moves(rows) for label, rows in before.items()}
    merged: Merged = merge(
        before["a"], before["b"], generations["a"], generations["b"], moves["a"], moves["b"]
    )
    if tail is not None:  # the rows both held stay where they are, the new ones after
        inside = [p.entry.id for p in merged.placed if p.position <= tail[0]]
        if inside != context:
            return None
    sides = {first.label: first, second.label: second}
    _record_conflicts(merged, address, sides, report)
    report.add("replaced", merged.replaced)
    report.add("edited", merged.edited)
    # Messages before what was read (a grown buffer's older rows) count too.
    above = 0 if tail is None else tail[1] - len(context)
    # The first side: the merged rows, then healing (the engine's), as an append would.
    target = [
        (p.entry, p.position, sides[p.source[0]] if p.source != "ab" else first)
        for p in merged.placed
    ]
    first_id, second_id = buffer_ids[first.label], buffer_ids[second.label]
    _write(first, first_id, before[first.label], target, whole=tail is None)
    healed: list[str] = []
    count = above + len(target)
    drive(heal(first_id, None, 0, count, healed, before_users_only=True), first.tx)
    report.add("healed", len(healed))
    _settle(first, first_id, count + len(healed))
    final = first.entries_from(first_id, start)
    kept_as = {e.id: e.fingerprint for e in final}
    winners = {  # each side's generations of the versions kept
        label: {
            e.id: generations[label][e.id]
            for e in before[label]
            if e.id in generations[label] and kept_as.get(e.id) == e.fingerprint
        }
        for label in before
    }
    _keep_generations((first, second), final, winners)
    _keep_moves((first, second), before, final, moves)
    # The second side: a copy of the first.
    _write(
        second,
        second_id,
        before[second.label],
        [(e, e.position, first) for e in final],
        whole=tail is None,
    )
    _settle(second, second_id, above + len(final))
    # Every message that was on a side and is not now is a tombstone on both.
    kept = {e.id for e in final}
    for side in (first, second):
        removed = [e.id for e in before[side.label] if e.id not in kept]
        report.add(f"deleted_on_{side.label}", len(removed))
    removed_all = sorted({e.id for side in before.values() for e in side} - kept)
    for side in (first, second):
        side.tombstone([(id_, address) for id_ in removed_all])
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
    rows = [(e.id, e.position, e.fingerprint) for e in final]
    if tail is None:
        return _digest(rows), _held(rows), True
    if [row[0] for row in rows if row[1] <= tail[0]] != context:
        # Healing placed a row among the older ones: read the buffer whole.
        rows = [(e.id, e.position, e.fingerprint) for e in first.entries(first_id)]
        return _digest(rows), _held(rows), True
    grown_rows = [row for row in rows if row[1] > tail[0]]
    held = " ".join(filter(None, (views[first.label].held_text(), _held(grown_rows))))
    return _digest(grown_rows, tail[2]), held, True


def _generations(side: _Side, entries: Sequence[Entry], held: Mapping[str, str]) -> dict[str, int]:
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
            generation = before + 1 if edited else (0 if row is None else before)
        if generation:
            found[e.id] = generation
    return found


def _keep_generations(
    sides: Sequence[_Side], final: Sequence[Entry], generations: Mapping[str, Mapping[str, int]]
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


def _keep_moves(
    sides: Sequence[_Side],
    before: Mapping[str, Sequence[Entry]],
    final: Sequence[Entry],
    moves: Mapping[str, Mapping[str, int]],
) -> None:
    """Record, on both sides, how many times syncs moved each message to where it now
    stands: as many as the side it came from had for that position, or one more than
    either had when this merge moved it (so the move wins against a replica that
    still holds it where it stood)."""
    stood = {label: {e.id: e.position for e in rows} for label, rows in before.items()}
    rows = []
    for e in final:
        kept = [
            moves[label].get(e.id, 0) for label in stood if stood[label].get(e.id) == e.position
        ]
        if kept:
            generation = max(kept)
        elif any(e.id in where for where in stood.values()):
            generation = max(moves[label].get(e.id, 0) for label in stood) + 1
        else:
            generation = 0  # new here (healed by this sync)
        if generation:
            rows.append((e.id, e.position, generation))
    if rows:
        for side in sides:
            side.tx.many("sync_move_put", rows)


def _record_conflicts(
    merged: Merged, address: Address, sides: dict[str, _Side], report: _Report
) -> None:
    """Conflicts keep the whole dropped message, on both sides."""
    if not merged.conflicts:
        return
    now = _now()
    rows = []
    for conflict in merged.conflicts:
        holder = sides[conflict.dropped_side]
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


def _write(
    side: _Side,
    buffer_id: int,
    current: list[Entry],
    target: list[tuple[Entry, str, _Side]],
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
    by_source: dict[int, tuple[_Side, list[str]]] = {}
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
        problem = _placeholder_problem(e, contents[e.id][0])
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
                (e.id, buffer_id, position, e.role, *contents[e.id], e.metadata, e.created_at, 0)
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


def _settle(side: _Side, buffer_id: int, count: int) -> None:
    """The count on the last row (schema.sql: only the last row's tally counts)."""
    row = side.tx.one("tail", (buffer_id,))
    if row is not None and row[0] is not None:
        side.tx.write("set_tally", (count, buffer_id, row[0]))

"""Keyed values that sync by last writer wins (memory values, viewer grants) and
session rows (field by field against the pair's base); stamps are bounded by
:data:`CLOCK_BOUND` and a found deletion is stamped after every stamp synced here."""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Callable
from typing import Any

import attrs

from ..backends.base import Tx
from ..errors import InvalidSession, SyncRefused
from ..rules.merge import Version, canonical, latest, merge_session, stamp
from ..sessions import _metadata, _session_id, _text, _user
from .common import Key, Scopes, wall_clock
from .report import Report
from .scan import stamp_before
from .side import MAX_MESSAGE_CHARS, Side, address_problem


@attrs.frozen
class Kind:
    """A keyed value that syncs by last writer wins, with deletions as tombstones."""

    name: str  # the report's prefix and the kv tables' kind
    read: Callable[[Tx, Scopes], dict[Key, tuple[Version, tuple[Any, ...]]]]
    put: Callable[[Tx, tuple[Any, ...]], None]
    drop: Callable[[Tx, Key], object]
    stamp_at: int  # where a row (as read gives it) holds its last-writer-wins stamp


# A last-writer-wins stamp later than the earlier of the two stores' clocks plus
# this counts as exactly that (and is written so, on both sides): a device whose
# clock runs ahead, or a file stamped in the year 9999, wins no value for longer.
CLOCK_BOUND = datetime.timedelta(minutes=5)


def ceiling_of(a: Side, b: Side) -> str:
    """The latest stamp this sync takes as it is (see :data:`CLOCK_BOUND`)."""
    return stamp(stamp_before(min(a.now, b.now, key=stamp), -CLOCK_BOUND))


def clamp_row(row: tuple[Any, ...], at: int, ceiling: str) -> tuple[tuple[Any, ...], bool]:
    """``row`` with its stamp at ``at`` no later than ``ceiling``; whether it changed."""
    if stamp(str(row[at])) <= ceiling:
        return row, False
    return (*row[:at], ceiling, *row[at + 1 :]), True


def _read_memory(tx: Tx, scopes: Scopes) -> dict[Key, tuple[Version, tuple[Any, ...]]]:
    found = {}
    for row in tx.all("export_memory"):
        key = (str(row[0]), str(row[1]), str(row[2]))
        if key in scopes:
            # The value, then created_at: equal versions read the same on both sides.
            text = f"{canonical(str(row[3]))}\x1f{stamp(str(row[4]))}"
            found[key] = (Version(stamp(str(row[5])), False, text), tuple(row))
    return found


def memory_problem(row: tuple[Any, ...]) -> str | None:
    """Why a memory row (scope, scope_id, key, value, ...) may not be written here."""
    problem = address_problem(str(row[0]), str(row[1]), str(row[2]), memory=True)
    if problem is not None:
        return problem
    if len(str(row[3])) > MAX_MESSAGE_CHARS:
        return f"is longer than {MAX_MESSAGE_CHARS:,} characters"
    try:
        json.loads(str(row[3]))
    except ValueError:
        return "is not JSON"
    return None


# The highest conversation number a session row from a peer may carry (a session
# starts a new conversation on each reset: far beyond any real one).
MAX_SESSION_CONVERSATION = 2**31


def session_problem(row: tuple[Any, ...]) -> str | None:
    """Why a session row (id, workflow_id, name, owner_id, status, conversation,
    metadata, created_at, updated_at) may not be written here: the checks
    ``sessions.create`` makes of what it is given, and a status and conversation
    number the sessions API could have written."""
    try:
        if _session_id(row[0]) != row[0]:
            return "has an id the sessions API would not give"
        _text("workflow id", row[1], blank=False)
        _text("name", row[2], blank=True)
        if row[3] is not None:
            _user("owner", row[3])
        _metadata(json.loads(str(row[6])))
    except (InvalidSession, ValueError) as error:
        return f"is not a session the library writes ({error})"
    if row[4] not in ("active", "stopped"):
        return f"has the status {str(row[4])[:40]!r}"
    if not isinstance(row[5], int) or not 0 <= row[5] <= MAX_SESSION_CONVERSATION:
        return f"has the conversation number {str(row[5])[:40]}"
    return None


def _put_memory(tx: Tx, row: tuple[Any, ...]) -> None:
    tx.run("memory_remove", row[:3])
    tx.run("import_memory", row)


def _read_viewers(tx: Tx, scopes: Scopes) -> dict[Key, tuple[Version, tuple[Any, ...]]]:
    found = {}
    for session_id, user_id, granted_at in tx.all("export_viewer"):
        if ("session", session_id) in scopes:
            row = (str(session_id), str(user_id), str(granted_at))
            found[(row[0], row[1], "")] = (Version(stamp(row[2]), False, ""), row)
    return found


def _put_viewer(tx: Tx, row: tuple[Any, ...]) -> None:
    tx.run("viewer_remove", row[:2])
    tx.run("import_viewer", row)


MEMORY = Kind("memory", _read_memory, _put_memory, lambda tx, k: tx.run("memory_remove", k), 5)


VIEWERS = Kind(
    "viewer", _read_viewers, _put_viewer, lambda tx, k: tx.run("viewer_remove", k[:2]), 2
)


def kv_shape(side: Side, kind: Kind) -> str:
    """The last sync that wrote this kind here, and a digest of every key and stamp
    (as the pair's mark keeps it): a set, grant, delete, revoke or import changes it
    (an update stamps strictly later than the value it replaces), whatever the wall
    clock did."""
    clock = {str(r[0]): str(r[1]) for r in side.tx.all("sync_kv_clock")}
    stamps = sorted(tuple(map(str, row)) for row in side.tx.all(f"sync_kv_stamps_{kind.name}"))
    digest = hashlib.sha256(json.dumps(stamps).encode()).hexdigest()[:32]
    return f"{clock.get(kind.name, '')}|{len(stamps)}|{digest}"


def kv_unchanged(side: Side, kind: Kind) -> bool:
    """Nothing of this kind changed here since the pair's last sync: its shape is
    the one recorded then. Then it is what both held at that sync, not read again."""
    return side.kv_then.get(kind.name) == kv_shape(side, kind)


def sync_registers(a: Side, b: Side, kind: Kind, scopes: Scopes, report: Report) -> None:
    """Memory values or viewer grants: a key that was there at the last sync and is
    gone becomes a tombstone stamped now (sync finds deletions, it is not told of
    them); then per key the :func:`~flowdrop_local.rules.merge.latest` version of the
    two sides goes to both."""
    ceiling = ceiling_of(a, b)
    rows: dict[str, dict[Key, tuple[Version, tuple[Any, ...]]]] = {}
    tombs: dict[str, dict[Key, Version]] = {}
    rewrite: dict[str, set[Key]] = {"a": set(), "b": set()}  # stamps clamped here
    for side in (a, b):
        found = {}
        for key, (version, row) in kind.read(side.tx, scopes).items():
            if kind.name == "memory":  # untrusted input, checked as memory_set checks it
                problem = memory_problem(row)
                if problem is not None:
                    raise SyncRefused(side.store.path, "/".join(key), problem, kind="memory value")
            row, clamped = clamp_row(row, kind.stamp_at, ceiling)
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
        now = min(max(stamp(wall_clock()), tick(str(clock[0])) if clock else ""), ceiling)
        for r in side.tx.all("sync_kv_state", (kind.name,)):
            key = (str(r[0]), str(r[1]), str(r[2]))
            if key not in found and kind_in_scope(kind, key, scopes):  # deleted here since
                dead[key] = Version(now, True, "")
                side.tx.run("sync_kv_tombstone_put", (kind.name, *key, now))
        rows[side.label], tombs[side.label] = found, dead
    keys = sorted(set(rows["a"]) | set(rows["b"]) | set(tombs["a"]) | set(tombs["b"]))
    written = ""
    for key in keys:
        if not kind_in_scope(kind, key, scopes):
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


def tick(moment: str) -> str:
    """The stamp one microsecond after ``moment``."""
    when = datetime.datetime.fromisoformat(stamp(moment).replace("Z", "+00:00"))
    return (when + datetime.timedelta(microseconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def kind_in_scope(kind: Kind, key: Key, scopes: Scopes) -> bool:
    return ("session", key[0]) in scopes if kind is VIEWERS else key in scopes


def sync_sessions(a: Side, b: Side, scopes: Scopes, report: Report) -> None:
    """Session rows (only when the ``session`` scope or the session's id is named):
    :func:`~flowdrop_local.rules.merge.merge_session` of the two rows, on both sides.
    Deleting a session is not synced (no API deletes one)."""
    held: dict[str, dict[str, tuple[Any, ...]]] = {}
    ceiling = ceiling_of(a, b)
    for side in (a, b):
        rows = side.tx.all("export_session")
        held[side.label] = {str(r[0]): tuple(r) for r in rows if ("session", r[0]) in scopes}
    # A row updated "later" than the bound merges as updated at the bound (and is
    # written so): a clock far ahead does not make every field of it win for ever.
    stamped = {
        label: {k: clamp_row(row, 8, ceiling)[0] for k, row in rows_of.items()}
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
    for side in (a, b):  # a peer's session rows are untrusted input
        for session_id, held_row in held[side.label].items():
            problem = session_problem(held_row)
            if problem is not None:
                raise SyncRefused(side.store.path, session_id, problem, kind="session")
    for session_id in sorted(set(held["a"]) | set(held["b"])):
        x, y = stamped["a"].get(session_id), stamped["b"].get(session_id)
        if x is not None and y is not None and x[3] != y[3]:
            # No API changes a session's owner: two owners is a forged (or a
            # hand-edited) row, and taking either would hand the session over.
            raise SyncRefused(
                b.store.path,
                session_id,
                f"names the owner {y[3]!r} where {a.store.path} names {x[3]!r} "
                "(a session's owner never changes)",
                kind="session",
            )
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


def sync_all_registers(
    a: Side, b: Side, scopes: Scopes, report: Report, sync_id: str, *, unchanged_known: bool
) -> None:
    """Step 4: session rows (before their grants), then viewer grants and memory
    values, by last writer wins. A kind neither side changed since the pair's last
    sync (``unchanged_known``: the pair has a mark) is not read (``kv_skipped``)."""
    sync_sessions(a, b, scopes, report)
    for kind in (VIEWERS, MEMORY):
        if unchanged_known and all(kv_unchanged(side, kind) for side in (a, b)):
            report.add("kv_skipped", 1)
            continue
        sync_registers(a, b, kind, scopes, report)
        for side in (a, b):
            side.tx.run("sync_kv_clock_put", (kind.name, sync_id))

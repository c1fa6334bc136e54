"""What a sync looks at: the buffers written since the pair's last mark (on the
store's clock, :data:`MARGIN`), and the whole-store digest that tells a copy made
by hand from its original."""

from __future__ import annotations

import datetime
import json

from ..backends.base import Tx
from ..errors import SyncRefused
from ..store import Store
from .common import Address, Scopes
from .side import Side, address_problem, digest_of


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
        return digest_of(self.rows)


def scan_buffers(tx: Tx, scopes: Scopes) -> dict[Address, _Buffer]:
    found: dict[Address, _Buffer] = {}
    for scope, scope_id, key, id_, position, fingerprint in tx.all("sync_scan"):
        address = (scope, scope_id, key)
        if address in scopes:
            found.setdefault(address, _Buffer()).rows.append((id_, position, fingerprint))
    return found


def whole_digest(store: Store) -> str:
    """Everything a sync moves, as one digest: every buffer's messages, and the
    memory values, sessions, grants and conversation names (two copies of one
    replica that differ in any of them are not one store)."""
    with store.backend.read() as tx:
        scanned = scan_buffers(tx, Scopes(["all"]))
        rest = [
            (kind, json.dumps([str(v) for v in row], ensure_ascii=False), "")
            for kind in ("memory", "session", "viewer", "conversation")
            for row in tx.all(f"export_{kind}")
        ]
    return digest_of([*((f"{a}", b.digest, "") for a, b in sorted(scanned.items())), *rest])


# ---------------------------------------------------------------------- sides


# A buffer changed since the last sync of a pair has ``updated_at`` at or after the
# mark (the newest buffer stamp when that sync began) less this: every stamp comes
# from the store's clock, which never goes back (schema.SQLITE_STORE_CLOCK), and
# an append writes ``updated_at`` when it is a minute behind that clock
# (engine.UPDATED_AT_GRANULARITY). The margin is that minute and one more; it costs
# a summary read per buffer written in it, no more. The wall clock plays no part.
MARGIN = datetime.timedelta(minutes=2)


def stamp_before(moment: str, margin: datetime.timedelta) -> str:
    if not moment:  # no stamp at all (a store without buffers): from the beginning
        return ""
    when = datetime.datetime.fromisoformat(moment.replace("Z", "+00:00")) - margin
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def changed_since(side: Side, since: str, scopes: Scopes) -> set[Address]:
    """Addresses that may have changed on ``side`` since ``since`` ('': every buffer):
    buffers written since (the ``buffers_recent`` index) and buffers deleted whole."""
    found = {(str(r[0]), str(r[1]), str(r[2])) for r in side.tx.all("sync_candidates", (since,))}
    for address in found:  # a peer's address is untrusted input, as an import's is
        problem = address_problem(*address)
        if problem is not None:
            raise SyncRefused(side.store.path, "/".join(address), problem, kind="buffer")
    found |= {(str(r[0]), str(r[1]), str(r[2])) for r in side.tx.all("sync_state_gone")}
    return {address for address in found if address in scopes}


def last_marks(a: Side, b: Side, scopes: Scopes) -> dict[str, str] | None:
    """Each side's clock at the start of the pair's last completed sync over these
    scopes (or everything), or None: both sides must name the same sync (a sync
    killed between its two commits left a mark on one side only). Each side's
    ``kv`` of that mark goes to :attr:`Side.kv_then`."""
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

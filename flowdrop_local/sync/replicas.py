"""Replicas: a store's id, the schema steps it takes, its peers and retirements,
``enable`` and the conflicts syncs kept."""

from __future__ import annotations

import json
import uuid
from typing import Any

from ..backends.base import Tx
from ..store import Store
from .common import Scopes, wall_clock
from .registers import MEMORY, VIEWERS
from .scan import scan_buffers
from .schema import SQLITE_KIND_COLUMN, schema_steps, sqlite_delete_triggers
from .side import held_of, summary_of


def ensure_tables(tx: Tx, store: Store) -> str:
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
                "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext("
                "pg_catalog.concat(pg_catalog.current_schema(), '.flowdrop_sync_ddl')))"
            )
        for step in range(taken(), len(steps)):
            for ddl in steps[step]:
                if ddl == SQLITE_KIND_COLUMN and tx.one("sync_tombstone_kinds")[0]:
                    continue
                tx.script(ddl)
            tx.run("sync_schema_put", (step + 1,))
        if not postgresql:  # this connection's (the others' at their next write)
            for ddl in sqlite_delete_triggers(kinds=True):
                tx.script(ddl)
    row = tx.one("sync_replica")
    if row is not None:
        return str(row[0])
    replica = str(uuid.uuid4())
    tx.run("sync_replica_put", (replica, wall_clock()))
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
        ensure_tables(tx, store)
        tx.run("sync_replica_drop")
        return ensure_tables(tx, store)


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
        ensure_tables(tx, store)
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
        replica = ensure_tables(tx, store)
        everything = Scopes(["all"])
        known = {(r[0], r[1], r[2]) for r in tx.all("sync_state_all")}
        summaries = {(r[0], r[1], r[2]): summary_of(r) for r in tx.all("sync_candidates", ("",))}
        for address, buffer in scan_buffers(tx, everything).items():
            if address not in known:
                row = (*address, buffer.digest, held_of(buffer.rows), summaries[address])
                tx.run("sync_state_put", row)
        for kind in (MEMORY, VIEWERS):
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

"""What offline sync hears from the engine (:func:`flowdrop_local.engine.listen`):
the changes a store's rows do not show. Nothing is done on a store that never
synced (it has no sync tables)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from ..engine import listen
from ..plans import One, Plan, Run
from .order import link_store


def _edited(buffer_id: int) -> Plan:
    """A change other than an append at the end: forget the buffer's recorded
    summary, so its next sync reads it whole."""
    synced = yield One("sync_tables", ())
    if synced[0]:
        yield Run("sync_forget_summary", (buffer_id,))


def _restored(message_ids: Sequence[str]) -> Plan:
    """Messages an import with replace deleted and wrote back were not deleted:
    their tombstones go."""
    synced = yield One("sync_tables", ())
    if synced[0]:
        yield Run("sync_untombstone", (list(message_ids),))


def _registers_imported(kinds: Sequence[str]) -> Plan:
    """Values written with the stamps they had: the next sync reads the kind
    instead of taking it for what both held at the pair's last sync."""
    synced = yield One("sync_tables", ())
    if synced[0]:
        for kind in kinds:
            yield Run("sync_kv_clock_put", (kind, f"import {uuid.uuid4()}"))


def _copying() -> Plan:
    """Before a backup: every message gets its link now (sync.order), so the store
    and its copy hold the same links and order alike; each linking it later from
    its own order, after deletions apart, could link a message two ways."""
    synced = yield One("sync_tables", ())
    if synced[0]:
        yield from link_store()


listen("edited", _edited)
listen("restored", _restored)
listen("registers_imported", _registers_imported)
listen("copying", _copying)

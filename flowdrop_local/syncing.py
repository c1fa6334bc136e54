"""Offline sync's public API: ``sync(a, b)`` merges two stores that diverged into
one history. The work is done by :mod:`flowdrop_local.sync`, one module per stage
(its docstring maps them); the model is docs/sync.md."""

from __future__ import annotations

# Loaded for what it registers: sync's listeners with the engine.
from .sync import notices  # noqa: F401
from .sync.registers import CLOCK_BOUND
from .sync.replicas import conflicts, enable, forget_peer, new_replica, peers, replica_id
from .sync.report import SyncReport
from .sync.run import SYNC_RETRIES, sync
from .sync.scan import MARGIN
from .sync.side import MAX_MESSAGE_CHARS, MAX_SYNC_POSITION

__all__ = [
    "CLOCK_BOUND",
    "MARGIN",
    "MAX_MESSAGE_CHARS",
    "MAX_SYNC_POSITION",
    "SYNC_RETRIES",
    "SyncReport",
    "conflicts",
    "enable",
    "forget_peer",
    "new_replica",
    "peers",
    "replica_id",
    "sync",
]

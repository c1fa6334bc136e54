"""Offline sync: two stores that diverged merge into one history.

The public API is :mod:`flowdrop_local.syncing` (``sync``, ``enable``,
``new_replica``, ``forget_peer``, ``peers``, ``conflicts``, ``SyncReport``); this
package does the work, one module per stage, in the order a sync runs them:

* :mod:`.schema`: sync's tables and triggers as numbered schema steps, the store's
  clock, and the SQL both backends share;
* :mod:`.replicas`: replica ids, peers, retirement, ``enable``;
* :mod:`.scan`: what to look at (per-pair marks on the store's clock) and the
  whole-store digest that catches a hand copy;
* :mod:`.side`: one side of a sync (its transaction, its views of buffers, the
  checks every row from a peer passes);
* :mod:`.tombstones`: deletions recorded, acknowledged, sent, applied, compacted;
* :mod:`.conversations`: titles, metadata and existence, last writer wins;
* :mod:`.merge` and :mod:`.write`: buffers that differ merge by
  :func:`flowdrop_local.rules.merge.merge` and are written back on both sides;
* :mod:`.registers`: memory values, viewer grants and session rows;
* :mod:`.run`: one sync, in one write transaction per side, retried on PostgreSQL.

The rule decisions stay in :mod:`flowdrop_local.rules` (shared with the append).
Nothing here is imported by the package's root at import time but through
``syncing`` (the backends import only :mod:`.schema`, a leaf).
"""

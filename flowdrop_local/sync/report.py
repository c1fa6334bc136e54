"""What a sync did: :class:`SyncReport` (public) and the counter the stages add to."""

from __future__ import annotations

from typing import Any

import attrs


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


class Report:
    """The counts as a sync makes them, labelled by side."""

    def __init__(self, a: str, b: str, dry_run: bool) -> None:
        self.fields: dict[str, Any] = {"a": a, "b": b, "dry_run": dry_run, "conflicts": {}}

    def add(self, name: str, n: int) -> None:
        self.fields[name] = self.fields.get(name, 0) + n

    def conflict(self, rule: str) -> None:
        self.fields["conflicts"][rule] = self.fields["conflicts"].get(rule, 0) + 1

    def done(self) -> SyncReport:
        return SyncReport(**self.fields)

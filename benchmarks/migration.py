"""The 2 -> 3 schema upgrade on a large file: ``python -m benchmarks.migration``.

Builds a version-2 file of ``--messages`` messages (the corpus of
:func:`benchmarks.core.message`: user, call, result, reply, in buffers of
``--per-buffer``) from the frozen version-2 schema (``migrations/schema_v2.sql``)
with ``executemany`` of well-formed rows, as the version-2 library left them (WAL
mode, text ids, the ledger, ``buffers.message_count``). Then times the upgrade: one
``Store(path)`` open of the current library, which runs the 2 -> 3 step in one
transaction, and its close (the checkpoint that moves the new pages into the file).

Reports the seconds and messages per second, and the file before and after: its
size, bytes per message, and after the upgrade the free pages the old tables left
(``VACUUM`` gives them back; the upgrade does not run it, it cannot run inside a
transaction). ``--out benchmarks/RESULTS.md`` writes the table into its
``migration`` section. The script prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowdrop_local import Store
from flowdrop_local._schema import _frozen_schema, statements
from flowdrop_local.engine import new_message_id
from flowdrop_local.positions import keys_between

from . import report
from .core import fmt_bytes, message, remove_database

_CHUNK = 10_000  # rows handed to one executemany


def _stored(msg: dict[str, Any]) -> tuple[str, str, int, str]:
    """(role, content, content_parts, metadata JSON) as version 2 stored a corpus message."""
    metadata: dict[str, Any] = {}
    if msg.get("tool_calls"):
        metadata["tool_calls"] = msg["tool_calls"]
    if "tool_call_id" in msg:
        metadata["tool_call_id"] = msg["tool_call_id"]
    return msg["role"], msg["content"], 0, json.dumps(metadata)


def _rows(
    buffer_id: int, size: int, first: int, ledger: list[tuple[Any, ...]]
) -> Iterator[tuple[Any, ...]]:
    """The message rows of one buffer; its ledger rows go to ``ledger``."""
    declared: dict[str, str] = {}
    for n, position in enumerate(keys_between(None, None, size)):
        i = first + n
        msg = message(n)
        if n == size - 1 and msg.get("tool_calls"):
            msg = {"role": "assistant", "content": "[no call made]"}  # never end unanswered
        role, content, parts, metadata = _stored(msg)
        message_id = new_message_id()
        for call in msg.get("tool_calls", ()):
            declared[call["id"]] = message_id
        if "tool_call_id" in msg:
            call_id = msg["tool_call_id"]
            ledger.append((buffer_id, call_id, declared.pop(call_id), 0, message_id))
        created = f"2026-01-01T00:{i // 60_000 % 60:02d}:{i // 1000 % 60:02d}.{i % 1000:03d}Z"
        yield (message_id, buffer_id, position, role, content, parts, metadata, created)


def build_v2(path: Path, messages: int, per_buffer: int = 1_000) -> None:
    """Write a version-2 file of ``messages`` messages at ``path`` (replacing one there)."""
    remove_database(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN")
        for statement in statements(_frozen_schema(2)):
            conn.execute(statement)
        for buffer_id, first in enumerate(range(0, messages, per_buffer), start=1):
            size = min(per_buffer, messages - first)
            conn.execute(
                "INSERT INTO buffers (id, scope, scope_id, key, message_count) "
                "VALUES (?, 'user', ?, 'chat', ?)",
                (buffer_id, f"u{buffer_id:06d}", size),
            )
            ledger: list[tuple[Any, ...]] = []
            rows = list(_rows(buffer_id, size, first, ledger))
            for start in range(0, len(rows), _CHUNK):
                conn.executemany(
                    "INSERT INTO messages (id, buffer_id, position, role, content, "
                    "content_parts, metadata, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    rows[start : start + _CHUNK],
                )
            conn.executemany(
                "INSERT INTO tool_calls (buffer_id, call_id, declared_by, ordinal, answered_by) "
                "VALUES (?, ?, ?, ?, ?)",
                ledger,
            )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _pages(path: Path) -> tuple[int, int, int]:
    """(file size, page size, free pages) of a closed database file."""
    conn = sqlite3.connect(path)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    finally:
        conn.close()
    return os.path.getsize(path), page_size, free


def measure(path: Path, messages: int, per_buffer: int) -> dict[str, float]:
    """Build a version-2 file, upgrade it, and return the figures."""
    started = time.perf_counter()
    build_v2(path, messages, per_buffer)
    built = time.perf_counter() - started
    before, _, _ = _pages(path)
    started = time.perf_counter()
    store = Store(path)
    opened = time.perf_counter() - started
    wal = os.path.getsize(f"{path}-wal") if os.path.exists(f"{path}-wal") else 0
    store.close()
    seconds = time.perf_counter() - started
    after, page_size, free = _pages(path)
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        conn.execute("VACUUM")
    finally:
        conn.close()
    vacuumed = os.path.getsize(path)
    return {
        "messages": messages,
        "built": built,
        "opened": opened,
        "seconds": seconds,
        "version": version,
        "before": before,
        "after": after,
        "free": free * page_size,
        "wal": wal,
        "vacuumed": vacuumed,
    }


def render(figures: dict[str, float], command: str) -> str:
    """The markdown section of the report."""
    n = figures["messages"]
    per = "{:,.0f} B".format
    return "\n".join(
        [
            "## Schema upgrade 2 -> 3",
            "",
            f"`{command}`",
            "",
            *report.machine()[:3],
            "",
            "One `Store(path)` open of a version-2 file (upgraded in one transaction) and "
            "its close (the checkpoint); the file was built from the frozen version-2 "
            f"schema. It reached version {figures['version']:.0f}.",
            "",
            "| messages | upgrade | messages/s | open alone | file before | per message "
            "| file after | per message | free pages after | WAL at commit | after VACUUM "
            "| per message |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {n:,.0f} | {figures['seconds']:.2f} s | {n / figures['seconds']:,.0f} "
            f"| {figures['opened']:.2f} s "
            f"| {fmt_bytes(int(figures['before']))} | {per(figures['before'] / n)} "
            f"| {fmt_bytes(int(figures['after']))} | {per(figures['after'] / n)} "
            f"| {fmt_bytes(int(figures['free']))} | {fmt_bytes(int(figures['wal']))} "
            f"| {fmt_bytes(int(figures['vacuumed']))} | {per(figures['vacuumed'] / n)} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Build a large version-2 file, time its upgrade, print (and optionally write) the table."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.migration", description="Time the 2 -> 3 schema upgrade."
    )
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--per-buffer", type=int, default=1_000, help="messages per buffer")
    parser.add_argument("--out", help="report to update (e.g. benchmarks/RESULTS.md)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flowdrop-migration-") as tmp:
        figures = measure(Path(tmp) / "v2.db", args.messages, args.per_buffer)
    print(f"built the version-2 file in {figures['built']:.1f} s", flush=True)
    command = "python -m benchmarks.migration" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
    )
    section = render(figures, command)
    print("\n" + section)
    if args.out:
        report.write_section(Path(args.out), "migration", section)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

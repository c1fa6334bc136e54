"""Offline sync against a full export + import, at several store sizes.

``python -m benchmarks.sync [--sizes 10000,100000] [--new 1000]``: per size N, a store
of N messages in 100 buffers, last written a day ago (``buffers.updated_at`` set back
before ``syncing.enable``), copied with ``backup``. Then:

* **backup**: the copy is made with ``Store.backup``, which first gives every
  message its link (the order every replica shares), and the links' size;
* **first sync**: each copy added NEW messages (spread over 10 buffers) since the copy;
  the pair has never synced, so every buffer's summary is looked at;
* **again**: a second sync right after (nothing changed);
* **later**: each copy adds NEW more messages in 10 other buffers and they sync
  again: the steady state, where only buffers written since the last sync are
  looked at;
* **export + import**: one store exported whole (format 2) and imported into a
  fresh file, what sync replaces.

Prints times, buffers looked at, read whole and merged, message rows read, and the
bytes of message records moved (JSON, as an export writes them); ``--out
benchmarks/RESULTS.md`` writes the tables into the report. Asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from flowdrop_local import Store, SyncReport, sync
from flowdrop_local.syncing import enable

from . import report

BUFFERS = 100


def fill(store: Store, n: int, tag: str, buffers: range) -> None:
    per = n // len(buffers)
    for b in buffers:
        batch = []
        for i in range(per // 2):
            batch += [
                {"role": "user", "content": f"{tag} question {b}/{i}"},
                {"role": "assistant", "content": f"{tag} answer {b}/{i} " + "x" * 60},
            ]
        store.buffer("workflow", "bench", f"chat{b}").append(batch)


CHANGED = range(40)  # the buffers the runs below add to (the others never change)


def sizes(store: Store) -> dict[str, int]:
    """Each message id of the changed buffers and the size of its export record."""
    return {
        r["id"]: len(json.dumps(r))
        for n in CHANGED
        for r in store.export(("workflow", "bench", f"chat{n}"))
        if "id" in r
    }


def timed_sync(a: Store, b: Store) -> tuple[float, SyncReport, int]:
    """One sync: seconds, report, bytes of the records that moved."""
    held_a, held_b = sizes(a), sizes(b)
    before = {**held_a, **held_b}
    started = time.perf_counter()
    report = sync(a, b)
    took = time.perf_counter() - started
    moved = sum(before[i] for i in set(before) - set(held_b)) + sum(
        before[i] for i in set(before) - set(held_a)
    )
    return took, report, moved


def line(name: str, took: float, done: SyncReport, moved: int) -> str:
    return (
        f"| {name} | {took * 1000:,.0f} ms | {moved / 1024:,.0f} KiB | "
        f"{done.sent_a_to_b} / {done.sent_b_to_a} | "
        f"{done.buffers_compared} / {done.buffers_read} / {done.buffers_merged} | "
        f"{done.rows_read:,} |"
    )


def link_bytes(path: Path) -> int:
    """The bytes of sync's links and their index (SQLite's dbstat), 0 if unknown."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "SELECT sum(pgsize) FROM dbstat WHERE name LIKE 'flowdrop_sync_links%'"
        ).fetchone()
    except sqlite3.Error:
        return 0
    finally:
        conn.close()
    return int(row[0] or 0)


def one_size(n: int, new: int, folder: Path) -> list[str]:
    a = Store(str(folder / "a.db"))
    fill(a, n, "base", range(BUFFERS))
    a.close()
    with sqlite3.connect(folder / "a.db") as conn:  # a store in use for a while, not just made
        conn.execute("UPDATE buffers SET updated_at = '2026-01-01T00:00:00.000Z'")
    conn.close()
    a = Store(str(folder / "a.db"))
    enable(a)
    started = time.perf_counter()
    a.backup(str(folder / "b.db"))  # links every message first (sync.order)
    backup_took = time.perf_counter() - started
    b = Store(str(folder / "b.db"))
    links = link_bytes(folder / "b.db")
    fill(a, new, "a", range(10))
    fill(b, new, "b", range(10, 20))
    out = [f"**{n:,} messages** (+{new:,} on each side)", ""]
    out += [
        "| sync | time | records moved | messages a→b / b→a "
        "| buffers looked at / read whole / merged | rows read |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    out.append(
        f"| backup, linking every message | {backup_took * 1000:,.0f} ms | "
        f"links: {links / 1024:,.0f} KiB, {links / n:,.0f} B a message | | | |"
    )
    out.append(line("first (never synced)", *timed_sync(a, b)))
    out.append(line("again, nothing changed", *timed_sync(a, b)))
    fill(a, new, "a2", range(20, 30))
    fill(b, new, "b2", range(30, 40))
    out.append(line("later, 1,000 new each", *timed_sync(a, b)))
    started = time.perf_counter()
    text = io.StringIO()
    for record in a.export(full=True):
        text.write(json.dumps(record) + "\n")
    exported = text.getvalue()
    with Store(str(folder / "c.db")) as c:
        c.import_jsonl(exported.splitlines())
    took = time.perf_counter() - started
    out.append(
        f"| export + import of one store | {took * 1000:,.0f} ms | "
        f"{len(exported.encode()) / 1024:,.0f} KiB | one direction | | |"
    )
    a.close()
    b.close()
    return [*out, ""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sync", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--new", type=int, default=1_000)
    parser.add_argument("--out", help="report to update (e.g. benchmarks/RESULTS.md)")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.sync" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
    )
    lines = ["## Offline sync", "", f"`{command}`", "", *report.machine(), ""]
    lines += [
        f"Two stores of N messages in {BUFFERS} buffers (a copy made with `backup`), each "
        f"adding {args.new:,} messages in 10 buffers of its own; every buffer last written "
        "a day before. Rows read: message rows read on both sides (the sync's cost).",
        "",
    ]
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            part = one_size(n, args.new, Path(folder))
        print("\n".join(part), flush=True)
        lines += part
    if args.out:
        report.write_section(Path(args.out), "sync", "\n".join(lines).rstrip() + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

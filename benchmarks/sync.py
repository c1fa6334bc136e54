"""Offline sync against a full export + import.

``python -m benchmarks.sync [N] [NEW]``: a store of ``N`` messages (default
100,000, in 100 buffers), copied (``backup``) after ``syncing.enable``; then each
copy adds ``NEW`` messages (default 1,000, spread over 10 buffers) and they sync.
Prints the time of that sync, of a second sync right after (nothing changed),
the bytes of message records moved (JSON, as an export writes them), and the time
and bytes of exporting one store whole and importing it into a fresh file (what
sync replaces). Asserts nothing.
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
import time
from pathlib import Path

from flowdrop_local import Store, sync
from flowdrop_local.syncing import enable

BUFFERS = 100


def fill(store: Store, n: int, tag: str, buffers: int) -> None:
    per = n // buffers
    for b in range(buffers):
        batch = []
        for i in range(per // 2):
            batch += [
                {"role": "user", "content": f"{tag} question {b}/{i}"},
                {"role": "assistant", "content": f"{tag} answer {b}/{i} " + "x" * 60},
            ]
        store.buffer("workflow", "bench", f"chat{b}").append(batch)


def records(store: Store) -> dict[str, int]:
    """Each message id and the size of its export record."""
    return {r["id"]: len(json.dumps(r)) for r in store.export() if "id" in r}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    new = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000
    with tempfile.TemporaryDirectory() as folder:
        a = Store(str(Path(folder) / "a.db"))
        fill(a, n, "base", BUFFERS)
        enable(a)
        a.backup(str(Path(folder) / "b.db"))
        b = Store(str(Path(folder) / "b.db"))
        fill(a, new, "a", 10)
        fill(b, new, "b", 10)
        before = {**records(a), **records(b)}
        held_a, held_b = set(records(a)), set(records(b))
        started = time.perf_counter()
        report = sync(a, b)
        first = time.perf_counter() - started
        moved = sum(before[i] for i in set(before) - held_b) + sum(
            before[i] for i in set(before) - held_a
        )
        started = time.perf_counter()
        again = sync(a, b)
        second = time.perf_counter() - started
        started = time.perf_counter()
        out = io.StringIO()
        for record in a.export(full=True):
            out.write(json.dumps(record) + "\n")
        exported = out.getvalue()
        with Store(str(Path(folder) / "c.db")) as c:
            c.import_jsonl(exported.splitlines())
        full = time.perf_counter() - started
        total = len(records(a))
        print(
            f"stores: {total:,} messages each after the sync ({n:,} common + {new:,} new on each)"
        )
        print(
            f"sync:             {first * 1000:8.0f} ms  "
            f"{moved / 1024:8.0f} KiB of records moved "
            f"({report.sent_a_to_b} a->b, {report.sent_b_to_a} b->a, "
            f"{report.buffers_merged}/{report.buffers_compared} buffers merged)"
        )
        print(f"second sync:      {second * 1000:8.0f} ms  {again.moved} changes")
        print(
            f"export + import:  {full * 1000:8.0f} ms  "
            f"{len(exported.encode()) / 1024:8.0f} KiB (one direction, one store)"
        )
        a.close()
        b.close()


if __name__ == "__main__":
    main()

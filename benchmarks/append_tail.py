"""Where an append's tail comes from: ``python -m benchmarks.append_tail``.

Appends one after another (flowdrop_local and raw sqlite3 alternating, the suite's
own systems and messages, synchronous=NORMAL) onto histories of each size, twice:
as each system checkpoints by default (raw sqlite3: SQLite's automatic checkpoint,
inside the commit that takes the WAL past 1,000 pages; flowdrop_local: its own
thread, off the commit) and with no checkpoint at all on either. Prints median,
p95, p99, p99.9 and the slowest append per system, so the two runs say how much of
the tail the checkpoint is.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from .core import APPEND, history
from .systems.flowdrop import Flowdrop
from .systems.raw import RawSqlite


def _rank(sorted_ns: list[int], q: float) -> float:
    """Nearest-rank percentile, in microseconds."""
    index = max(0, min(len(sorted_ns) - 1, round(q * len(sorted_ns)) - 1))
    return sorted_ns[index] / 1e3


def _row(label: str, times: list[int]) -> str:
    ordered = sorted(times)
    cells = [_rank(ordered, q) for q in (0.5, 0.95, 0.99, 0.999)] + [ordered[-1] / 1e3]
    slow = sum(1 for t in times if t > 2_000_000)
    return f"| {label} | " + " | ".join(f"{c:,.0f} µs" for c in cells) + f" | {slow} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,100000", help="messages before the loop")
    parser.add_argument("--rounds", type=int, default=5000)
    args = parser.parse_args(argv)
    print("| system, history, checkpoint | median | p95 | p99 | p99.9 | max | over 2 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        for checkpoint in ("default", "none"):
            with tempfile.TemporaryDirectory(prefix="flowdrop-tail-") as tmp:
                ours, raw = Flowdrop("normal"), RawSqlite("normal")
                ours.open(Path(tmp) / "ours.db", history(size))
                raw.open(Path(tmp) / "raw.db", history(size))
                if checkpoint == "none":
                    backend = ours.store._backend  # its checkpoint thread: a benchmark's switch
                    backend._checkpointer.stop()  # type: ignore[attr-defined]
                    backend._checkpointer = None  # type: ignore[attr-defined]
                    raw.conn.execute("PRAGMA wal_autocheckpoint = 0")
                append_ours, append_raw = ours.operation(APPEND), raw.operation(APPEND)
                times_ours, times_raw = [], []
                for _ in range(args.rounds):
                    times_ours.append(append_ours())
                    times_raw.append(append_raw())
                ours.close()
                raw.close()
            print(_row(f"flowdrop_local, {size:,}, {checkpoint}", times_ours))
            print(_row(f"raw sqlite3, {size:,}, {checkpoint}", times_raw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One append after another, nothing in between: ``python -m benchmarks.append_loop``.

The suite (``python -m benchmarks``) runs every system in turn between two appends
of one system, so each append starts with cold CPU caches. This loop alternates
only flowdrop_local and raw sqlite3 (the suite's own systems, same messages, same
pragmas), the way an agent appending a burst of turns would, and prints the
medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from .core import APPEND, history
from .systems.flowdrop import Flowdrop
from .systems.raw import RawSqlite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100, help="messages before the loop")
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--durability", choices=("normal", "full"), default="normal")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flowdrop-loop-") as tmp:
        ours, raw = Flowdrop(args.durability), RawSqlite(args.durability)
        ours.open(Path(tmp) / "ours.db", history(args.size))
        raw.open(Path(tmp) / "raw.db", history(args.size))
        append_ours, append_raw = ours.operation(APPEND), raw.operation(APPEND)
        times_ours, times_raw = [], []
        for _ in range(args.rounds):
            times_ours.append(append_ours())
            times_raw.append(append_raw())
        ours.close()
        raw.close()
    median_ours = statistics.median(times_ours) / 1e3
    median_raw = statistics.median(times_raw) / 1e3
    print(
        f"append, {args.size:,} messages, {args.durability}, {args.rounds:,} rounds: "
        f"flowdrop_local {median_ours:.1f} µs, raw sqlite3 {median_raw:.1f} µs, "
        f"{median_ours / median_raw:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

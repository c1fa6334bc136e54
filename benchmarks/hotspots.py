"""Where flowdrop_local spends its time: ``python -m benchmarks.hotspots``.

cProfile around the timed call only (the untimed preparation stays outside the
profiler), on a buffer pre-filled with ``--size`` messages at durability normal:
single appends, healing user appends (k = 10), ``read(limit=50)`` and one batch
import. Prints the top functions by own time, with their cumulative time; then,
without cProfile, the wall time of each SQL statement per append (the store's
connection is made with a timing ``factory``).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

from flowdrop_local import Store

from . import report
from .core import declaring_turn, history

_ADDRESS = ("user", "u-1", "conversation-1")


def _profile(profiler: cProfile.Profile, call: Callable[[], object]) -> None:
    profiler.enable()
    try:
        call()
    finally:
        profiler.disable()


def _top(profiler: cProfile.Profile, limit: int, total_ops: int) -> str:
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.strip_dirs().sort_stats("tottime")
    rows = []
    width = 0
    for func, (_cc, ncalls, tottime, cumtime, _callers) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: item[1][2],
        reverse=True,
    )[:limit]:
        filename, line, name = func
        label = f"{name} ({filename}:{line})" if line else name
        width = max(width, len(label))
        rows.append((label, ncalls, tottime, cumtime))
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    lines = [f"total {total * 1e6 / total_ops:.1f} µs per operation (under cProfile)"]
    lines.append(f"{'function':<{width}}  {'calls':>8}  {'own µs/op':>9}  {'cum µs/op':>9}")
    for label, ncalls, tottime, cumtime in rows:
        lines.append(
            f"{label:<{width}}  {ncalls:>8}  {tottime * 1e6 / total_ops:>9.1f}  "
            f"{cumtime * 1e6 / total_ops:>9.1f}"
        )
    return "\n".join(lines)


class _TimedConnection(sqlite3.Connection):
    """A connection that adds up the wall time of each SQL text it executes.

    ``execute`` returns after the statement's first step: a SELECT's later rows
    are fetched outside the figure, which for the look-ups here is all of it.
    """

    spent: ClassVar[dict[str, list[float]]] = {}

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        started = time.perf_counter()
        try:
            return super().execute(sql, parameters)
        finally:
            self._add(sql, time.perf_counter() - started)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        started = time.perf_counter()
        try:
            return super().executemany(sql, parameters)
        finally:
            self._add(sql, time.perf_counter() - started)

    @classmethod
    def _add(cls, sql: str, seconds: float) -> None:
        entry = cls.spent.setdefault(" ".join(sql.split()), [0, 0.0])
        entry[0] += 1
        entry[1] += seconds


def _sql_table(ops: int) -> str:
    spent = sorted(_TimedConnection.spent.items(), key=lambda item: item[1][1], reverse=True)
    lines = [f"{'µs/op':>7}  {'calls/op':>8}  statement"]
    for sql, (calls, seconds) in spent:
        text = sql if len(sql) <= 110 else sql[:107] + "..."
        lines.append(f"{seconds * 1e6 / ops:>7.1f}  {calls / ops:>8.2f}  {text}")
    _TimedConnection.spent = {}
    return "\n".join(lines)


def _timed_store(path: Path) -> Store:
    """A store whose connection times its statements (``sqlite3.connect`` patched meanwhile)."""
    timed_connect = functools.partial(sqlite3.connect, factory=_TimedConnection)
    with mock.patch("sqlite3.connect", timed_connect):
        return Store(path)


def sql_breakdown(args: argparse.Namespace, workdir: Path) -> dict[str, str]:
    """Wall time per SQL statement, per operation, without cProfile."""
    out: dict[str, str] = {}
    with _timed_store(workdir / "sql.db") as store:
        buffer = store.buffer(*_ADDRESS)
        buffer.append(history(args.size))
        _TimedConnection.spent = {}
        for i in range(args.ops):
            buffer.append({"role": "user", "content": f"appended turn {i}: " + "x" * 200})
        out[f"SQL of one append ({args.ops:,} appends)"] = _sql_table(args.ops)
        heals = max(1, args.ops // 4)
        _TimedConnection.spent = {}
        for i in range(heals):
            _TimedConnection.spent, kept = {}, _TimedConnection.spent
            buffer.append(declaring_turn([f"call_x{i}_{j}" for j in range(10)]))
            _TimedConnection.spent = kept
            buffer.append({"role": "user", "content": f"user turn {i}"})
        out[f"SQL of one healing user append, k = 10 ({heals:,} appends)"] = _sql_table(heals)
    return out


def run(args: argparse.Namespace, workdir: Path) -> dict[str, str]:
    """Profile each workload; return the printed table of each."""
    out: dict[str, str] = {}
    with Store(workdir / "profile.db") as store:
        buffer = store.buffer(*_ADDRESS)
        buffer.append(history(args.size))

        profiler = cProfile.Profile()
        for i in range(args.ops):
            message = {"role": "user", "content": f"appended turn {i}: " + "x" * 200}
            _profile(profiler, lambda m=message: buffer.append(m))  # type: ignore[misc]
        out[f"append one message ({args.ops:,} appends)"] = _top(profiler, args.top, args.ops)

        profiler = cProfile.Profile()
        heals = max(1, args.ops // 4)
        for i in range(heals):
            buffer.append(declaring_turn([f"call_{i}_{j}" for j in range(10)]))
            user = {"role": "user", "content": f"user turn {i}"}
            _profile(profiler, lambda m=user: buffer.append(m))  # type: ignore[misc]
        out[f"user append healing k = 10 ({heals:,} appends)"] = _top(profiler, args.top, heals)

        profiler = cProfile.Profile()
        for _ in range(args.ops):
            _profile(profiler, lambda: buffer.read(limit=50))
        out[f"read(limit=50) ({args.ops:,} reads)"] = _top(profiler, args.top, args.ops)

    with Store(workdir / "import.db") as store:
        batch = history(args.import_size)
        profiler = cProfile.Profile()
        buffer = store.buffer(*_ADDRESS)
        _profile(profiler, lambda: buffer.append(batch))
        out[f"import of {args.import_size:,} messages (one append)"] = _top(
            profiler, args.top, args.import_size
        )
    out.update(sql_breakdown(args, workdir))
    return out


def main(argv: list[str] | None = None) -> int:
    """Profile, print, and with ``--out`` put the tables into the report."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.hotspots", description="cProfile of flowdrop_local's hot paths."
    )
    parser.add_argument("--size", type=int, default=10_000, help="pre-filled messages (10000)")
    parser.add_argument("--ops", type=int, default=2_000, help="profiled appends and reads (2000)")
    parser.add_argument("--import-size", type=int, default=20_000, help="batch import (20000)")
    parser.add_argument("--top", type=int, default=15, help="functions shown per workload (15)")
    parser.add_argument("--out", help="report to update with a profile section (none)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flowdrop-profile-") as tmp:
        tables = run(args, Path(tmp))
    command = "python -m benchmarks.hotspots" + "".join(
        f" {a}" for a in (sys.argv[1:] if argv is None else argv)
    )
    parts = [
        "## Where flowdrop_local spends its time (cProfile)",
        "",
        f"`{command}`: durability normal, {args.size:,} messages pre-filled. Per-operation "
        "figures include cProfile's own overhead, so compare rows, not with the tables above. "
        "Import figures are per message.",
        "",
    ]
    for title, table in tables.items():
        print(f"\n== {title}\n{table}")
        parts += [f"### {title}", "", "```", table, "```", ""]
    if args.out:
        report.write_section(Path(args.out), "hotspots", "\n".join(parts))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

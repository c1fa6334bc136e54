"""How a buffer's message count (MEM-14) is kept: ``python -m benchmarks.count_strategies``.

Schema version 3 chose the count from the options issue 11 named; this measures
them at the SQL level (the same Python around each, WAL + NORMAL, messages
clustered on (buffer_id, position) with a 16-byte id index), with one writer and
with four writer processes appending to one buffer, after 100 and 100,000
messages:

* ``counter row``: version 2's way, ``UPDATE buffers SET n = n + 1`` per append
  (one more B-tree page written per append);
* ``tally on the row``: version 3's, the count stored on the row the append
  inserts (the last row's tally is the count); a writer reads the last row
  only when another process committed meanwhile (``PRAGMA data_version``), as
  the library's tail cache does;
* ``recount``: ``count(*)`` of the buffer after each append: no write at all,
  but its cost grows with the buffer (not allowed; shown for scale).

Prints the median time per append and the appends per second of all writers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from flowdrop_local.positions import key_between

_SCHEMA = """
CREATE TABLE buffers (id INTEGER PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0);
CREATE TABLE messages (
    buffer_id INTEGER NOT NULL, position TEXT NOT NULL, id BLOB NOT NULL UNIQUE,
    role TEXT NOT NULL, content TEXT NOT NULL, metadata TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL, tally INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (buffer_id, position)) STRICT, WITHOUT ROWID;
INSERT INTO buffers (id) VALUES (1);
"""
_CONTENT = "The quick brown fox jumps over the lazy dog while the agent plans its next call. " * 2
_INSERT = (
    "INSERT INTO messages (buffer_id, position, id, role, content, created_at, tally) "
    "VALUES (1, ?, ?, 'user', ?, '2026-12-01T00:00:00.000Z', ?)"
)
_LAST = "SELECT position, tally FROM messages WHERE buffer_id = 1 ORDER BY position DESC LIMIT 1"
STRATEGIES = ("counter row", "tally on the row", "recount")


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _prepare(path: Path, size: int) -> None:
    conn = _connect(path)
    conn.executescript(_SCHEMA)
    position = None
    rows = []
    for i in range(size):
        position = key_between(position, None)
        rows.append((position, uuid.uuid4().bytes, _CONTENT, i + 1))
    conn.execute("BEGIN")
    conn.executemany(_INSERT, rows)
    conn.execute("UPDATE buffers SET n = ?", (size,))
    conn.execute("COMMIT")
    conn.close()


def _writer(path: str, strategy: str, count: int, start: float, out: list[float]) -> None:
    conn = _connect(Path(path))
    cached: tuple[str, int] | None = None
    version = -1
    while time.time() < start:
        time.sleep(0.001)
    times = []
    for _ in range(count):
        began = time.perf_counter_ns()
        conn.execute("BEGIN IMMEDIATE")
        seen = conn.execute("PRAGMA data_version").fetchone()[0]
        if cached is None or seen != version:  # another process committed: read again
            cached = conn.execute(_LAST).fetchone()
        assert cached is not None
        position = key_between(cached[0], None)
        tally = cached[1] + 1
        conn.execute(_INSERT, (position, uuid.uuid4().bytes, _CONTENT, tally))
        if strategy == "counter row":
            conn.execute("UPDATE buffers SET n = n + 1 WHERE id = 1")
        elif strategy == "recount":
            conn.execute("SELECT count(*) FROM messages WHERE buffer_id = 1").fetchone()
        conn.execute("COMMIT")
        version = seen
        cached = (position, tally)
        times.append(time.perf_counter_ns() - began)
    out.extend(times)
    conn.close()


def _run(strategy: str, size: int, writers: int, count: int, folder: Path) -> tuple[float, float]:
    path = folder / f"{strategy.replace(' ', '-')}-{size}-{writers}.db"
    _prepare(path, size)
    with multiprocessing.Manager() as manager:
        out = manager.list()
        start = time.time() + 0.3
        processes = [
            multiprocessing.Process(target=_writer, args=(str(path), strategy, count, start, out))
            for _ in range(writers)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join()
        elapsed = time.time() - start
        times = list(out)
    return statistics.median(times) / 1e3, writers * count / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="appends per writer")
    parser.add_argument("--sizes", default="100,100000")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print("| strategy | messages | writers | median per append | appends/s, all writers |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="flowdrop-counts-") as tmp:
        for size in sizes:
            for writers in (1, 4):
                for strategy in STRATEGIES:
                    median, rate = _run(strategy, size, writers, args.count, Path(tmp))
                    print(
                        f"| {strategy} | {size:,} | {writers} | {median:.1f} µs | {rate:,.0f} |",
                        flush=True,
                    )
    print(f"\n{os.cpu_count()} CPUs; `python -m benchmarks.count_strategies` (SQL level).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Append latency by kind of message: ``python -m benchmarks.append_kinds``.

An agent appends one message at a time to a buffer that already holds H: the
cycle of issue 19 (user, assistant, user, assistant, user, an assistant turn
declaring a call, its tool result, assistant), then a call left unanswered, the
user turn that heals it, and the late result that replaces the placeholder
(MEM-10). Each append is timed alone and filed under its kind:

* plain: a user or assistant turn without tool data;
* declaring turn: an assistant turn declaring a call;
* tool result: the result answering the call just declared;
* healing user turn: a user turn that heals one unanswered call (MEM-3);
* late result: the real result replacing that placeholder (MEM-10).

Beside each, the floor: raw ``sqlite3`` (or raw psycopg) inserting the same
message as a JSON row and committing, on a table of the same length, in the same
run. Medians, p95 and p99 (nearest rank) per kind and size, and the growth from
the smallest to the largest size (p99 over p99) next to raw's. Both backends run
at their defaults (SQLite: WAL, synchronous NORMAL; PostgreSQL: fsync on).
Prints the tables; ``--out benchmarks/RESULTS.md`` writes them into the report.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flowdrop_local import Buffer, Store

from . import report
from .core import declaring_turn, fmt_ns, message

KINDS = ("plain", "declaring turn", "tool result", "healing user turn", "late result")
_TEXT = "the agent weighs the request against the history and writes its reply " * 3
_ADDRESS = ("user", "u-1", "agent")
_RAW_PG_INSERT = "INSERT INTO messages (session, body) VALUES ('b', %s)"


def _cycle(n: int) -> list[tuple[str, dict[str, Any]]]:
    """One round of appends, each with its kind (call ids unique to round ``n``)."""
    call, late = f"call_r{n}", f"call_l{n}"
    text = f"[round {n}] {_TEXT}"
    return [
        ("plain", {"role": "user", "content": text}),
        ("plain", {"role": "assistant", "content": text}),
        ("plain", {"role": "user", "content": text}),
        ("plain", {"role": "assistant", "content": text}),
        ("plain", {"role": "user", "content": text}),
        ("declaring turn", declaring_turn([call])),
        ("tool result", {"role": "tool", "tool_call_id": call, "content": text}),
        ("plain", {"role": "assistant", "content": text}),
        ("untimed", declaring_turn([late])),
        ("healing user turn", {"role": "user", "content": text}),
        ("late result", {"role": "tool", "tool_call_id": late, "content": text}),
    ]


def _history(n: int) -> Iterator[list[dict[str, Any]]]:
    """The first ``n`` messages of the corpus (benchmarks.core.message), in batches."""
    for start in range(0, n, 5000):
        batch = [message(i) for i in range(start, min(n, start + 5000))]
        if start + 5000 >= n and batch and batch[-1].get("tool_calls"):
            batch[-1] = {"role": "assistant", "content": "[the call was never made]"}
        yield batch


def _pct(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


# ----------------------------------------------------------------- the systems


class _Raw:
    """The floor: one INSERT of the message as JSON, committed, per append."""

    def __init__(self, insert: Callable[[str], None]) -> None:
        self._insert = insert

    def append(self, msg: dict[str, Any]) -> int:
        insert = self._insert
        started = time.perf_counter_ns()
        insert(json.dumps(msg))
        return time.perf_counter_ns() - started


def _timed(buffer: Buffer) -> Callable[[dict[str, Any]], int]:
    """flowdrop_local's append of one message, timed (the nanoseconds it took)."""

    def append(msg: dict[str, Any]) -> int:
        started = time.perf_counter_ns()
        buffer.append(msg)
        return time.perf_counter_ns() - started

    return append


@contextlib.contextmanager
def _sqlite(folder: Path, size: int) -> Iterator[tuple[Callable[[dict[str, Any]], int], _Raw]]:
    store = Store(folder / f"ours-{size}.db")
    buffer = store.buffer(*_ADDRESS)
    for batch in _history(size):
        buffer.append(batch)
    raw_conn = sqlite3.connect(folder / f"raw-{size}.db", isolation_level=None)
    raw_conn.execute("PRAGMA journal_mode = WAL")
    raw_conn.execute("PRAGMA synchronous = NORMAL")
    raw_conn.execute(
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, buffer TEXT NOT NULL, body TEXT NOT NULL)"
    )
    raw_conn.execute("CREATE INDEX messages_buffer ON messages (buffer, id)")
    raw_conn.execute("BEGIN")
    for batch in _history(size):
        raw_conn.executemany(
            "INSERT INTO messages (buffer, body) VALUES ('b', ?)", [(json.dumps(m),) for m in batch]
        )
    raw_conn.execute("COMMIT")

    def raw_insert(body: str) -> None:
        raw_conn.execute("BEGIN")
        raw_conn.execute("INSERT INTO messages (buffer, body) VALUES ('b', ?)", (body,))
        raw_conn.execute("COMMIT")

    try:
        yield _timed(buffer), _Raw(raw_insert)
    finally:
        store.close()
        raw_conn.close()


@contextlib.contextmanager
def _postgresql(url: str, size: int) -> Iterator[tuple[Callable[[dict[str, Any]], int], _Raw]]:
    import psycopg

    from .server import create_schema

    ours_url = create_schema(url, f"kinds_ours_{size}")
    raw_url = create_schema(url, f"kinds_raw_{size}")
    store = Store(ours_url)
    buffer = store.buffer(*_ADDRESS)
    for batch in _history(size):
        buffer.append(batch)
    with psycopg.connect(ours_url, autocommit=True) as conn:
        conn.execute("ANALYZE")  # as autovacuum would after a load this size
    raw_conn = psycopg.connect(raw_url, autocommit=True)
    raw_conn.execute(
        "CREATE TABLE messages (id bigserial PRIMARY KEY, session text NOT NULL, "
        "body text NOT NULL)"
    )
    raw_conn.execute("CREATE INDEX messages_session ON messages (session, id)")
    with raw_conn.cursor().copy("COPY messages (session, body) FROM STDIN") as copy:
        for batch in _history(size):
            for m in batch:
                copy.write_row(("b", json.dumps(m)))
    raw_conn.execute("ANALYZE messages")
    cursor = raw_conn.cursor()

    def raw_insert(body: str) -> None:
        cursor.execute(
            "INSERT INTO messages (session, body) VALUES ('b', %s)", (body,), prepare=True
        )

    try:
        yield _timed(buffer), _Raw(raw_insert)
    finally:
        store.close()
        raw_conn.close()


# ------------------------------------------------------------------- running


def measure(
    system: contextlib.AbstractContextManager[tuple[Callable[[dict[str, Any]], int], _Raw]],
    rounds: int,
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Per kind, the times of flowdrop_local's appends and of raw's (same messages)."""
    ours_times: dict[str, list[int]] = {kind: [] for kind in KINDS}
    raw_times: dict[str, list[int]] = {kind: [] for kind in KINDS}
    with system as (ours, raw):
        for warm in _cycle(-1):  # one untimed round
            ours(warm[1])
            raw.append(warm[1])
        for n in range(rounds):
            for kind, msg in _cycle(n):
                elapsed = ours(msg)
                raw_elapsed = raw.append(msg)
                if kind != "untimed":
                    ours_times[kind].append(elapsed)
                    raw_times[kind].append(raw_elapsed)
    return ours_times, raw_times


def render(
    backend: str,
    raw_label: str,
    results: dict[int, tuple[dict[str, list[int]], dict[str, list[int]]]],
) -> list[str]:
    sizes = sorted(results)
    first, last = sizes[0], sizes[-1]
    lines = [
        f"### {backend}",
        "",
        f"| kind | messages | n | median | p95 | p99 | over 2 ms | {raw_label} median | "
        f"{raw_label} p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        for size in sizes:
            ours, raw = results[size][0][kind], results[size][1][kind]
            lines.append(
                f"| {kind} | {size:,} | {len(ours)} | {fmt_ns(statistics.median(ours))} | "
                f"{fmt_ns(_pct(ours, 0.95))} | {fmt_ns(_pct(ours, 0.99))} | "
                f"{sum(t > 2_000_000 for t in ours)} | {fmt_ns(statistics.median(raw))} | "
                f"{fmt_ns(_pct(raw, 0.99))} |"
            )
    lines += [
        "",
        f"Growth from {first:,} to {last:,} messages (the value at {last:,} over the value "
        f"at {first:,}):",
        "",
        f"| kind | median | p95 | p99 | {raw_label} median | {raw_label} p99 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        a, b = results[first][0][kind], results[last][0][kind]
        ra, rb = results[first][1][kind], results[last][1][kind]
        lines.append(
            f"| {kind} | {statistics.median(b) / statistics.median(a):.2f}x | "
            f"{_pct(b, 0.95) / _pct(a, 0.95):.2f}x | {_pct(b, 0.99) / _pct(a, 0.99):.2f}x | "
            f"{statistics.median(rb) / statistics.median(ra):.2f}x | "
            f"{_pct(rb, 0.99) / _pct(ra, 0.99):.2f}x |"
        )
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.append_kinds", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", default="100,10000,100000,1000000")
    parser.add_argument("--rounds", type=int, default=200, help="cycles per size (11 appends)")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--out", help="report to update (e.g. benchmarks/RESULTS.md)")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    command = "python -m benchmarks.append_kinds" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
    )
    started = time.monotonic()
    lines = [
        "## Append latency by kind of message",
        "",
        f"`{command}`",
        "",
        *report.machine(),
        "",
        "One append at a time onto a buffer of H messages (an agent's history: a call "
        "declared and answered every four messages), in rounds of the cycle user, "
        "assistant, user, assistant, user, declaring turn, tool result, assistant, then "
        "an unanswered call (untimed), the user turn that heals it and the late result "
        "that replaces its placeholder. Raw inserts the same message as a JSON row into "
        "a table of the same length, in the same run, alternating with flowdrop_local. "
        "p95 and p99 are nearest-rank; 'over 2 ms' counts appends slower than 2 ms.",
        "",
    ]
    backends = args.backends.split(",")
    if "sqlite" in backends:
        results = {}
        with tempfile.TemporaryDirectory(prefix="flowdrop-kinds-") as tmp:
            for size in sizes:
                results[size] = measure(_sqlite(Path(tmp), size), args.rounds)
                print(f"sqlite {size:,} done", file=sys.stderr, flush=True)
        part = render("SQLite (WAL, synchronous NORMAL)", "raw sqlite3", results)
        print("\n".join(part), flush=True)
        lines += part
    if "postgresql" in backends:
        from .server import server

        results = {}
        with server() as url:
            for size in sizes:
                results[size] = measure(_postgresql(url, size), args.rounds)
                print(f"postgresql {size:,} done", file=sys.stderr, flush=True)
        part = render("PostgreSQL (fsync on, Unix socket)", "raw psycopg", results)
        print("\n".join(part), flush=True)
        lines += part
    lines.append(f"The run took {(time.monotonic() - started) / 60:.1f} min.")
    if args.out:
        report.write_section(Path(args.out), "append_kinds", "\n".join(lines).rstrip() + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

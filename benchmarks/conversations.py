"""Conversation listing and fork: ``python -m benchmarks.conversations``.

* ``listing``: one page (50 conversations, most recently updated first) of
  ``Store.conversations`` at 1,000, 10,000 and 100,000 buffers: the first page
  and a page deep in the listing (after a cursor half way), median and p95 of
  200 reads each. A keyset page over the ``buffers_recent`` index should cost
  the same at every size.
* ``fork``: ``Buffer.fork`` at message 50,000 of a 100,000-message buffer (one
  call in ten declares a tool call, answered by the next message), against a raw
  ``INSERT ... SELECT`` that copies the same message and ledger rows with new ids
  in one transaction (the floor the fork is measured against; target <= 2x).

The buffers of the listing are written with SQL in bulk (a row and one message
each), so the set-up does not dominate; the fork's buffer is appended through the
library. SQLite files in a temporary folder; numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from flowdrop_local import Store


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.95) - 1]


def _fill_buffers(store: Store, n: int) -> None:
    """n buffers, each with one message, updated_at one second apart (bulk SQL)."""
    conn = store.db.conn
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO buffers (scope, scope_id, key, title, updated_at) VALUES (?, ?, ?, ?, "
        "strftime('%Y-%m-%dT%H:%M:%fZ', 1700000000 + ?, 'unixepoch'))",
        ((f"s{i % 4}", f"user{i % 1000}", f"c{i}", f"Conversation {i}", i) for i in range(n)),
    )
    conn.execute(
        "INSERT INTO messages (buffer_id, position, id, role, content, tally) "
        "SELECT id, 'a0', flowdrop_new_id(), 'user', 'hello', 1 FROM buffers"
    )
    conn.execute("COMMIT")


def listing(sizes: list[int], runs: int) -> None:
    print(f"listing: one page of 50, {runs} reads each (ms)")
    columns = ("buffers", "first median", "first p95", "deep median", "deep p95")
    print(" ".join(f"{name:>13}" for name in columns))
    for n in sizes:
        with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "list.db") as store:
            _fill_buffers(store, n)
            cursor = store.conversations(limit=n // 2).next
            first, deep = [], []
            for _ in range(runs):
                started = time.perf_counter()
                store.conversations(limit=50)
                first.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                got = store.conversations(limit=50, after=cursor)
                deep.append((time.perf_counter() - started) * 1000)
            assert len(got.items) == 50
            (fm, fp), (dm, dp) = _percentiles(first), _percentiles(deep)
            print(" ".join([f"{n:>13,}", *(f"{v:>13.3f}" for v in (fm, fp, dm, dp))]))


def _history(store: Store, n: int) -> list[str]:
    """Append n messages (a call every ten, answered by the next), 1,000 per append."""
    buf = store.buffer("chat", "u", "long")
    batch = []
    for i in range(n):
        if i % 10 == 8:
            batch.append(
                {
                    "role": "assistant",
                    "content": "",
                    "metadata": {"tool_calls": [{"tool_call_id": f"c{i}", "name": "f"}]},
                }
            )
        elif i % 10 == 9:
            batch.append(
                {"role": "tool", "content": "result", "metadata": {"tool_call_id": f"c{i - 1}"}}
            )
        else:
            batch.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"})
        if len(batch) == 1000:
            buf.append(batch)
            batch = []
    if batch:
        buf.append(batch)
    return [m.id for m in buf.messages()]


_RAW_MESSAGES = (
    "INSERT INTO messages (buffer_id, position, id, role, content, content_parts, metadata, "
    "created_at, tally) SELECT ?1, position, flowdrop_new_id(), role, content, content_parts, "
    "metadata, created_at, tally FROM messages WHERE buffer_id = ?2 AND position <= ?3"
)
_RAW_LEDGER = (
    "INSERT INTO tool_calls (buffer_id, call_id, declared_by, ordinal, answered_by) "
    "SELECT ?1, t.call_id, nd.id, t.ordinal, na.id FROM tool_calls AS t "
    "JOIN messages AS od ON od.id = t.declared_by "
    "JOIN messages AS nd ON nd.buffer_id = ?1 AND nd.position = od.position "
    "LEFT JOIN messages AS oa ON oa.id = t.answered_by "
    "LEFT JOIN messages AS na ON na.buffer_id = ?1 AND na.position = oa.position "
    "WHERE t.buffer_id = ?2 AND od.position <= ?3"
)


def fork(n: int, at: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "fork.db") as store:
        started = time.perf_counter()
        ids = _history(store, n)
        print(f"fork: {n:,} messages appended in {time.perf_counter() - started:.1f} s")
        source = store.buffer("chat", "u", "long")
        conn = store.db.conn
        source_id, cut = conn.execute(
            "SELECT buffer_id, position FROM messages WHERE id = id_blob(?)", (ids[at - 1],)
        ).fetchone()
        forks, raws = [], []
        for run in range(runs):
            started = time.perf_counter()
            target = source.fork(at=ids[at - 1], to=("chat", "u", f"fork{run}"))
            forks.append(time.perf_counter() - started)
            assert len(target) == at
            target.delete()
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO buffers (scope, scope_id, key) VALUES ('raw', 'u', ?)", (str(run),)
            )
            raw_id = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
            conn.execute(_RAW_MESSAGES, (raw_id, source_id, cut))
            conn.execute(_RAW_LEDGER, (raw_id, source_id, cut))
            conn.execute("COMMIT")
            raws.append(time.perf_counter() - started)
            store.buffer("raw", "u", str(run)).delete()
        fork_s, raw_s = statistics.median(forks), statistics.median(raws)
        print(
            f"fork at message {at:,} of {n:,}: median {fork_s * 1000:.0f} ms over {runs} runs; "
            f"raw INSERT ... SELECT {raw_s * 1000:.0f} ms; ratio {fork_s / raw_s:.2f}x"
        )
        assert store.check() == []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--fork-runs", type=int, default=5)
    args = parser.parse_args()
    listing([int(s) for s in args.sizes.split(",")], args.runs)
    fork(args.messages, args.messages // 2, args.fork_runs)


if __name__ == "__main__":
    main()

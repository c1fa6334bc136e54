"""Search latency and the append cost of the index: ``python -m benchmarks.search``.

* ``latency``: ``Store.search`` over 100,000 and 1,000,000 messages (buffers of
  100; each message 12 words drawn from a 5,000-word vocabulary with a Zipf-like
  skew, so some words are common and most are rare): a rare word, a common word
  and two words together, 100 searches each (a fresh word each time), limit 20;
  median and p95. Also the time ``enable_search`` takes to index them.
* ``append cost``: 2,000 single-message appends (12 words each) to one store
  with search enabled and one without, interleaved in rounds of 100 in the same
  run; the ratio of the medians per append.

SQLite files in a temporary folder; numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from flowdrop_local import Store

_VOCABULARY = [f"w{i}" for i in range(5000)]
_WEIGHTS = [1 / (i + 1) for i in range(5000)]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choices(_VOCABULARY, _WEIGHTS, k=12))


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.95) - 1]


def latency(n: int, runs: int) -> None:
    rng = random.Random(n)
    with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "search.db") as store:
        started = time.perf_counter()
        for b in range(n // 100):
            store.buffer("chat", f"u{b % 50}", f"c{b}").append(
                [
                    {"role": "user" if i % 2 else "assistant", "content": _text(rng)}
                    for i in range(100)
                ]
            )
        filled = time.perf_counter() - started
        started = time.perf_counter()
        store.enable_search()
        built = time.perf_counter() - started
        print(f"{n:,} messages: appended in {filled:.1f} s, enable_search took {built:.1f} s")
        queries = {
            "rare word": lambda: rng.choice(_VOCABULARY[3000:]),
            "common word": lambda: rng.choice(_VOCABULARY[:5]),
            "two words": lambda: (
                f"{rng.choice(_VOCABULARY[:50])} {rng.choice(_VOCABULARY[50:500])}"
            ),
        }
        for name, make in queries.items():
            samples = []
            hits = 0
            for _ in range(runs):
                query = make()
                started = time.perf_counter()
                hits += len(store.search(query, limit=20))
                samples.append((time.perf_counter() - started) * 1000)
            median, p95 = _percentiles(samples)
            print(
                f"  {name:<12} median {median:8.2f} ms  p95 {p95:8.2f} ms  "
                f"({hits / runs:.1f} hits per search)"
            )


def append_cost(appends: int) -> None:
    rng = random.Random(7)
    with (
        tempfile.TemporaryDirectory() as folder,
        Store(Path(folder) / "on.db") as on,
        Store(Path(folder) / "off.db") as off,
    ):
        on.enable_search()
        buffers = {"on": on.buffer("chat", "u", "k"), "off": off.buffer("chat", "u", "k")}
        times: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(appends // 100):
            for name, buf in buffers.items():
                for _ in range(100):
                    message = {"role": "user", "content": _text(rng)}
                    started = time.perf_counter()
                    buf.append(message)
                    times[name].append((time.perf_counter() - started) * 1_000_000)
        on_median, off_median = statistics.median(times["on"]), statistics.median(times["off"])
        print(
            f"append cost: {off_median:.0f} us without search, {on_median:.0f} us with it: "
            f"ratio {on_median / off_median:.2f}x (median of {appends:,} single appends each)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--appends", type=int, default=2000)
    args = parser.parse_args()
    append_cost(args.appends)
    for size in args.sizes.split(","):
        latency(int(size), args.runs)


if __name__ == "__main__":
    main()

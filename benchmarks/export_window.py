"""Time and peak memory of a windowed export on a long buffer.

``python -m benchmarks.export_window [N]``: builds a buffer of ``N`` messages
(default 200,000: user, assistant with a call, its result, assistant text) in a
temporary file, then times ``to_openai_chat(limit=20)`` (median of 5) and measures
its peak memory with ``tracemalloc``. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from flowdrop_local import Store


def build(store: Store, n: int) -> None:
    buf = store.buffer("session", "bench", "chat")
    batch = []
    for i in range(n // 4):
        batch += [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "tool_calls": [{"id": f"c{i}", "name": "f", "arguments": "{}"}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i}"},
            {"role": "assistant", "content": f"answer {i}"},
        ]
        if len(batch) >= 20_000:
            buf.append(batch)
            batch = []
    if batch:
        buf.append(batch)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.db"
        with Store(path) as store:
            build(store, n)
        with Store(path) as store:
            buf = store.buffer("session", "bench", "chat")
            times = []
            for _ in range(5):
                started = time.perf_counter()
                payload = buf.to_openai_chat(limit=20)
                times.append(time.perf_counter() - started)
            tracemalloc.start()
            buf.to_openai_chat(limit=20)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    print(
        f"to_openai_chat(limit=20) at {n:,} messages: {len(payload)} messages out, "
        f"median {statistics.median(times) * 1000:.2f} ms, peak {peak / 2**20:.2f} MiB"
    )


if __name__ == "__main__":
    main()

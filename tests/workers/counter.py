"""A child process that appends plain messages and prints the count each append reports.

    python -m tests.workers.counter DB TAG COUNT

Waits for ``DB.go`` so that every writer starts together (MEM-14 under contention).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from flowdrop_local import Store


def main() -> None:
    path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Store(path) as store:
        buffer = store.buffer("session", "shared", "chat")
        buffer.read(limit=1)  # the schema is read: ready
        print("ready", flush=True)
        go = Path(path + ".go")
        while not go.exists():
            time.sleep(0.005)
        for i in range(count):
            result = buffer.append({"role": "user" if i % 2 else "assistant", "content": tag})
            print(result.count, flush=True)


if __name__ == "__main__":
    main()

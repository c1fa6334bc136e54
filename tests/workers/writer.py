"""A child process for the concurrency tests: STEPS appends of (assistant call, user turn).

    python -m tests.workers.writer DB TAG STEPS

Waits for a start file (DB + ".go") so that all writers begin together.
"""

from __future__ import annotations

import os
import sys
import time

from flowdrop_local import Store


def main() -> None:
    path, tag, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Store(path, lock_warning_after=0.5) as store:
        buffer = store.buffer("session", "shared", "chat")
        while not os.path.exists(path + ".go"):
            time.sleep(0.001)
        for i in range(steps):
            buffer.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": f"{tag}-{i}", "name": "f"}],
                }
            )
            buffer.append({"role": "user", "content": f"{tag}-{i}"})


if __name__ == "__main__":
    main()

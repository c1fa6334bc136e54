"""A child process that appends in a loop and reports each append that returned.

    python -m tests.workers.appender DB TAG COUNT [DURABILITY]

Each step appends an assistant turn declaring call ``TAG-i`` (never answered),
then a user turn ``TAG-i``, which heals the call. After each append returns, a
line ``a i`` or ``u i`` is printed and flushed: the parent kills this process at
random and then checks that every reported append is in the file.
"""

from __future__ import annotations

import sys

from flowdrop_local import Store


def main() -> None:
    path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    durability = sys.argv[4] if len(sys.argv) > 4 else "normal"
    with Store(path, durability=durability) as store:  # type: ignore[arg-type]
        buffer = store.buffer("session", "crash", "chat")
        print("ready", flush=True)
        for i in range(count):
            buffer.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": f"{tag}-{i}", "name": "f"}],
                }
            )
            print(f"a {i}", flush=True)
            # This heals the call (unless a concurrent writer's user turn did first).
            buffer.append({"role": "user", "content": f"{tag}-{i}"})
            print(f"u {i}", flush=True)


if __name__ == "__main__":
    main()

"""A device with its own clock, for the sync tests whose clocks jump.

    LD_PRELOAD=libfaketime.so.1 FAKETIME_TIMESTAMP_FILE=F FAKETIME_NO_CACHE=1 \\
        python -m tests.workers.clocked

The test moves this process's clock (Python's and SQLite's alike) by writing an
offset such as ``-7200`` to F. Commands arrive as JSON lines on stdin; each answer is
one JSON line on stdout: ``{"ok": result}`` or ``{"error": "Type: message"}``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from flowdrop_local import Store, sync


def _contents(store: Store) -> dict[str, Any]:
    """What two replicas must agree on: every buffer's messages in order, each
    conversation's title, every memory value."""
    buffers = {}
    for info in store.conversations(limit=1_000).items:
        buffer = store.buffer(info.scope, info.scope_id, info.key)
        buffers["/".join((info.scope, info.scope_id, info.key))] = {
            "title": info.title,
            "messages": [(m.id, m.role, m.content, m.tool_call_id) for m in buffer.messages()],
        }
    with store.backend.read() as tx:
        memory = {"/".join(map(str, row[:3])): row[3] for row in tx.all("export_memory")}
    return {"buffers": buffers, "memory": memory}


def run(command: dict[str, Any]) -> Any:
    op = command["op"]
    if op == "time":
        return time.time()
    if op == "sync":
        with Store(command["a"]) as a, Store(command["b"]) as b:
            report = sync(a, b, full=command.get("full", False))
            return {"moved": report.moved, "buffers_compared": report.buffers_compared}
    with Store(command["db"]) as store:
        if op == "contents":
            return _contents(store)
        if op == "check":
            return [str(v) for v in store.check()]
        if op == "memory_set":
            return store.memory_set(None, "global", command["key"], command["value"]).ok
        if op == "memory_delete":
            return store.memory_delete(None, "global", command["key"]).ok
        buffer = store.buffer("global", "", command["key"])
        if op == "append":
            return buffer.append(command["messages"]).appended
        if op == "pop":
            return buffer.pop() is not None
        if op == "title":
            return buffer.set_title(command["title"]).title
        if op == "delete":
            return buffer.delete()
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        try:
            answer: dict[str, Any] = {"ok": run(json.loads(line))}
        except Exception as error:  # the test reads what went wrong
            answer = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()

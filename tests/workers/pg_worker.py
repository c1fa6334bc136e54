"""Child processes for the PostgreSQL process tests (tests/test_postgresql_processes.py).

    python -m tests.workers.pg_worker MODE URL ...

Every mode opens ``Store(URL)``, prints ``ready`` and then one line per append
that returned (flushed at once), so that the parent knows what to find even if
it kills this process or stops the server.

``steps URL TAG STEPS GO``
    Waits for the file GO, then STEPS times: an assistant turn declaring call
    ``TAG-i``, then a user turn ``TAG-i`` (which heals any open call), on the
    buffer session/shared/chat.
``append URL KEY COUNT WARN_AFTER``
    COUNT user turns ``KEY-i`` on the buffer s//KEY, with
    ``lock_warning_after=WARN_AFTER``; logging goes to stderr.
``hold URL KEY GO``
    One user turn on s//KEY that stops inside its transaction, after the
    buffer's row lock was taken, prints ``holding`` and waits for the file GO
    before it goes on and commits.
``hold_drive URL SESSION GO``
    As ``hold``, for a turn alice drives into her session SESSION through the
    sessions API (the decision is taken before the pause).
``survive URL TAG``
    The steps of ``steps`` without end, on session/crash/chat. An append that
    raises prints ``x F ErrorType`` (``x - ErrorType`` if it is not a
    FlowdropError) and the loop goes on with the next step, so
    the process lives through a server restart.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import flowdrop_local.engine
from flowdrop_local import FlowdropError, Principal, Store


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.001)


def _call(tag: str, i: int) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": f"{tag}-{i}", "name": "f"}]}


def steps(url: str, tag: str, count: int, go: str) -> None:
    with Store(url) as store:
        buffer = store.buffer("session", "shared", "chat")
        print("ready", flush=True)
        _wait_for(go)
        for i in range(count):
            buffer.append(_call(tag, i))
            print(f"a {i}", flush=True)
            buffer.append({"role": "user", "content": f"{tag}-{i}"})
            print(f"u {i}", flush=True)


def append(url: str, key: str, count: int, warn_after: float) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    with Store(url, lock_warning_after=warn_after) as store:
        buffer = store.buffer("s", "", key)
        print("ready", flush=True)
        for i in range(count):
            buffer.append({"role": "user", "content": f"{key}-{i}"})
            print(f"u {i}", flush=True)


def _pause_in_next_append(go: str) -> None:
    """Make the next append print ``holding`` and wait for ``go`` inside its transaction."""
    real = flowdrop_local.engine.key_between
    held = False

    def pausing(a: str | None, b: str | None) -> str:
        # The engine asks for the next position after the backend locked the row.
        nonlocal held
        if not held:
            held = True
            print("holding", flush=True)
            _wait_for(go)
        return real(a, b)

    flowdrop_local.engine.key_between = pausing


def hold(url: str, key: str, go: str) -> None:
    with Store(url) as store:
        buffer = store.buffer("s", "", key)
        print("ready", flush=True)
        _pause_in_next_append(go)
        buffer.append({"role": "user", "content": f"{key}-held"})
        print("u 0", flush=True)


def hold_drive(url: str, session_id: str, go: str) -> None:
    with Store(url) as store:
        sessions = store.sessions(Principal("alice"))
        print("ready", flush=True)
        _pause_in_next_append(go)
        sessions.drive(session_id, {"role": "user", "content": "sent"})
        print("u 0", flush=True)


def survive(url: str, tag: str) -> None:
    with Store(url) as store:
        buffer = store.buffer("session", "crash", "chat")
        print("ready", flush=True)
        i = 0
        while True:
            for kind, message in (
                ("a", _call(tag, i)),
                ("u", {"role": "user", "content": f"{tag}-{i}"}),
            ):
                try:
                    buffer.append(message)
                except Exception as error:  # the server is gone: say so, go on
                    ours = "F" if isinstance(error, FlowdropError) else "-"
                    name = f"{type(error).__module__}.{type(error).__qualname__}"
                    print(f"x {ours} {name}", flush=True)
                    time.sleep(0.05)
                    break
                print(f"{kind} {i}", flush=True)
            i += 1


def main() -> None:
    mode, url, *args = sys.argv[1:]
    if mode == "steps":
        steps(url, args[0], int(args[1]), args[2])
    elif mode == "append":
        append(url, args[0], int(args[1]), float(args[2]))
    elif mode == "hold":
        hold(url, args[0], args[1])
    elif mode == "hold_drive":
        hold_drive(url, args[0], args[1])
    elif mode == "survive":
        survive(url, args[0])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()

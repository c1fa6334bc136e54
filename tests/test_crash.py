"""Crash safety with real processes: SIGKILL at random moments, then reopen the file.

After every kill: SQLite's integrity check is ok, the store's invariant checker
finds nothing, and every append the child reported as returned is in the file.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowdrop_local import Store

ROOT = Path(__file__).resolve().parent.parent
KILLS = 50


def start_appender(db: Path, tag: str, durability: str = "normal") -> subprocess.Popen[str]:
    """Start tests.workers.appender on ``db`` and wait until it has opened the store."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.appender", str(db), tag, "1000000", durability],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def run_and_kill(db: Path, tag: str, delay: float, durability: str = "normal") -> list[str]:
    """Start the appender, SIGKILL it after ``delay`` seconds of appending; its report lines."""
    child = start_appender(db, tag, durability)
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    out, _ = child.communicate()
    assert child.returncode == -signal.SIGKILL
    return out.split("\n")


def verify(db: Path, reported: dict[str, list[str]]) -> int:
    """Integrity, invariants, and every reported append present; returns the message count."""
    with Store(db) as store:
        conn = store.backend.connection()
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert store.check() == []
        history = store.buffer("session", "crash", "chat").read()
    declared = {c["id"] for m in history for c in m["metadata"].get("tool_calls", [])}
    users = {m["content"] for m in history if m["role"] == "user"}
    answered = {m["metadata"]["tool_call_id"] for m in history if m["role"] == "tool"}
    for tag, lines in reported.items():
        for line in lines:
            if not line:
                continue
            kind, i = line.split()
            if kind == "a":
                assert f"{tag}-{i}" in declared, f"reported assistant {tag}-{i} is missing"
            else:
                assert f"{tag}-{i}" in users, f"reported user turn {tag}-{i} is missing"
                assert f"{tag}-{i}" in answered, f"call {tag}-{i} was not healed"
    return len(history)


@pytest.mark.timeout(600)
def test_fifty_sigkills_lose_nothing_and_leave_a_sound_file(tmp_path: Path) -> None:
    """50 children killed with SIGKILL mid-append: nothing reported is lost, the file is sound."""
    db = tmp_path / "crash.db"
    rng = random.Random(20261129)
    reported: dict[str, list[str]] = {}
    appends = 0
    for kill in range(KILLS):
        tag = f"k{kill}"
        durability = "full" if kill % 5 == 4 else "normal"
        reported[tag] = run_and_kill(db, tag, rng.uniform(0.01, 0.12), durability)
        appends += sum(1 for line in reported[tag] if line)
        verify(db, reported)
    assert appends > KILLS  # the children did append before they died

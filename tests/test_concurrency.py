"""MEM-12: concurrent appends queue, commit whole, and never fail; transactions always end."""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import flowdrop_local.engine
from flowdrop_local import Store, StoreClosed

ROOT = Path(__file__).resolve().parent.parent


def assert_every_call_healed_once(
    history: list[dict[str, Any]], tags: list[str], steps: int
) -> None:
    calls = [c["id"] for m in history for c in m["metadata"].get("tool_calls", [])]
    results = [m["metadata"]["tool_call_id"] for m in history if m["role"] == "tool"]
    users = [m["content"] for m in history if m["role"] == "user"]
    expected = sorted(f"{tag}-{i}" for tag in tags for i in range(steps))
    assert sorted(calls) == expected  # no turn lost, none doubled
    assert sorted(users) == expected
    assert sorted(results) == expected  # every call answered exactly once
    assert len(history) == 3 * len(expected)


@pytest.mark.timeout(300)
def test_processes_appending_to_one_buffer_lose_nothing(tmp_path: Path) -> None:
    """4 processes x 150 (call, user) appends to one buffer: 1,800 messages, all healed once."""
    db = tmp_path / "shared.db"
    Store(db).close()
    tags, steps = [f"p{i}" for i in range(4)], 150
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.workers.writer", str(db), tag, str(steps)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for tag in tags
    ]
    (tmp_path / "shared.db.go").touch()
    assert [child.wait(timeout=240) for child in children] == [0, 0, 0, 0]
    with Store(db) as store:
        assert store.check() == []
        assert_every_call_healed_once(store.buffer("session", "shared", "chat").read(), tags, steps)


def _count_race(db: Path) -> int:
    """4 processes x 500 appends to one buffer, started together; checks the counts and
    returns how often a process saw another's appends between two of its own."""
    Store(db).close()
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.workers.counter", str(db), f"p{i}", "500"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    Path(str(db) + ".go").touch()
    outputs = [child.communicate(timeout=240)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0, 0, 0]
    counts = sorted(int(line) for output in outputs for line in output.split())
    assert counts == list(range(1, 2001))
    interleaved = 0
    for output in outputs:  # each process saw its own counts grow, others' in between
        mine = [int(line) for line in output.split()]
        assert mine == sorted(mine)
        interleaved += sum(b - a > 1 for a, b in itertools.pairwise(mine))
    with Store(db) as store:
        assert len(store.buffer("session", "shared", "chat")) == 2000
        assert store.check() == []
    return interleaved


@pytest.mark.timeout(300)
def test_counts_reported_by_four_processes_are_exact(tmp_path: Path) -> None:
    """MEM-14 under contention: 4 processes x 500 appends to one buffer report the
    counts 1 to 2,000, each once (the count is the last row's tally: each append
    reads it fresh when another process committed, never a stale cached one).

    A writer that keeps the lock's turn may run all its appends alone; the race is
    run again (up to 5 times) until the writers did interleave at least once.
    """
    interleaved = 0
    for attempt in range(5):
        interleaved += _count_race(tmp_path / f"shared-{attempt}.db")
        if interleaved:
            break
    assert interleaved > 0, "the writers never ran at the same time"


@pytest.mark.parametrize("path", [":memory:", "file"])
def test_threads_sharing_one_store_lose_nothing(tmp_path: Path, path: str) -> None:
    """8 threads on one Store (":memory:" included: one database for all) heal each call once."""
    target = ":memory:" if path == ":memory:" else str(tmp_path / "threads.db")
    tags, steps = [f"t{i}" for i in range(8)], 40
    with Store(target) as store:
        buffer = store.buffer("session", "shared", "chat")
        errors: list[BaseException] = []

        def work(tag: str) -> None:
            try:
                for i in range(steps):
                    buffer.append({"role": "assistant", "tool_calls": [{"id": f"{tag}-{i}"}]})
                    store.buffer("session", "shared", "chat").append(
                        {"role": "user", "content": f"{tag}-{i}"}
                    )
            except BaseException as error:  # pragma: no cover - reported below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(tag,)) for tag in tags]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert store.check() == []
        assert_every_call_healed_once(buffer.read(), tags, steps)


def test_threads_with_their_own_stores_lose_nothing(tmp_path: Path) -> None:
    """4 threads each with its own Store (own connection) on one file."""
    db = str(tmp_path / "own.db")
    Store(db).close()
    tags, steps = [f"o{i}" for i in range(4)], 40

    def work(tag: str) -> None:
        with Store(db) as store:
            buffer = store.buffer("session", "shared", "chat")
            for i in range(steps):
                buffer.append({"role": "assistant", "tool_calls": [{"id": f"{tag}-{i}"}]})
                buffer.append({"role": "user", "content": f"{tag}-{i}"})

    threads = [threading.Thread(target=work, args=(tag,)) for tag in tags]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with Store(db) as store:
        assert store.check() == []
        assert_every_call_healed_once(store.buffer("session", "shared", "chat").read(), tags, steps)


def test_a_long_wait_warns_then_the_append_lands(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Held out past lock_warning_after, an append logs one warning, keeps waiting, and commits."""
    db = str(tmp_path / "wait.db")
    with Store(db, lock_warning_after=0.1) as store:
        buffer = store.buffer("s", "", "k")
        buffer.append({"role": "user", "content": "first"})
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        results: list[Any] = []
        with caplog.at_level(logging.WARNING, logger="flowdrop_local"):
            thread = threading.Thread(
                target=lambda: results.append(buffer.append({"role": "user", "content": "second"}))
            )
            thread.start()
            thread.join(0.6)
            assert thread.is_alive()  # still waiting, not failed
            blocker.execute("COMMIT")
            thread.join(5)
        assert not thread.is_alive()
        assert results[0].count == 2
        warnings = [r for r in caplog.records if "waited" in r.getMessage()]
        assert len(warnings) == 1
        assert [m["content"] for m in buffer.read()] == ["first", "second"]


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, RuntimeError])
def test_an_interrupted_append_rolls_back_and_releases_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    """An exception mid-batch (KeyboardInterrupt too) writes nothing and frees the lock."""
    db = str(tmp_path / "int.db")
    with Store(db) as store:
        buffer = store.buffer("s", "", "k")
        buffer.append({"role": "assistant", "tool_calls": [{"id": "c1"}]})
        calls = 0
        real = flowdrop_local.engine.key_between

        def failing(a: str | None, b: str | None) -> str:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise interrupt()
            return real(a, b)

        monkeypatch.setattr(flowdrop_local.engine, "key_between", failing)
        with pytest.raises(interrupt):
            buffer.append(
                [{"role": "user", "content": "heals c1"}, {"role": "assistant", "content": "x"}]
            )
        monkeypatch.undo()
        assert not store.backend.connection().in_transaction
        other = sqlite3.connect(db, isolation_level=None, timeout=0)
        other.execute("BEGIN IMMEDIATE")  # the write lock is free at once
        other.execute("ROLLBACK")
        assert [m["role"] for m in buffer.read()] == ["assistant"]
        assert buffer.append(
            {"role": "user", "content": "again"}
        ).healed_ids  # and the cache is right


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_dying_mid_append_leaves_no_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread killed by an exception inside append leaves the store usable by the others."""
    db = str(tmp_path / "die.db")
    with Store(db) as store:
        buffer = store.buffer("s", "", "k")

        def boom(*_: object) -> str:
            raise SystemExit("thread dies")

        monkeypatch.setattr(flowdrop_local.engine, "key_between", boom)
        thread = threading.Thread(target=buffer.append, args=({"role": "user", "content": "x"},))
        thread.start()
        thread.join()
        monkeypatch.undo()
        assert buffer.append({"role": "user", "content": "y"}).count == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_store_used_after_fork_fails_clearly(tmp_path: Path) -> None:
    """The child of a fork gets StoreClosed instead of sharing the parent's connection."""
    with Store(tmp_path / "fork.db") as store:
        buffer = store.buffer("s", "", "k")
        buffer.append({"role": "user", "content": "parent"})
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 3
            try:
                buffer.read()
            except StoreClosed as error:
                code = 0 if "os.fork" in str(error) else 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert buffer.read()[0]["content"] == "parent"  # the parent's store is unharmed

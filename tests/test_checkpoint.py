"""The WAL is checkpointed off the appends' commits, by a store's own thread: SQLite's
automatic checkpoint ran inside the commit that took the log past 1,000 pages, and
was every one of the slowest appends (benchmarks.append_tail)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from flowdrop_local import Buffer, Store
from flowdrop_local.backends import sqlite as sqlite_backend


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "flowdrop-checkpoint"]


def _append_24_mb(store: Store) -> Buffer:
    """6,000 appends of 4 KB, back to back: a writer that never pauses."""
    buf = store.buffer("global", "", "k")
    text = "x" * 4096
    for i in range(6000):
        buf.append({"role": "user", "content": f"{i} {text}"})
    return buf


def test_the_store_checkpoints_the_log_on_a_thread_of_its_own(tmp_path: Path) -> None:
    """The writer's automatic checkpoint is off, and the log stays bounded even when
    the writer never pauses: 6,000 appends of 4 KB back to back (about 140 MB of log
    with no checkpoint) leave a WAL of a few thousand pages, and no row is lost."""
    path = tmp_path / "chat.db"
    with Store(path) as store:
        conn = store.db.conn
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        buf = _append_24_mb(store)
        assert len(_checkpoint_threads()) >= 1
        wal = os.path.getsize(f"{path}-wal")
        assert wal < 40 * 1024 * 1024, f"the log grew to {wal:,} bytes"
        assert buf.count() == 6000
    assert _checkpoint_threads() == []  # close stops the thread
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT count(*) FROM messages").fetchone()[0] == 6000


def test_without_the_thread_the_log_would_grow(tmp_path: Path) -> None:
    """The bound above is the thread's doing: with it stopped, the same appends grow
    the log past it (so the test above can fail)."""
    path = tmp_path / "chat.db"
    with Store(path) as store:
        backend = store._backend
        assert isinstance(backend, sqlite_backend.SqliteBackend)
        assert backend._checkpointer is not None
        backend._checkpointer.stop()
        backend._checkpointer = None  # no thread, and no fallback: nothing checkpoints
        _append_24_mb(store)
        assert os.path.getsize(f"{path}-wal") > 100 * 1024 * 1024


def test_a_thread_starved_of_the_cpu_leaves_the_writer_to_bound_the_log(tmp_path: Path) -> None:
    """A thread that is alive but finishes no checkpoint (here it waits on its lock,
    as a thread on a loaded machine waits for the CPU) cannot report the log's
    length: the writer counts its own commits since the thread last finished one."""
    path = tmp_path / "chat.db"
    with Store(path) as store:
        backend = store._backend
        assert isinstance(backend, sqlite_backend.SqliteBackend)
        checkpointer = backend._checkpointer
        assert checkpointer is not None
        with checkpointer.running:  # the thread cannot start a checkpoint meanwhile
            _append_24_mb(store)
            assert checkpointer.done == 0
        assert os.path.getsize(f"{path}-wal") < 40 * 1024 * 1024


def test_a_store_whose_thread_is_gone_checkpoints_in_its_commits(tmp_path: Path) -> None:
    """A thread that stopped (or never got a connection) leaves the writer to do it,
    as SQLite would: the log stays bounded."""
    path = tmp_path / "chat.db"
    with Store(path) as store:
        backend = store._backend
        assert isinstance(backend, sqlite_backend.SqliteBackend)
        assert backend._checkpointer is not None
        backend._checkpointer.stop()
        _append_24_mb(store)
        assert os.path.getsize(f"{path}-wal") < 40 * 1024 * 1024


def test_a_store_that_is_not_a_writable_file_has_no_thread(tmp_path: Path) -> None:
    """``:memory:`` and read-only stores write no log: no thread, no extra connection."""
    before = len(_checkpoint_threads())
    with Store(":memory:") as store:
        for _ in range(300):
            store.buffer("global", "", "k").append({"role": "user", "content": "hi"})
    path = tmp_path / "chat.db"
    Store(path).close()
    with Store(path, read_only=True) as store:
        assert store.buffer("global", "", "k").read() == []
    time.sleep(0.05)
    assert len(_checkpoint_threads()) == before


def test_a_fork_while_checkpoints_run_leaves_a_child_that_can_use_sqlite(tmp_path: Path) -> None:
    """A fork waits for a checkpoint under way (the child would otherwise inherit
    SQLite's locks as the thread held them), and the child can open and write a
    store. Each fork comes right after the commit that asked for a checkpoint."""
    with Store(tmp_path / "parent.db") as store:
        buf = store.buffer("global", "", "k")
        text = "x" * 4096
        for n in range(10):
            for _ in range(sqlite_backend.CHECKPOINT_AFTER_COMMITS):
                buf.append({"role": "user", "content": text})
            pid = os.fork()
            if pid == 0:  # the child: a store of its own, written and read
                code = 1
                try:
                    with Store(tmp_path / f"child{n}.db") as child:
                        mine = child.buffer("global", "", "k")
                        for i in range(300):
                            mine.append({"role": "user", "content": str(i)})
                        code = 0 if mine.count() == 300 else 1
                finally:
                    os._exit(code)
            deadline = time.monotonic() + 30
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    raise AssertionError("a forked child hung")
                time.sleep(0.01)
            assert os.waitstatus_to_exitcode(status) == 0
        assert buf.count() == 10 * sqlite_backend.CHECKPOINT_AFTER_COMMITS

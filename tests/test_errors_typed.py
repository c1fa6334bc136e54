"""Errors a user can act on (issue 21 D): each failure has a typed error that says what
happened, and leaves the database as it was.

Real SQLite files, a real second process holding SQLite's write lock, and a real
PostgreSQL server (its row locks held by a second connection); no mocks.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import (
    AsyncStore,
    CorruptRow,
    InvalidArgument,
    LockTimeout,
    NotADatabase,
    Principal,
    ServerUnreachable,
    Store,
    TooLarge,
)
from flowdrop_local.backends.postgresql_dialect import redact

from .conftest import snapshot

USER = {"role": "user", "content": "hi"}

# ------------------------------------------------------------------ secrets


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        ("postgresql://app:hunter2@db/chat?sslpassword=keypass", ["hunter2", "keypass"]),
        ("postgresql://app@db/chat?sslmode=require&SSLPassword=keypass", ["keypass"]),
        ("postgresql://app@db/chat?%73slpassword=keypass", ["keypass"]),  # %73 is "s"
        ("postgresql://app@db/chat?oauth_client_secret=tok&password=pw", ["tok", "pw"]),
        ("postgresql://app:p@ss@w0rd@db/chat", ["p@ss@w0rd", "ss@", "w0rd"]),
    ],
    ids=["sslpassword", "sslpassword-case", "percent-encoded-name", "oauth", "raw-at"],
)
def test_redact_masks_every_secret_parameter_and_a_password_holding_at(
    url: str, secrets: list[str]
) -> None:
    shown = redact(url)
    assert all(secret not in shown for secret in secrets), shown
    assert "db/chat" in shown  # the rest is still there to read


# A password may hold any character a user can type: the userinfo ends at the last
# "@" before the host, and the password is whatever follows its first ":".
_PASSWORDS = [
    "Zm9v/YmFy+cXV4",  # base64: "/" and "+"
    "a/b/c",
    "p@ss/w@rd",
    "pa?ss",
    "pa#ss",
    "pa:ss",
    "pa%2Fss",
    "pa&ss=x",
    "/leading",
    "trailing/",
    "@/?#:",
]


@pytest.mark.parametrize("password", _PASSWORDS)
@pytest.mark.parametrize(
    "template",
    [
        "postgresql://app:{p}@127.0.0.1:5432/chat",
        "postgres://app:{p}@db/chat?sslmode=require",
        "postgresql://app:{p}@db/chat?application_name=a@b",
        "postgresql://ana@corp:{p}@db/chat",  # a raw "@" in the user name too
        "cannot connect to postgresql://app:{p}@db:5432/chat: the server is unreachable",
    ],
    ids=["url", "postgres-query", "at-in-query", "at-in-user", "in-a-message"],
)
def test_redact_masks_a_password_whatever_it_holds(template: str, password: str) -> None:
    url = template.format(p=password)
    shown = redact(url)
    assert password not in shown, shown
    for piece in re.split(r"[@/?#:&=]", password):
        if len(piece) > 3:
            assert piece not in shown, shown
    if "a@b" not in template:
        assert "db" in shown or "127.0.0.1" in shown, shown  # the host is still there


def test_a_password_holding_a_slash_is_in_no_connection_error() -> None:
    """libpq stops a URL's userinfo at the first "/": it reads ``app:Zm9v`` as host and
    port and quotes the pieces back; none of them is shown (sync, async, CLI)."""
    url = "postgresql://app:Zm9v/YmFy+cXV4@127.0.0.1:1/chat?connect_timeout=2"
    with pytest.raises(ServerUnreachable) as failed:
        Store(url)
    for text in (str(failed.value), repr(failed.value)):
        assert "Zm9v" not in text and "YmFy" not in text, text

    async def main() -> str:
        with pytest.raises(ServerUnreachable) as raised:
            await AsyncStore(url)
        return str(raised.value)

    text = asyncio.run(main())
    assert "Zm9v" not in text and "YmFy" not in text, text
    cli = subprocess.run(
        [sys.executable, "-m", "flowdrop_local.cli", "--db", url, "buffers"],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and "Zm9v" not in cli.stderr and "YmFy" not in cli.stderr, cli


def test_redact_leaves_a_url_without_a_password_alone() -> None:
    for url in (
        "postgresql://app@db/chat",
        "postgresql://db:5432/chat",
        "postgresql:///chat?host=/run/postgresql",
        "postgresql://app@db:5432/chat?application_name=x",
    ):
        assert redact(url) == url


def test_a_refused_connection_is_server_unreachable_without_any_secret() -> None:
    """Nothing listens on port 1: ServerUnreachable (not NotADatabase), saying so, and no
    piece of the password (one holding raw "@", which libpq splits) or sslpassword."""
    url = "postgresql://app:p@ss@127.0.0.1:1/chat?sslpassword=keypass&connect_timeout=2"
    started = time.monotonic()
    with pytest.raises(ServerUnreachable) as failed:
        Store(url)
    message = str(failed.value)
    assert not isinstance(failed.value, NotADatabase)
    assert "unreachable" in message
    assert "keypass" not in message and "p@ss" not in message and "ss@" not in message, message
    assert time.monotonic() - started < 10

    async def main() -> None:
        with pytest.raises(ServerUnreachable) as raised:
            await AsyncStore(url)
        text = str(raised.value)
        assert "keypass" not in text and "ss@" not in text and "unreachable" in text

    asyncio.run(main())


def test_sslpassword_is_not_in_repr_or_path(postgresql_url: str) -> None:
    with Store(postgresql_url + "&sslpassword=keypass") as store:
        assert "keypass" not in repr(store) and "keypass" not in store.path


# ------------------------------------------------------------------ lock timeout

HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@contextmanager
def sqlite_write_lock_held(path: Path) -> Iterator[None]:
    """Another process holds the file's write lock (BEGIN IMMEDIATE) until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(10)


WRITES: dict[str, Callable[[Store], object]] = {
    "append": lambda s: s.buffer("s", "", "k").append(USER),
    "memory_set": lambda s: s.memory_set(None, "global", "k", 2),
    "set_title": lambda s: s.buffer("s", "", "k").set_title("t"),
    "sessions.create": lambda s: s.sessions(Principal("alice")).create("wf"),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_sqlite_a_held_write_lock_raises_lock_timeout_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, write: str
) -> None:
    """Another process holds BEGIN IMMEDIATE: the warning past lock_warning_after, then
    LockTimeout at about lock_timeout, and the file as it was."""
    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("s", "", "k").append(USER)
    before = snapshot(path)
    with (
        Store(path, lock_warning_after=0.3, lock_timeout=1.0) as store,
        sqlite_write_lock_held(path),
    ):
        caplog.set_level(logging.WARNING, "flowdrop_local")
        started = time.monotonic()
        with pytest.raises(LockTimeout) as failed:
            WRITES[write](store)
        waited = time.monotonic() - started
        assert 0.9 <= waited < 2.5, waited
        assert failed.value.seconds == 1.0 and "nothing was written" in str(failed.value)
        assert [r for r in caplog.records if "write lock" in r.getMessage()]
    assert snapshot(path) == before
    with Store(path, lock_timeout=1.0) as store:  # released: the next write goes through
        WRITES[write](store)


def test_sqlite_a_lock_timeout_below_the_warning_gives_up_first(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    Store(path).close()
    with Store(path, lock_timeout=0.3) as store, sqlite_write_lock_held(path):
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            store.buffer("s", "", "k").append(USER)
        assert time.monotonic() - started < 1.5


def test_async_sqlite_lock_timeout(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    Store(path).close()

    async def main() -> None:
        async with AsyncStore(path, lock_timeout=0.5) as store:
            with sqlite_write_lock_held(path), pytest.raises(LockTimeout):
                await store.buffer("s", "", "k").append(USER)
            assert (await store.buffer("s", "", "k").append(USER)).count == 1

    asyncio.run(main())


@pytest.mark.parametrize(
    "value",
    [0, -1, float("nan"), float("inf"), 10**5000, 10**7, True, "5"],
    ids=["0", "-1", "nan", "inf", "10**5000", "10**7", "True", "str"],
)
def test_lock_settings_out_of_range_are_invalid_arguments(tmp_path: Path, value: Any) -> None:
    for option in ("lock_timeout", "lock_warning_after"):
        with pytest.raises(InvalidArgument, match=option):
            Store(tmp_path / "x.db", **{option: value})
        with pytest.raises(InvalidArgument, match=option):
            AsyncStore(tmp_path / "x.db", **{option: value})


@contextmanager
def postgresql_rows_locked(url: str, statement: str) -> Iterator[None]:
    """A second connection holds the row locks ``statement`` takes until the block ends."""
    import psycopg

    with psycopg.connect(url) as other:
        other.execute(statement)
        yield
        other.rollback()


PG_HOLDS: dict[str, tuple[str, Callable[[Store], object]]] = {
    "append": ("SELECT id FROM buffers FOR UPDATE", WRITES["append"]),
    "memory_set": ("SELECT key FROM memory FOR UPDATE", WRITES["memory_set"]),
    "set_title": ("SELECT id FROM buffers FOR UPDATE", WRITES["set_title"]),
}


@pytest.mark.parametrize("write", sorted(PG_HOLDS))
def test_postgresql_a_held_row_lock_raises_lock_timeout_and_writes_nothing(
    postgresql_url: str, caplog: pytest.LogCaptureFixture, write: str
) -> None:
    statement, call = PG_HOLDS[write]
    with Store(postgresql_url) as store:
        store.buffer("s", "", "k").append(USER)
        store.memory_set(None, "global", "k", 1)
    before = snapshot(postgresql_url)
    caplog.set_level(logging.WARNING, "flowdrop_local")
    with (
        Store(postgresql_url, lock_warning_after=0.3, lock_timeout=1.0) as store,
        postgresql_rows_locked(postgresql_url, statement),
    ):
        started = time.monotonic()
        with pytest.raises(LockTimeout) as failed:
            call(store)
        waited = time.monotonic() - started
        assert 0.9 <= waited < 2.5, waited
        assert failed.value.seconds == 1.0
    assert snapshot(postgresql_url) == before
    with Store(postgresql_url, lock_timeout=1.0) as store:
        call(store)


def test_postgresql_async_lock_timeout(postgresql_url: str) -> None:
    with Store(postgresql_url) as store:
        store.buffer("s", "", "k").append(USER)

    async def main() -> None:
        async with AsyncStore(postgresql_url, lock_warning_after=0.2, lock_timeout=0.6) as store:
            with postgresql_rows_locked(postgresql_url, PG_HOLDS["append"][0]):
                started = time.monotonic()
                with pytest.raises(LockTimeout):
                    await store.buffer("s", "", "k").append(USER)
                assert time.monotonic() - started < 2
            assert (await store.buffer("s", "", "k").append(USER)).count == 2

    asyncio.run(main())


def test_postgresql_without_a_lock_timeout_still_waits_past_the_warning(
    postgresql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The default: the warning, then the write lands once the lock is released (MEM-12)."""
    import threading

    import psycopg

    with Store(postgresql_url) as store:
        store.buffer("s", "", "k").append(USER)
        caplog.set_level(logging.WARNING, "flowdrop_local")
        with psycopg.connect(postgresql_url) as other:
            other.execute("SELECT id FROM buffers FOR UPDATE")
            threading.Timer(1.0, other.rollback).start()
            with Store(postgresql_url, lock_warning_after=0.3) as waiting:
                assert waiting.buffer("s", "", "k").append(USER).count == 2
        assert [r for r in caplog.records if "still waiting" in r.getMessage()]


# ------------------------------------------------------------------ too large


TOO_LARGE: dict[str, Callable[[Store], object]] = {
    "content": lambda s: s.buffer("s", "", "k").append({"role": "user", "content": "x" * 5000}),
    "memory value": lambda s: s.memory_set(None, "global", "k", "x" * 5000),
    "session metadata": lambda s: s.sessions(Principal("alice")).create(
        "wf", metadata={"a": "x" * 5000}
    ),
}


@pytest.mark.parametrize("what", sorted(TOO_LARGE))
def test_a_value_past_sqlites_length_limit_is_too_large(tmp_path: Path, what: str) -> None:
    """SQLITE_LIMIT_LENGTH lowered to 4,000 bytes (as a build with a small
    SQLITE_MAX_LENGTH has it): TooLarge, not sqlite3.DataError, and nothing written."""
    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("s", "", "k").append(USER)
        before = snapshot(path)
        store.backend.connection().setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 4000)  # type: ignore[attr-defined]
        with pytest.raises(TooLarge):
            TOO_LARGE[what](store)
    assert snapshot(path) == before


# ------------------------------------------------------------------ damaged rows


def test_a_damaged_row_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("s", "1", "k").append(USER)
        session = store.sessions(Principal("alice")).create("wf")
        message_id = store.buffer("s", "1", "k").messages()[0].id
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute("UPDATE messages SET content = '{bad', content_parts = 1")
    conn.execute("UPDATE sessions SET metadata = '[1'")
    conn.close()
    with Store(path) as store:
        with pytest.raises(CorruptRow, match=message_id):
            store.buffer("s", "1", "k").messages()
        with pytest.raises(CorruptRow, match="buffer s/1/k"):
            list(store.export())
        with pytest.raises(CorruptRow, match=f"session {session.id}"):
            store.sessions(Principal("alice")).get(session.id)
        assert isinstance(CorruptRow("x"), NotADatabase)  # an except NotADatabase still holds

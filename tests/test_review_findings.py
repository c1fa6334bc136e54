"""Bugs a review of the storage seam and the PostgreSQL backend found, now fixed.

Each test demonstrated one finding before its fix: a full export read in several
snapshots; read(before=) without a limit on PostgreSQL; pop, clear and an admin's
delete not waiting for an append's row lock; a NUL in JSON getting the wrong error;
a schema the role cannot create in; an exhausted pool; a ``?password=`` shown; an
import storing memory rows the API refuses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest

from flowdrop_local import Store
from flowdrop_local.access import Principal
from flowdrop_local.errors import (
    FlowdropError,
    InvalidAddress,
    InvalidImport,
    InvalidSession,
    InvalidValue,
)

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


# ------------------------------------------------------------ export snapshots


def test_a_full_export_is_one_snapshot_so_it_imports_again(target: str) -> None:
    """A session created while a full export is being read is wholly in it or wholly out.

    Today the sessions are read in one snapshot and the viewers in a later one: a
    session created and shared in between gives a viewer line whose session is
    not in the file, and the file is refused on import (FOREIGN KEY).
    """
    with Store(target) as store:
        sessions = store.sessions(Principal(user_id="u1"))
        sessions.create("wf")
        records = store.export(full=True)
        taken = [next(records), next(records)]  # the header, the one session
        late = sessions.create("wf")
        sessions.grant(late.id, "u2")
        sessions.drive(late.id, {"role": "user", "content": "hi"})
        taken += list(records)
    exported = {r["id"] for r in taken if r.get("record") == "session"}
    viewers = {r["session_id"] for r in taken if r.get("record") == "viewer"}
    assert viewers <= exported
    with Store(":memory:") as fresh:
        fresh.import_records(taken)  # InvalidImport (FOREIGN KEY) today


# ---------------------------------------------------------- PostgreSQL reads


def test_read_before_without_a_limit_works_on_postgresql(postgresql_url: str) -> None:
    """``read(before=id)`` with no limit gives every earlier message, as on SQLite."""
    with Store(postgresql_url) as store:
        buffer = store.buffer("global", "", "k")
        ids = buffer.append(
            [{"role": "user", "content": text} for text in ("a", "b", "c")]
        ).message_ids
        assert [m["content"] for m in buffer.read(before=ids[2])] == ["a", "b"]


# ---------------------------------------------------------- PostgreSQL locks


@pytest.mark.timeout(60)
def test_pop_serialises_with_an_append_on_postgresql(postgresql_url: str) -> None:
    """A pop racing a user turn must not leave the user turn after an unanswered call.

    A raw connection holds SHARE on ``messages``: the append has its row lock and
    its state (the call is answered) and waits to insert; the pop reads the last
    message (the result) and waits to delete it. On release the user turn is
    stored, then the result is deleted: the call is unanswered before a user
    turn, which MEM-3 forbids (``check()`` reports it).
    """
    import psycopg

    with Store(postgresql_url) as store:
        buffer = store.buffer("global", "", "k")
        buffer.append(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "metadata": {"tool_calls": [CALL]}},
                {"role": "tool", "content": "r", "metadata": {"tool_call_id": "c1"}},
            ]
        )
        errors: list[BaseException] = []

        def run(work: Callable[[], object]) -> threading.Thread:
            def body() -> None:
                try:
                    work()
                except BaseException as error:  # reported below
                    errors.append(error)

            thread = threading.Thread(target=body)
            thread.start()
            return thread

        def wait_for_waiters(n: int) -> None:
            """Until ``n`` backends of this database wait on a lock (polled, not slept)."""
            deadline = time.monotonic() + 20
            with psycopg.connect(postgresql_url, autocommit=True) as watcher:
                while time.monotonic() < deadline:
                    row = watcher.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                    ).fetchone()
                    if row is not None and row[0] >= n:
                        return
                    time.sleep(0.02)
            raise AssertionError(f"fewer than {n} backends waited on a lock")

        with psycopg.connect(postgresql_url) as blocker:
            blocker.execute("LOCK TABLE messages IN SHARE MODE")
            appending = run(lambda: buffer.append({"role": "user", "content": "next"}))
            wait_for_waiters(1)  # the append holds the row lock and its state, waits to insert
            popping = run(lambda: store.buffer("global", "", "k").pop())
            wait_for_waiters(2)  # the pop has read its last message, waits to delete
            blocker.rollback()
        appending.join(30)
        popping.join(30)
        assert errors == []
        assert store.check() == []


# ------------------------------------------------------- PostgreSQL errors


def _memory_value(store: Store) -> object:
    return store.memory_set(None, "global", "m", {"x": "a\x00b"})


def _session_metadata(store: Store) -> object:
    return store.sessions(Principal(user_id="u1")).create("wf", metadata={"x": "a\x00b"})


def _import_metadata(store: Store) -> object:
    line = {"scope": "global", "scope_id": "", "key": "k", "role": "assistant",
            "content": "x", "metadata": {"x": "a\x00b"}}  # fmt: skip
    return store.import_records([line])


@pytest.mark.parametrize(
    ("work", "expected"),
    [
        (_memory_value, InvalidValue),  # memory_set documents InvalidValue; README too
        (_session_metadata, (InvalidSession, InvalidValue)),  # Sessions: InvalidSession
        (_import_metadata, InvalidImport),  # an import names the bad line
    ],
    ids=["memory-value", "session-metadata", "import-metadata"],
)
def test_a_nul_inside_json_gets_the_error_of_what_was_written_on_postgresql(
    postgresql_url: str, work: Callable[[Store], object], expected: Any
) -> None:
    """PostgreSQL's jsonb cannot hold ``\\u0000``: the error must be the caller's own.

    README: "an append, address or memory value holding one raises InvalidValue".
    Today a memory value or session metadata holding NUL raises InvalidMessage
    (field ``content``), which ``except InvalidValue`` / ``InvalidSession`` misses.
    """
    with Store(postgresql_url) as store, pytest.raises(expected):
        work(store)


def test_opening_a_schema_the_role_cannot_create_in_is_a_flowdrop_error(
    postgresql_url: str,
) -> None:
    """A role without CREATE on its schema gets a FlowdropError, not psycopg's own."""
    import psycopg

    schema = postgresql_url.rsplit("%3D", 1)[1]
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS flowdrop_review_nocreate")
        conn.execute("CREATE ROLE flowdrop_review_nocreate LOGIN PASSWORD 'nocreate'")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO flowdrop_review_nocreate")
    # libpq: parameters in the query override the URL's user and password.
    url = f"{postgresql_url}&user=flowdrop_review_nocreate&password=nocreate"
    with psycopg.connect(url) as conn:  # the role itself can connect
        assert conn.execute("SELECT current_user").fetchone() == ("flowdrop_review_nocreate",)
    try:
        with pytest.raises(FlowdropError):
            Store(url).close()
    finally:
        with psycopg.connect(postgresql_url, autocommit=True) as conn:
            conn.execute(f"REVOKE ALL ON SCHEMA {schema} FROM flowdrop_review_nocreate")
            conn.execute("DROP ROLE flowdrop_review_nocreate")


@pytest.mark.timeout(60)
def test_an_exhausted_pool_is_a_flowdrop_error(postgresql_url: str) -> None:
    """An append that cannot get a connection (an export holds it) raises a FlowdropError."""
    import psycopg_pool

    Store(postgresql_url).close()  # creates the schema
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        postgresql_url,
        min_size=1,
        max_size=1,
        timeout=1,
        open=True,
        kwargs={"autocommit": True},
    )
    try:
        with Store(pool) as store:
            buffer = store.buffer("global", "", "k")
            buffer.append({"role": "user", "content": "a"})
            records = store.export()
            assert isinstance(records, Generator)  # closed below: the connection goes back
            try:
                next(records)  # the export's snapshot holds the pool's one connection
                with pytest.raises(FlowdropError):
                    buffer.append({"role": "user", "content": "b"})
            finally:
                records.close()
    finally:
        pool.close()


def test_a_password_given_as_a_url_parameter_never_shows(postgresql_url: str) -> None:
    """``postgresql://...?password=...`` is as secret as ``user:password@``."""
    with Store(f"{postgresql_url}&password=hunter2") as store:
        assert "hunter2" not in repr(store)
        assert "hunter2" not in store.path


# ------------------------------------------------------------------- import


@pytest.mark.parametrize(
    ("scope", "key"),
    [
        ("USER", "k"),  # the typo guard's own example: InvalidAddress from memory_set
        ("us er", "k"),  # not a scope name
        ("global", " "),  # a blank key: InvalidAddress from memory_set
    ],
)
def test_an_import_refuses_a_memory_record_the_api_refuses(
    store: Store, scope: str, key: str
) -> None:
    """What ``memory_set`` refuses with InvalidAddress, an import refuses with InvalidImport.

    Today the row is stored, and no memory call can read or delete it again.
    """
    with pytest.raises(InvalidAddress):
        store.memory_set(None, scope, key, 1)
    record = {"record": "memory", "scope": scope, "scope_id": "", "key": key, "value": 1,
              "created_at": "2025-01-01T00:00:00.000Z",
              "updated_at": "2025-01-01T00:00:00.000Z"}  # fmt: skip
    with pytest.raises(InvalidImport):
        store.import_records([record])

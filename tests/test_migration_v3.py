"""Schema version 2 -> 3 (issue 11, item 5): the upgrade of a version-2 file or database.

tests/fixtures/v2.db was written by the last version-2 release (commit 4bfdeee,
tests/fixtures/make_v2.py), and v2.expected.json is what that release read back
from it. The tests that need the version-2 code itself (a version-3 file opened by
it, version-2 ids that are no UUIDs, PostgreSQL) take it from the git history
with ``git archive`` and run it in a child process.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from benchmarks.migration import build_v2
from flowdrop_local import (
    ExecutionContext,
    NotADatabase,
    NotAFlowdropDatabase,
    Principal,
    SchemaTooNew,
    Store,
    _schema,
)
from flowdrop_local.aio import AsyncStore

from .conftest import snapshot

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
V2_RELEASE = "4bfdeee"  # the last commit of schema version 2
EXPECTED: dict[str, Any] = json.loads((FIXTURES / "v2.expected.json").read_text(encoding="utf-8"))


def _copy_v2(tmp_path: Path) -> Path:
    path = tmp_path / "v2.db"
    shutil.copyfile(FIXTURES / "v2.db", path)
    return path


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _messages(store: Store, address: list[str]) -> list[dict[str, Any]]:
    return [attrs.asdict(m) for m in store.buffer(*address).messages()]


# ------------------------------------------------------- the version-2 code itself


@pytest.fixture(scope="module")
def v2_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package of the last version-2 release, from the git history (CI clones it whole)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the version-2 release comes from its history")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", V2_RELEASE, "flowdrop_local", "schema.sql"],
        capture_output=True,
        check=True,
    ).stdout
    target = tmp_path_factory.mktemp("v2-release")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def run_v2(v2_source: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with the version-2 release first on the path (and not this checkout)."""
    prelude = "import flowdrop_local._schema as s\nassert s.SCHEMA_VERSION == 2, s.__file__\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code, *args],
        cwd=v2_source,
        env={**os.environ, "PYTHONPATH": str(v2_source)},
        capture_output=True,
        text=True,
        timeout=120,
    )


# ------------------------------------------------------------ (a) the fixture file


def test_v2_fixture_reads_as_the_version_2_code_read_it(tmp_path: Path) -> None:
    """Every message's id, position, role, content, metadata and timestamp, every buffer's
    address, order and count, and the rows of the kept tables survive the upgrade."""
    path = _copy_v2(tmp_path)
    assert _rows(path, "PRAGMA user_version") == [(2,)]
    with Store(path) as store:
        assert _rows(path, "PRAGMA user_version") == [(3,)]
        listed = [[r.scope, r.scope_id, r.key, r.count] for r in store.buffers()]
        assert listed == [[*b["address"], b["count"]] for b in EXPECTED["buffers"]]
        for expected in EXPECTED["buffers"]:
            assert _messages(store, expected["address"]) == expected["messages"]
            assert len(store.buffer(*expected["address"])) == expected["count"]
        assert store.check() == []
    tables = EXPECTED["tables"]
    for table in ("memory", "sessions", "session_viewers"):
        assert [list(r) for r in _rows(path, f"SELECT * FROM {table} ORDER BY 1, 2, 3")] == (
            tables[table]
        )
    buffers = "SELECT id, scope, scope_id, key, created_at FROM buffers ORDER BY id"
    assert [list(r) for r in _rows(path, buffers)] == tables["buffers"]


def test_v2_fixture_gets_recency_from_its_last_message(tmp_path: Path) -> None:
    """updated_at is the newest message's time; an emptied buffer keeps its creation time."""
    path = _copy_v2(tmp_path)
    Store(path).close()
    rows = _rows(
        path,
        "SELECT b.updated_at, coalesce(max(m.created_at), b.created_at), b.title, b.metadata "
        "FROM buffers AS b LEFT JOIN messages AS m ON m.buffer_id = b.id GROUP BY b.id",
    )
    assert len(rows) == len(EXPECTED["tables"]["buffers"])
    assert all(
        updated == newest and (title, meta) == ("", "{}") for updated, newest, title, meta in rows
    )


def test_upgraded_v2_file_has_the_sqlite_master_of_a_fresh_file(tmp_path: Path) -> None:
    """Tables, indexes and triggers: the same text as a version-3 file created fresh."""
    path = _copy_v2(tmp_path)
    Store(path).close()
    fresh = tmp_path / "fresh.db"
    Store(fresh).close()
    master = "SELECT type, name, tbl_name, sql FROM sqlite_master"
    upgraded, created = set(_rows(path, master)), set(_rows(fresh, master))
    assert not sorted({row[1] for row in upgraded ^ created})
    assert _rows(path, "PRAGMA application_id") == _rows(fresh, "PRAGMA application_id")


def test_upgraded_v2_file_takes_appends_healing_replacement_and_pop(tmp_path: Path) -> None:
    """The buffer rules work on the upgraded rows: a late result replaces an old placeholder
    (MEM-10), a new call is healed, pop takes the last row and the count follows."""
    path = _copy_v2(tmp_path)
    with Store(path) as store:
        chat = store.buffer_for(ExecutionContext(user_id="alice"), "user", "chat")
        old = chat.messages()
        placeholder = next(m for m in old if m.healed and m.tool_call_id == "call_c")
        replaced = chat.append({"role": "tool", "tool_call_id": "call_c", "content": "no alerts"})
        assert replaced.replaced_ids == (placeholder.id,) and replaced.count == 11
        assert chat.messages()[8].content == "no alerts"  # in the placeholder's place
        chat.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_d",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            }
        )
        healed = chat.append({"role": "user", "content": "go on"})
        assert len(healed.healed_ids) == 1 and healed.count == 14 == len(chat)
        assert chat.pop() == {"role": "user", "content": "go on", "metadata": {}}
        assert len(chat) == 13
        assert [m.id for m in chat.messages()][:11] == [m.id for m in old]
        # Paging back by an id the version-2 code made.
        assert chat.read(2, before=old[2].id) == [
            {"role": "system", "content": old[0].content, "metadata": {}},
            {"role": "user", "content": old[1].content, "metadata": {}},
        ]
        sessions = store.sessions(Principal(user_id="alice"))
        trip = EXPECTED["tables"]["sessions"][0][0]
        turn = sessions.drive(trip, {"role": "user", "content": "after the upgrade"})
        assert turn.result.count == 3
        assert [v for v in sessions.viewers(trip)] == ["bob", "carol"]
        alice = ExecutionContext(user_id="alice", session_id="s-1", workflow_id="wf")
        assert store.memory_get(alice, "session", "draft").value == [1, "zwei", {"drei": 3}]
        assert store.check() == []


# ------------------------------------------------------ (b) one transaction


FOREIGN_OBJECTS = [
    # (what, SQL run on the version-2 file, its name in the error)
    (
        "a trigger on messages",
        "CREATE TRIGGER spy AFTER INSERT ON messages BEGIN SELECT 1; END",
        "spy",
    ),
    (
        "a trigger on tool_calls",
        "CREATE TRIGGER spy AFTER DELETE ON tool_calls BEGIN SELECT 1; END",
        "spy",
    ),
    (
        "a trigger on buffers",
        "CREATE TRIGGER spy AFTER UPDATE ON buffers BEGIN SELECT 1; END",
        "spy",
    ),
    ("an index on messages", "CREATE INDEX spy ON messages (created_at)", "spy"),
    ("a view of messages", "CREATE VIEW peek AS SELECT content FROM messages", "peek"),
    (
        "a trigger on the user's table writing messages",
        "CREATE TABLE mine (x TEXT); "
        "CREATE TRIGGER spy AFTER INSERT ON mine BEGIN DELETE FROM messages; END",
        "spy",
    ),
    (
        "a table referencing messages",
        "CREATE TABLE notes (m TEXT REFERENCES messages (id))",
        "notes",
    ),
]


@pytest.mark.parametrize(
    ("sql", "name"), [r[1:] for r in FOREIGN_OBJECTS], ids=[r[0] for r in FOREIGN_OBJECTS]
)
def test_v2_file_with_a_foreign_object_on_a_rebuilt_table_is_refused_unchanged(
    tmp_path: Path, sql: str, name: str
) -> None:
    """NotAFlowdropDatabase naming the object; the file stays byte for byte version 2
    (rebuilding would drop the object, or leave it naming a table that is gone)."""
    path = _copy_v2(tmp_path)
    conn = sqlite3.connect(path)
    conn.executescript(sql)
    conn.close()
    before = path.read_bytes()
    with pytest.raises(NotAFlowdropDatabase, match=name):
        Store(path)
    assert path.read_bytes() == before
    assert _rows(path, "PRAGMA user_version") == [(2,)]


def test_v2_file_with_an_unrelated_object_of_the_user_upgrades(tmp_path: Path) -> None:
    """The user's own table, index and view name none of ours: kept, and the upgrade runs."""
    path = _copy_v2(tmp_path)
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE mine (x TEXT); CREATE INDEX mine_x ON mine (x); "
        "CREATE VIEW mine_view AS SELECT x FROM mine; INSERT INTO mine VALUES ('kept')"
    )
    conn.close()
    with Store(path) as store:
        assert store.check() == []
    assert _rows(path, "SELECT * FROM mine_view") == [("kept",)]
    assert _rows(path, "PRAGMA user_version") == [(3,)]


LARGE = 20_000  # messages in the file a child is killed upgrading
PER_BUFFER = 1_000

# Where the child stops to be killed: each hook replaces a function the upgrade
# calls, waits there, and the test sends SIGKILL.
KILL_POINTS = {
    "mapping the ids": (
        "real = _schema._stored_id\n"
        "seen = []\n"
        "def hook(text):\n"
        "    seen.append(1)\n"
        "    if len(seen) == 10_000:\n"
        "        stop()\n"
        "    return real(text)\n"
        "_schema._stored_id = hook\n"
    ),
    # Inside the INSERT of the new messages table, once its pages fill 1 MB of the WAL.
    "writing the new table": (
        "import os, sqlite3\n"
        "real_connect = sqlite3.connect\n"
        "def connect(target, *args, **kwargs):\n"
        "    conn = real_connect(target, *args, **kwargs)\n"
        "    def progress():\n"
        "        wal = f'{target}-wal'\n"
        "        if os.path.exists(wal) and os.path.getsize(wal) > 1_000_000:\n"
        "            stop()\n"
        "        return 0\n"
        "    conn.set_progress_handler(progress, 10_000)\n"
        "    return conn\n"
        "sqlite3.connect = connect\n"
    ),
    "rebuilding the ledger": "_schema.rebuild_ledger = lambda conn: stop()\n",
    # After the steps and PRAGMA user_version = 3, before COMMIT.
    "before the commit": "_schema.verify_schema = lambda objects, where: stop()\n",
}
CHILD = """
import sys, time
from flowdrop_local import Store, _schema
def stop():
    print("stopped", flush=True)
    time.sleep(120)
{hook}
Store(sys.argv[1])
print("upgraded", flush=True)
"""


@pytest.fixture(scope="module")
def large_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("large") / "large-v2.db"
    build_v2(path, LARGE, PER_BUFFER)
    return path


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_upgrade_killed_midway_leaves_the_v2_file(
    tmp_path: Path, large_v2: Path, point: str
) -> None:
    """SIGKILL during the upgrade of a large file: the file is still version 2, byte for
    byte, and the next open upgrades it whole."""
    path = tmp_path / "v2.db"
    shutil.copyfile(large_v2, path)
    before = path.read_bytes()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(hook=KILL_POINTS[point]), str(path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "stopped\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    conn = sqlite3.connect(path)  # recovers from the WAL the child left
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA user_version").fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (LARGE,)
    finally:
        conn.close()
    assert path.read_bytes() == before
    with Store(path) as store:
        assert [r.count for r in store.buffers()] == [PER_BUFFER] * (LARGE // PER_BUFFER)
        assert store.check() == []
    assert _rows(path, "PRAGMA user_version") == [(3,)]


def test_large_v2_file_upgrades_with_every_count_on_its_last_row(
    tmp_path: Path, large_v2: Path
) -> None:
    """The tally of each buffer's last row is its count; the ledger is rebuilt whole."""
    path = tmp_path / "v2.db"
    shutil.copyfile(large_v2, path)
    ledger = _rows(path, "SELECT count(*), count(answered_by) FROM tool_calls")
    with Store(path) as store:
        assert store.check() == []
        assert len(store.buffer("user", "u000007", "chat")) == PER_BUFFER
    tallies = _rows(
        path,
        "SELECT m.tally FROM messages AS m WHERE m.position = "
        "(SELECT max(position) FROM messages WHERE buffer_id = m.buffer_id)",
    )
    assert tallies == [(PER_BUFFER,)] * (LARGE // PER_BUFFER)
    assert _rows(path, "SELECT count(*), count(answered_by) FROM tool_calls") == ledger


# ------------------------------------------------- (c) ids that are not UUIDs


ASSISTANT_ID = "assistant-turn-of-version-2-36chars!"
ODD_IDS = [
    # (what, the version-2 id of a tool result, its id after the upgrade, a warning?)
    ("any 36 characters", "a-result-id-of-exactly-36-characters", "uuid5", True),
    ("a UUID in braces", "{01234567-89ab-cdef0123456789abcdef}", "uuid5", True),
    ("hyphens elsewhere", "0123-456789ab-cdef-0123-456789abcdef", "uuid5", True),
    ("an upper-case UUID", "01234567-89AB-CDEF-0123-456789ABCDEF", "lower", False),
    ("a UUID", "01234567-89ab-cdef-0123-456789abcdef", "same", False),
]
IMPORT_ODD_IDS = """
import json, sys
from flowdrop_local import Store
ids = json.loads(sys.argv[2])
records = [
    {"scope": "user", "scope_id": "u1", "key": "chat", "id": ids[0], "role": "assistant",
     "content": "", "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "f", "arguments": "{}"}}]},
    {"scope": "user", "scope_id": "u1", "key": "chat", "id": ids[1], "role": "tool",
     "tool_call_id": "c1", "content": "result"},
    {"scope": "user", "scope_id": "u1", "key": "chat", "role": "user", "content": "next"},
]
for extra in ids[2:]:
    records.append({"scope": "user", "scope_id": "u2", "key": "chat", "id": extra,
                    "role": "user", "content": extra})
with Store(sys.argv[1]) as store:
    store.import_records(records)
    assert store.check() == []
"""


def _new_id(old: str, how: str) -> str:
    if how == "uuid5":
        return str(uuid.uuid5(_schema._ID_NAMESPACE, old))
    return old.lower()


@pytest.mark.parametrize(
    ("old", "how", "warned"), [r[1:] for r in ODD_IDS], ids=[r[0] for r in ODD_IDS]
)
def test_v2_ids_that_are_no_uuid_get_a_name_based_uuid(
    tmp_path: Path,
    v2_source: Path,
    caplog: pytest.LogCaptureFixture,
    old: str,
    how: str,
    warned: bool,
) -> None:
    """Version 2 checked only an id's length: such an id becomes the uuid5 of its text, with a
    warning; a UUID in any case keeps its value. The ledger follows, check() is clean."""
    assert len(ASSISTANT_ID) == len(old) == 36
    path = tmp_path / "odd.db"
    made = run_v2(v2_source, IMPORT_ODD_IDS, str(path), json.dumps([ASSISTANT_ID, old]))
    assert made.returncode == 0, made.stderr
    with caplog.at_level(logging.WARNING, logger="flowdrop_local"), Store(path) as store:
        chat = store.buffer("user", "u1", "chat")
        ids = [m.id for m in chat.messages()]
        assert ids[:2] == [_new_id(ASSISTANT_ID, "uuid5"), _new_id(old, how)]
        assert store.check() == []
        assert chat.append({"role": "user", "content": "more"}).healed_ids == ()
        assert chat.read(1, before=ids[1]) == [
            {"role": "assistant", "content": "", "metadata": chat.messages()[0].metadata}
        ]
        assert store.buffer("user", "u1", "chat").pop() is not None
        assert store.check() == []
    warnings = [r.getMessage() for r in caplog.records if "were not UUIDs" in r.getMessage()]
    assert warnings == [
        f"flowdrop_local: {2 if warned else 1} message id(s) were not UUIDs; version 3 stores "
        "each as the name-based UUID (uuid5) of its old text"
    ]


def test_v2_ids_differing_only_in_case_both_survive(
    tmp_path: Path, v2_source: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Version 2 kept "...abcdef" and "...ABCDEF" apart: the lower-case one keeps the UUID,
    the other gets the uuid5 of its text (no UNIQUE failure that would block the upgrade)."""
    lower = "01234567-89ab-cdef-0123-456789abcdef"
    ids = [ASSISTANT_ID, "a-result-id-of-exactly-36-characters", lower.upper(), lower]
    path = tmp_path / "odd.db"
    made = run_v2(v2_source, IMPORT_ODD_IDS, str(path), json.dumps(ids))
    assert made.returncode == 0, made.stderr
    with caplog.at_level(logging.WARNING, logger="flowdrop_local"), Store(path) as store:
        other = store.buffer("user", "u2", "chat").messages()
        assert [(m.id, m.content) for m in other] == [
            (_new_id(lower.upper(), "uuid5"), lower.upper()),
            (lower, lower),
        ]
        assert store.check() == []
    assert any("3 message id(s) were not UUIDs" in r.getMessage() for r in caplog.records)


# --------------------------------------------------- (d) newer than this release


@pytest.mark.parametrize("version", [4, 99])
def test_a_file_of_a_newer_version_gives_schema_too_new(tmp_path: Path, version: int) -> None:
    """SchemaTooNew naming both versions; the file is not touched."""
    path = tmp_path / "new.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(SchemaTooNew, match=f"schema version {version}; .* reads up to 3"):
        Store(path)
    assert path.read_bytes() == before


V2_OPENS = {
    "Store": "Store(sys.argv[1])",
    "Store read_only": "Store(sys.argv[1], read_only=True)",
    "Store create=False": "Store(sys.argv[1], create=False)",
}
OPEN_WITH_V2 = """
import sys
from flowdrop_local import Store, SchemaTooNew
try:
    {open}
except SchemaTooNew as error:
    print("SchemaTooNew:", error)
"""


@pytest.mark.parametrize("how", list(V2_OPENS))
def test_version_2_release_opening_a_version_3_file_gets_schema_too_new(
    tmp_path: Path, v2_source: Path, how: str
) -> None:
    """The released version-2 code refuses the upgraded file as too new, not as corrupt."""
    path = _copy_v2(tmp_path)
    Store(path).close()
    before = snapshot(path)
    opened = run_v2(v2_source, OPEN_WITH_V2.format(open=V2_OPENS[how]), str(path))
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.startswith("SchemaTooNew:")
    assert "schema version 3; this flowdrop_local reads up to 2" in opened.stdout
    assert snapshot(path) == before


def test_version_2_cli_on_a_version_3_file_says_upgrade(tmp_path: Path, v2_source: Path) -> None:
    """The version-2 CLI's one 'Error: ... upgrade flowdrop_local' line, exit status 2 (its
    status for a flowdrop_local error), no traceback."""
    path = tmp_path / "fresh.db"
    Store(path).close()
    ran = run_v2(
        v2_source, "from flowdrop_local.cli import main\nmain()\n", "--db", str(path), "check"
    )
    assert ran.returncode == 2
    assert (
        "Error:" in ran.stderr
        and "schema version 3" in ran.stderr
        and "upgrade flowdrop_local" in ran.stderr
    )
    assert "Traceback" not in ran.stderr


# ---------------------------------------------------------------- (e) PostgreSQL


FILL_PG_V2 = """
import json, sys
import attrs
from flowdrop_local import ExecutionContext, Principal, Store
call = lambda i: {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
with Store(sys.argv[1]) as store:
    chat = store.buffer_for(ExecutionContext(user_id="alice"), "user", "chat")
    chat.append({"role": "system", "content": "Réponds 🌦"})
    chat.append({"role": "assistant", "content": "", "tool_calls": [call("a"), call("b")]})
    chat.append({"role": "tool", "tool_call_id": "b", "content": "b done"})
    chat.append({"role": "user", "content": "heal a"})
    chat.append({"role": "tool", "tool_call_id": "a", "content": "late a"})  # MEM-10
    chat.append({"role": "assistant", "content": [{"type": "text", "text": "parts"}]})
    chat.append({"role": "assistant", "content": "", "tool_calls": [call("c")]})
    chat.append({"role": "user", "content": "heal c"})
    notes = store.buffer("global", "", "notes")
    notes.append([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    notes.pop()
    store.buffer("workflow", "wf", "emptied").append({"role": "user", "content": "x"})
    store.buffer("workflow", "wf", "emptied").clear()
    store.memory_set(None, "global", "k", {"v": 1})
    sessions = store.sessions(Principal(user_id="alice"))
    session = sessions.create("wf", name="s")
    sessions.drive(session.id, {"role": "user", "content": "in a session"})
    sessions.grant(session.id, "bob")
    assert store.check() == []
    print(json.dumps([
        {"address": [r.scope, r.scope_id, r.key], "count": r.count,
         "messages": [attrs.asdict(m) for m in store.buffer(r.scope, r.scope_id, r.key).messages()]}
        for r in store.buffers()
    ]))
"""


def _pg_v2(url: str, v2_source: Path) -> list[dict[str, Any]]:
    """A version-2 PostgreSQL schema (the released postgresql.sql), filled by the version-2 code."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((FIXTURES / "postgresql_v2.sql").read_bytes())
    filled = run_v2(v2_source, FILL_PG_V2, url)
    assert filled.returncode == 0, filled.stderr
    expected: list[dict[str, Any]] = json.loads(filled.stdout)
    return expected


def test_postgresql_v2_fixture_is_the_released_schema() -> None:
    """tests/fixtures/postgresql_v2.sql is the version-2 release's postgresql.sql, unedited."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    released = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{V2_RELEASE}:flowdrop_local/backends/postgresql.sql"],
        capture_output=True,
        check=True,
    ).stdout
    assert (FIXTURES / "postgresql_v2.sql").read_bytes() == released


async def _read_async(url: str, expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Open with AsyncStore (which upgrades) and read back what the sync test reads."""
    found = []
    async with AsyncStore(url) as store:
        for entry in expected:
            buf = store.buffer(*entry["address"])
            found.append(
                {
                    "address": entry["address"],
                    "count": await buf.count(),
                    "messages": [attrs.asdict(m) for m in await buf.messages()],
                }
            )
        assert await store.check() == []
    return found


def _read_sync(url: str, expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with Store(url) as store:
        found = [
            {
                "address": entry["address"],
                "count": len(store.buffer(*entry["address"])),
                "messages": _messages(store, entry["address"]),
            }
            for entry in expected
        ]
        assert store.check() == []
    return found


OPENERS: dict[str, Callable[[str, list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "Store": _read_sync,
    "AsyncStore": lambda url, expected: asyncio.run(_read_async(url, expected)),
}


@pytest.mark.parametrize("opener", list(OPENERS))
def test_postgresql_v2_database_upgrades_on_open(
    postgresql_url: str, v2_source: Path, opener: str
) -> None:
    """Sync or async, the first open upgrades to 3: every message as version 2 read it,
    counts from the tally of the last row, check() clean, appends and healing work."""
    import psycopg

    expected = _pg_v2(postgresql_url, v2_source)
    assert [(e["address"], e["count"]) for e in expected][::2] == [
        (["global", "", "notes"], 1),
        (["user", "alice", "chat"], 9),
    ]
    assert OPENERS[opener](postgresql_url, expected) == expected
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        meta: dict[str, str] = dict(
            conn.execute("SELECT name, value FROM flowdrop_meta").fetchall()
        )
        assert meta["schema_version"] == "3"
        tallies = conn.execute(
            "SELECT b.scope, b.key, m.tally FROM buffers AS b JOIN messages AS m "
            "ON m.buffer_id = b.id AND m.position = "
            "(SELECT max(position) FROM messages WHERE buffer_id = b.id) ORDER BY 1, 2"
        ).fetchall()
    assert sorted(tallies) == sorted(
        (e["address"][0], e["address"][2], e["count"]) for e in expected
    )
    with Store(postgresql_url) as store:
        chat = store.buffer("user", "alice", "chat")
        chat.append({"role": "tool", "tool_call_id": "c", "content": "late c"})  # MEM-10
        chat.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "d", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            }
        )
        result = chat.append({"role": "user", "content": "heal d"})
        assert len(result.healed_ids) == 1 and result.count == 12 == len(chat)
        assert store.buffer("global", "", "notes").pop() is not None
        assert len(store.buffer("global", "", "notes")) == 0
        assert store.check() == []


@pytest.mark.parametrize(("scope", "scope_id"), [("user", "0"), ("user", ""), ("session", " ")])
def test_v2_buffer_in_an_identity_scope_without_identity_is_refused_typed(
    tmp_path: Path, scope: str, scope_id: str
) -> None:
    """Version 1 stored such buffers and version 2 kept them (its check is on inserts);
    version 3's CHECK refuses them: NotADatabase naming the rule, the file unchanged,
    not a raw sqlite3.IntegrityError."""
    path = _copy_v2(tmp_path)
    trigger = next(
        st
        for st in _schema.statements(_schema._frozen_schema(2))
        if "TRIGGER buffers_identity_scope_needs_identity" in st
    )
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER buffers_identity_scope_needs_identity")
    conn.execute(
        "INSERT INTO buffers (id, scope, scope_id, key, message_count) VALUES (99, ?, ?, 'k', 1)",
        (scope, scope_id),
    )
    conn.execute(
        "INSERT INTO messages (id, buffer_id, position, role, content) "
        "VALUES ('01234567-89ab-cdef-0123-456789abcdef', 99, 'a0', 'user', 'v1 era')"
    )
    conn.execute(trigger)
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(NotADatabase, match=r"from schema version 2: .*trim\(scope_id\)"):
        Store(path)
    assert path.read_bytes() == before


PG_SPY = """
CREATE FUNCTION spy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER spy AFTER INSERT ON messages FOR EACH ROW EXECUTE FUNCTION spy();
"""


async def _open_async(url: str) -> None:
    async with AsyncStore(url):
        pass


PG_OPENS: dict[str, Callable[[str], None]] = {
    "Store": lambda url: Store(url).close(),
    "AsyncStore": lambda url: asyncio.run(_open_async(url)),
}


@pytest.mark.parametrize("opener", list(PG_OPENS))
def test_postgresql_v2_database_with_a_foreign_trigger_is_refused_not_upgraded(
    postgresql_url: str, opener: str
) -> None:
    """As on SQLite, the upgrade is verified before it commits: NotAFlowdropDatabase
    naming the trigger, and the database stays version 2."""
    import psycopg

    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute((FIXTURES / "postgresql_v2.sql").read_bytes())
        conn.execute(PG_SPY)
    with pytest.raises(NotAFlowdropDatabase, match="spy"):
        PG_OPENS[opener](postgresql_url)
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        version = conn.execute(
            "SELECT value FROM flowdrop_meta WHERE name = 'schema_version'"
        ).fetchone()
    assert version == ("2",)

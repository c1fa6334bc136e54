"""The schema: schema.sql is its one source, the file gets exactly it, and it defends itself."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flowdrop_local import NotAFlowdropDatabase, Principal, Store, _schema
from flowdrop_local._schema import APPLICATION_ID, SCHEMA_VERSION, schema_sql

from .conftest import snapshot

ROOT = Path(__file__).resolve().parent.parent


def _declared(kind: str) -> set[str]:
    pattern = rf"CREATE\s+(?:UNIQUE\s+)?{kind}\s+(\w+)"
    return set(re.findall(pattern, (ROOT / "schema.sql").read_text(), flags=re.IGNORECASE))


def test_fresh_database_has_exactly_the_declared_objects(db_path: Path) -> None:
    """Tables, indexes and triggers in the file are exactly those schema.sql declares."""
    Store(db_path).close()
    conn = sqlite3.connect(db_path)
    found: dict[str, set[str]] = {"table": set(), "index": set(), "trigger": set()}
    for kind, name in conn.execute(
        "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
    ):
        found[kind].add(name)
    assert found["table"] == _declared("TABLE")
    assert found["index"] == _declared("INDEX")
    assert found["trigger"] == _declared("TRIGGER")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    strict = {row[0] for row in conn.execute("SELECT name FROM pragma_table_list WHERE strict = 1")}
    assert _declared("TABLE") <= strict


def test_the_library_reads_the_schema_file_it_ships() -> None:
    """The schema text the library applies is the top-level schema.sql."""
    assert schema_sql() == (ROOT / "schema.sql").read_text(encoding="utf-8")


@pytest.mark.timeout(180)
def test_wheel_ships_schema_inside_the_package(tmp_path: Path) -> None:
    """The built wheel has flowdrop_local/schema.sql and nothing at the site-packages root."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "flowdrop_local/schema.sql" in names
    assert "flowdrop_local/py.typed" in names
    assert not [n for n in names if "/" not in n]
    packaged = zipfile.ZipFile(wheel).read("flowdrop_local/schema.sql").decode()
    assert packaged == (ROOT / "schema.sql").read_text(encoding="utf-8")


def _raw(store: Store) -> sqlite3.Connection:
    return store.backend.connection()


def test_backstop_trigger_rejects_a_raw_user_insert_over_an_unanswered_call(
    file_store: Store,
) -> None:
    """A writer bypassing the guard but keeping the ledger cannot store a user turn (MEM-3)."""
    buffer = file_store.buffer("session", "s1", "chat")
    buffer.append({"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]})
    conn = _raw(file_store)
    buffer_id = conn.execute("SELECT id FROM buffers").fetchone()[0]
    with pytest.raises(sqlite3.IntegrityError, match="MEM-3"):
        conn.execute(
            "INSERT INTO messages (id, buffer_id, position, role, content) "
            "VALUES (?, ?, 'b0', 'user', 'x')",
            (bytes(16), buffer_id),
        )
    assert len(buffer) == 1
    # Through the library the same turn heals first, then lands.
    assert len(buffer.append({"role": "user", "content": "x"}).healed_ids) == 1


@pytest.mark.parametrize(
    ("position", "why"),
    [
        (10, "a number"),
        ("10", "digit head"),
        ("a", "too short"),
        ("a0-", "not base 62"),
        ("a0 ", "space"),
    ],
)
def test_positions_must_be_well_formed_text(file_store: Store, position: object, why: str) -> None:
    """STRICT TEXT and the CHECK keep positions as base-62 keys with a letter head."""
    file_store.buffer("s", "", "k").append({"role": "system", "content": "x"})
    conn = _raw(file_store)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO messages (id, buffer_id, position, role, content) "
            "VALUES (?, 1, ?, 'system', 'y')",
            (b"\x01" * 16, position),
        )


def test_positions_and_roles_never_change(file_store: Store) -> None:
    """A stored row keeps its position and role: nothing is ever renumbered."""
    file_store.buffer("s", "", "k").append({"role": "system", "content": "x"})
    conn = _raw(file_store)
    with pytest.raises(sqlite3.IntegrityError, match="keeps its buffer, position, id and role"):
        conn.execute("UPDATE messages SET position = 'a5'")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE messages SET role = 'user'")


@pytest.mark.parametrize("metadata", ["[]", "not json", "3"])
def test_metadata_must_be_a_json_object(file_store: Store, metadata: str) -> None:
    """The metadata column only holds JSON objects."""
    file_store.buffer("s", "", "k").append({"role": "system", "content": "x"})
    # Malformed JSON fails in the generated columns' json_extract, the rest in the CHECK.
    with pytest.raises(sqlite3.DatabaseError, match=r"JSON|CHECK"):
        _raw(file_store).execute(
            "INSERT INTO messages (id, buffer_id, position, role, content, metadata) "
            "VALUES (?, 1, 'b0', 'system', 'y', ?)",
            (b"\x02" * 16, metadata),
        )


def test_foreign_keys_are_enforced(file_store: Store) -> None:
    """A message must belong to an existing buffer."""
    with pytest.raises(sqlite3.IntegrityError):
        _raw(file_store).execute(
            "INSERT INTO messages (id, buffer_id, position, role, content) "
            "VALUES (?, 99, 'a0', 'system', 'y')",
            (b"\x03" * 16,),
        )


# ------------------------------------------------ schema verification on open (issue 10 A1)

SESSION_ID = "0" * 8 + "-0000-7000-8000-" + "0" * 12

# (what someone added or changed, the SQL, words the refusal names)
FOREIGN_OBJECTS = [
    (
        "trigger granting a viewer",
        "CREATE TRIGGER mallory AFTER INSERT ON sessions BEGIN "
        "INSERT INTO session_viewers (session_id, user_id) VALUES (NEW.id, 'mallory'); END",
        "trigger mallory",
    ),
    (
        "trigger copying messages",
        "CREATE TABLE loot (body TEXT); CREATE TRIGGER copy AFTER INSERT ON messages "
        "BEGIN INSERT INTO loot VALUES (NEW.content); END",
        "trigger copy",
    ),
    (
        "trigger stalling appends",
        "CREATE TRIGGER stall BEFORE INSERT ON messages BEGIN SELECT count(*) FROM "
        "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1e9) "
        "SELECT i FROM n); END",
        "trigger stall",
    ),
    (
        "table replaced by a view",
        "DROP TABLE session_viewers; "
        "CREATE VIEW session_viewers AS "
        "SELECT id AS session_id, 'mallory' AS user_id FROM sessions",
        "view session_viewers",
    ),
    ("index on our table", "CREATE INDEX peek ON messages (content)", "index peek"),
    (
        "our trigger changed",
        "DROP TRIGGER messages_place_is_fixed; CREATE TRIGGER messages_place_is_fixed "
        "BEFORE UPDATE OF buffer_id ON messages BEGIN SELECT 1; END",
        "trigger messages_place_is_fixed is not the one flowdrop_local makes",
    ),
    (
        "our index dropped",
        "DROP INDEX messages_tool_result",
        "index messages_tool_result is missing",
    ),
    (
        "our id and version, none of our tables",
        "DROP TABLE session_viewers; DROP TABLE sessions; DROP TABLE memory; "
        "DROP TABLE tool_calls; DROP TABLE messages; DROP TABLE buffers",
        "none of flowdrop_local's tables",
    ),
    (
        "trigger on the user's table writing ours",
        "CREATE TABLE notes (body TEXT); CREATE TRIGGER n AFTER INSERT ON notes "
        "BEGIN INSERT INTO 'memory' (scope, scope_id, key, value) "
        "VALUES ('global', '', 'k', 1); END",
        "trigger n is not flowdrop_local's and names its table memory",
    ),
    (
        "the user's table with a foreign key into ours",
        "CREATE TABLE pins (message TEXT REFERENCES messages (id) ON DELETE RESTRICT)",
        "table pins",
    ),
    (
        "a view taking the search index's name",
        "CREATE VIEW message_search_text AS SELECT 1 AS message_id, 'x' AS body",
        "view message_search_text is not flowdrop_local's and takes a name",
    ),
]


def _tampered(path: Path, sql: str) -> None:
    with Store(path) as store:
        store.buffer("session", "s", "chat").append({"role": "user", "content": "secret"})
    conn = sqlite3.connect(path)
    conn.executescript(sql)
    conn.close()


@pytest.mark.parametrize(
    ("sql", "words"), [row[1:] for row in FOREIGN_OBJECTS], ids=[row[0] for row in FOREIGN_OBJECTS]
)
def test_a_schema_object_that_is_not_ours_is_refused_on_open(
    db_path: Path, sql: str, words: str
) -> None:
    """Each added, changed or missing object: NotAFlowdropDatabase naming it; nothing runs."""
    _tampered(db_path, sql)
    before = snapshot(db_path)
    with pytest.raises(NotAFlowdropDatabase, match=re.escape(words)):
        Store(db_path).sessions(Principal("alice")).create("w")
    with pytest.raises(NotAFlowdropDatabase, match=re.escape(words)):
        Store(db_path, read_only=True)
    assert snapshot(db_path) == before


def test_a_trigger_added_after_opening_is_reported_by_check(file_store: Store) -> None:
    """check() reports a trigger someone made through store.db; a new open refuses it."""
    file_store.buffer("s", "", "k").append({"role": "user", "content": "x"})
    assert file_store.check() == []
    file_store.db.execute(
        "CREATE TRIGGER mallory AFTER INSERT ON sessions BEGIN "
        "INSERT INTO session_viewers (session_id, user_id) VALUES (NEW.id, 'mallory'); END"
    )
    violations = file_store.check()
    assert [(v.check, v.detail) for v in violations] == [
        (
            "schema",
            "trigger mallory is not flowdrop_local's and names its tables "
            "session_viewers, sessions",
        )
    ]
    with pytest.raises(NotAFlowdropDatabase, match="trigger mallory"):
        Store(file_store.path)


ALLOWED_OBJECTS = [
    ("statistics from ANALYZE", "ANALYZE"),
    ("statistics from PRAGMA optimize", "PRAGMA optimize"),
    (
        "the user's own table, index, trigger and view",
        "CREATE TABLE notes (body TEXT, messages INTEGER); CREATE INDEX notes_body ON notes (body);"
        "CREATE TABLE notes_log (body TEXT); CREATE TRIGGER notes_logged AFTER INSERT ON notes "
        "BEGIN INSERT INTO notes_log VALUES (NEW.body); END; "
        "CREATE VIEW short_notes AS SELECT body FROM notes WHERE length(body) < 10",
    ),
    ("the user's view reading ours", 'CREATE VIEW everything AS SELECT * FROM "Messages"'),
    (
        "our trigger re-created with other whitespace and comments",
        "DROP TRIGGER messages_place_is_fixed; CREATE TRIGGER messages_place_is_fixed\n"
        "  BEFORE UPDATE OF buffer_id,position,id,role ON messages -- same, reformatted\n"
        "BEGIN SELECT RAISE(ABORT, 'a message keeps its buffer, position, id and role'); END",
    ),
]


@pytest.mark.parametrize(
    "sql", [r[1] for r in ALLOWED_OBJECTS], ids=[r[0] for r in ALLOWED_OBJECTS]
)
def test_objects_that_cannot_run_inside_ours_are_allowed(db_path: Path, sql: str) -> None:
    """sqlite_stat tables, the user's own objects, and our SQL reformatted: opens, checks clean."""
    _tampered(db_path, sql)
    with Store(db_path) as store:
        assert store.buffer("session", "s", "chat").read()[0]["content"] == "secret"
        assert store.check() == []


def test_a_version_1_file_with_a_foreign_trigger_is_refused_and_not_upgraded(
    tmp_path: Path,
) -> None:
    """The upgrade is verified before it commits: the file stays version 1, unchanged."""
    old = tmp_path / "v1.db"
    shutil.copyfile(ROOT / "tests" / "fixtures" / "v1.db", old)
    conn = sqlite3.connect(old)
    conn.execute("CREATE TRIGGER spy AFTER UPDATE ON buffers BEGIN SELECT 1; END")
    conn.close()
    before = snapshot(old)
    with pytest.raises(NotAFlowdropDatabase, match="trigger spy"):
        Store(old)
    assert snapshot(old) == before


def test_the_expected_schema_is_computed_once_per_process(tmp_path: Path) -> None:
    """Opening more stores does not apply schema.sql again (cold open stays cheap)."""
    Store(tmp_path / "a.db").close()
    before = _schema._expected_rows.cache_info()
    for name in ("a.db", "b.db", "c.db"):
        Store(tmp_path / name).close()
    after = _schema._expected_rows.cache_info()
    assert after.misses == before.misses and after.hits > before.hits


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Connection.getconfig is Python 3.12+")
def test_connections_are_defensive(file_store: Store) -> None:
    """SQLITE_DBCONFIG_DEFENSIVE is on where Python exposes it."""
    conn = file_store._connection()
    assert conn.getconfig(sqlite3.SQLITE_DBCONFIG_DEFENSIVE)  # type: ignore[attr-defined]

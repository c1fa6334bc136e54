"""The schema: schema.sql is its one source, the file gets exactly it, and it defends itself."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flowdrop_local import Store
from flowdrop_local._schema import APPLICATION_ID, SCHEMA_VERSION, schema_sql

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
            ("0" * 36, buffer_id),
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
            ("1" * 36, position),
        )


def test_positions_and_roles_never_change(file_store: Store) -> None:
    """A stored row keeps its position and role: nothing is ever renumbered."""
    file_store.buffer("s", "", "k").append({"role": "system", "content": "x"})
    conn = _raw(file_store)
    with pytest.raises(sqlite3.IntegrityError, match="keeps its buffer, position and role"):
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
            ("2" * 36, metadata),
        )


def test_foreign_keys_are_enforced(file_store: Store) -> None:
    """A message must belong to an existing buffer."""
    with pytest.raises(sqlite3.IntegrityError):
        _raw(file_store).execute(
            "INSERT INTO messages (id, buffer_id, position, role, content) "
            "VALUES (?, 99, 'a0', 'system', 'y')",
            ("3" * 36,),
        )

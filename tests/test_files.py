"""Files that are not what they seem: each gets a typed error, and is never modified."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest

from flowdrop_local import (
    FlowdropError,
    NotADatabase,
    NotAFlowdropDatabase,
    ReadOnlyStore,
    SchemaTooNew,
    Store,
)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _flowdrop_file(path: Path, messages: int = 200) -> None:
    with Store(path) as store:
        buffer = store.buffer("session", "s", "chat")
        buffer.append(
            [{"role": "user", "content": f"message {i} " + "x" * 300} for i in range(messages)]
        )
        store.vacuum()


def _newer(path: Path) -> None:
    _flowdrop_file(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('not ours')")
    conn.commit()
    conn.close()


def _text(path: Path) -> None:
    path.write_text("these are my notes, not a database\n" * 200)


def _truncated(path: Path) -> None:
    _flowdrop_file(path)
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size // 2)


def _bad_header(path: Path) -> None:
    _flowdrop_file(path)
    with path.open("r+b") as f:
        f.write(b"\x00garbage header!")


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (_newer, SchemaTooNew, "upgrade flowdrop_local"),
        (_foreign, NotAFlowdropDatabase, "not a flowdrop_local one"),
        (_text, NotADatabase, "not an SQLite database"),
        (_truncated, NotADatabase, ""),
        (_bad_header, NotADatabase, ""),
    ],
    ids=["newer-schema", "foreign-sqlite", "text-file", "truncated", "bad-header"],
)
def test_unopenable_files_get_a_typed_error_and_stay_unchanged(
    tmp_path: Path, make: object, error: type[FlowdropError], words: str
) -> None:
    """Each kind of wrong file raises its own FlowdropError; no byte of the folder changes."""
    path = tmp_path / "x.db"
    make(path)  # type: ignore[operator]
    before = _files(tmp_path)
    with pytest.raises(error, match=words or None):
        Store(path).buffer("session", "s", "chat").read()
    assert _files(tmp_path) == before


def test_corrupt_pages_are_reported_by_reads_and_by_check(tmp_path: Path) -> None:
    """Damage inside the file: reads raise NotADatabase, check() reports integrity errors."""
    path = tmp_path / "x.db"
    _flowdrop_file(path)
    size = path.stat().st_size
    garbage = random.Random(7).randbytes(size)
    with path.open("r+b") as f:  # data pages, from 60% of the file to 90%, past the schema
        f.seek(size * 6 // 10)
        f.write(garbage[size * 6 // 10 : size * 9 // 10])
    with Store(path) as store:
        with pytest.raises(NotADatabase, match="corrupt"):
            store.buffer("session", "s", "chat").read()
        violations = store.check()
    assert violations and violations[0].check == "integrity_check"


def test_read_only_store_reads_and_refuses_writes(tmp_path: Path) -> None:
    """read_only=True: reads work, every write raises ReadOnlyStore, the file is unchanged."""
    path = tmp_path / "x.db"
    _flowdrop_file(path, messages=3)
    before = _files(tmp_path)
    with Store(path, read_only=True) as store:
        buffer = store.buffer("session", "s", "chat")
        assert len(buffer.read()) == 3
        for write in (
            lambda: buffer.append({"role": "user", "content": "no"}),
            buffer.clear,
            lambda: store.import_records([]),
        ):
            with pytest.raises(ReadOnlyStore):
                write()
        assert isinstance(ReadOnlyStore("x"), PermissionError)
    after = _files(tmp_path)
    assert after["x.db"] == before["x.db"]
    assert after.get("x.db-wal", b"") == b""  # SQLite's own -shm/-wal bookkeeping, nothing logged


def test_read_only_store_cannot_create_a_file(tmp_path: Path) -> None:
    """A read-only store never creates a database."""
    with pytest.raises(ReadOnlyStore):
        Store(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_permissions_are_detected(tmp_path: Path) -> None:
    """A file in a folder this user cannot write opens read-only by itself."""
    folder = tmp_path / "ro"
    folder.mkdir()
    _flowdrop_file(folder / "x.db", messages=2)
    os.chmod(folder / "x.db", 0o444)
    os.chmod(folder, 0o555)
    try:
        with Store(folder / "x.db") as store:
            assert store.read_only
            assert len(store.buffer("session", "s", "chat").read()) == 2
            with pytest.raises(ReadOnlyStore):
                store.buffer("session", "s", "chat").append({"role": "user", "content": "x"})
    finally:
        os.chmod(folder, 0o755)


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    """A path whose folder does not exist cannot be opened."""
    with pytest.raises(NotADatabase, match="cannot open"):
        Store(tmp_path / "no" / "such" / "folder.db")


def test_empty_file_becomes_a_fresh_store(tmp_path: Path) -> None:
    """A zero-byte file is an empty SQLite database: it gets the schema."""
    path = tmp_path / "empty.db"
    path.touch()
    with Store(path) as store:
        assert store.buffer("s", "", "k").append({"role": "user", "content": "x"}).count == 1


def test_two_stores_creating_one_file_at_once(tmp_path: Path) -> None:
    """A second open racing the creation of the schema sees it created, not half made."""
    path = tmp_path / "race.db"
    first, second = Store(path), Store(path)
    try:
        first.buffer("s", "", "k").append({"role": "user", "content": "a"})
        assert second.buffer("s", "", "k").read()[0]["content"] == "a"
    finally:
        first.close()
        second.close()


def test_vacuum_and_backup_errors_are_typed(tmp_path: Path) -> None:
    """vacuum on a read-only store and a backup into a missing folder raise FlowdropErrors."""
    path = tmp_path / "x.db"
    _flowdrop_file(path, messages=2)
    with Store(path, read_only=True) as store, pytest.raises(ReadOnlyStore):
        store.vacuum()
    with Store(path) as store, pytest.raises(FlowdropError, match="cannot back up"):
        store.backup(tmp_path / "no" / "such" / "copy.db")

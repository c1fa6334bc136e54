"""Files that are not what they seem: each gets a typed error, and is never modified."""

from __future__ import annotations

import os
import random
import re
import sqlite3
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from flowdrop_local import (
    BackupTargetExists,
    DatabaseNotFound,
    FlowdropError,
    InvalidArgument,
    NotADatabase,
    NotAFlowdropDatabase,
    ReadOnlyStore,
    SchemaTooNew,
    Store,
)
from flowdrop_local.cli import cli


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
        (_text, NotADatabase, "x.db is not an SQLite database"),
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


@pytest.mark.parametrize("create", [True, False])
def test_missing_folder_is_a_clear_error(tmp_path: Path, create: bool) -> None:
    """A path whose folder does not exist: DatabaseNotFound saying which folder is missing."""
    folder = tmp_path / "no" / "such"
    with pytest.raises(DatabaseNotFound, match=f"the folder {re.escape(str(folder))} does not"):
        Store(folder / "folder.db", create=create)
    assert isinstance(DatabaseNotFound("x"), FileNotFoundError)


def test_empty_file_becomes_a_fresh_store(tmp_path: Path) -> None:
    """A zero-byte file is an empty SQLite database: it gets the schema (when it is the
    user's own and private: test_paths says which empty files are refused)."""
    path = tmp_path / "empty.db"
    path.touch(mode=0o600)
    os.chmod(path, 0o600)
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
    with Store(path) as store, pytest.raises(DatabaseNotFound, match=r"folder .* does not exist"):
        store.backup(tmp_path / "no" / "such" / "copy.db")


# ------------------------------------------------------ file modes (issue 10 A2)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_database_sidecars_and_backup_are_private(tmp_path: Path, umask: int) -> None:
    """The database, its -wal and -shm, and a backup are 0600, whatever the umask.

    (The suite runs as root, which ignores permissions, not the mode bits tested here.)
    """
    old = os.umask(umask)
    try:
        path = tmp_path / "x.db"
        with Store(path) as store:
            store.buffer("s", "", "k").append({"role": "user", "content": "private"})
            made = {p.name: _mode(p) for p in tmp_path.iterdir()}
            store.backup(tmp_path / "copy.db")
        with Store(tmp_path / "copy.db") as copy:  # the copy's own sidecars too
            assert copy.buffer("s", "", "k").read()[0]["content"] == "private"
            made |= {p.name: _mode(p) for p in tmp_path.iterdir()}
    finally:
        os.umask(old)
    assert set(made) >= {"x.db", "x.db-wal", "x.db-shm", "copy.db", "copy.db-wal", "copy.db-shm"}
    assert made == dict.fromkeys(made, 0o600)


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    """Only files the library creates are made private: a user's own choice for an
    existing database stays. (An existing empty file that is not private gets no schema:
    test_paths.test_an_empty_file_that_is_not_private_gets_no_schema.)"""
    path = tmp_path / "shared.db"
    Store(path).close()
    os.chmod(path, 0o640)
    Store(path).close()
    assert _mode(path) == 0o640


# ------------------------------------------------- backup targets (issue 10 A3)


def _dangling_link(target: Path) -> None:
    target.symlink_to(target.parent / "elsewhere.db")


def _link_to_a_file(target: Path) -> None:
    (target.parent / "elsewhere.db").write_bytes(b"precious")
    target.symlink_to(target.parent / "elsewhere.db")


def _a_file(target: Path) -> None:
    target.write_bytes(b"precious")


def _a_folder(target: Path) -> None:
    target.mkdir()


def _entries(folder: Path) -> dict[str, object]:
    """Each entry of ``folder``: a link's target, a folder's listing, or a file's bytes."""
    entries: dict[str, object] = {}
    for p in sorted(folder.iterdir()):
        if p.is_symlink():
            entries[p.name] = ("link", os.readlink(p))
        elif p.is_dir():
            entries[p.name] = ("folder", _entries(p))
        else:
            entries[p.name] = p.read_bytes()
    return entries


@pytest.mark.parametrize(
    "plant",
    [_dangling_link, _link_to_a_file, _a_file, _a_folder],
    ids=["dangling-link", "link-to-a-file", "file", "folder"],
)
def test_backup_never_writes_through_or_over_what_is_at_the_target(
    tmp_path: Path, plant: object
) -> None:
    """Anything at the target (a link, even dangling): BackupTargetExists; nothing written."""
    _flowdrop_file(tmp_path / "x.db", messages=2)
    target = tmp_path / "copy.db"
    plant(target)  # type: ignore[operator]
    before = _entries(tmp_path)
    with Store(tmp_path / "x.db") as store, pytest.raises(BackupTargetExists):
        store.backup(target)
    assert _entries(tmp_path) == before  # a dangling link still dangles


def test_backup_target_made_after_a_check_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that appears between a look at the target and its opening survives.

    The race is staged by making ``os.path.exists`` answer False, as it would have
    just before the other process created the file.
    """
    _flowdrop_file(tmp_path / "x.db", messages=2)
    target = tmp_path / "copy.db"
    target.write_bytes(b"created by someone else a moment ago")
    with Store(tmp_path / "x.db") as store:
        monkeypatch.setattr(os.path, "exists", lambda _: False)
        with pytest.raises(BackupTargetExists):
            store.backup(target)
    assert target.read_bytes() == b"created by someone else a moment ago"


def test_a_failed_backup_leaves_no_file(tmp_path: Path) -> None:
    """A backup from a closed store raises StoreClosed and creates nothing."""
    _flowdrop_file(tmp_path / "x.db", messages=2)
    store = Store(tmp_path / "x.db")
    store.close()
    before = _files(tmp_path)
    with pytest.raises(FlowdropError):
        store.backup(tmp_path / "copy.db")
    assert _files(tmp_path) == before


@pytest.mark.parametrize(
    "target",
    [5, None, b"copy.db", "", "co\x00py.db"],
    ids=["int", "None", "bytes", "empty", "NUL"],
)
def test_backup_target_that_is_not_a_path_is_invalid_argument(
    tmp_path: Path, target: object
) -> None:
    """backup(5) and friends: InvalidArgument (a FlowdropError), nothing created."""
    _flowdrop_file(tmp_path / "x.db", messages=2)
    before = _files(tmp_path)
    with Store(tmp_path / "x.db") as store, pytest.raises(InvalidArgument):
        store.backup(target)  # type: ignore[arg-type]
    assert _files(tmp_path) == before


# ---------------------------------------- commands that only read (issue 10 A4)


def test_create_false_refuses_a_missing_file_and_creates_nothing(tmp_path: Path) -> None:
    """Store(path, create=False): DatabaseNotFound naming the path; the folder stays empty."""
    path = tmp_path / "typo.db"
    with pytest.raises(DatabaseNotFound, match=re.escape(str(path)) + " does not exist"):
        Store(path, create=False)
    assert list(tmp_path.iterdir()) == []


def test_create_false_does_not_write_a_schema_into_an_empty_file(tmp_path: Path) -> None:
    """An existing empty file is not a flowdrop_local database yet: refused, left empty."""
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(NotAFlowdropDatabase, match="empty"):
        Store(path, create=False)
    assert path.stat().st_size == 0


def test_create_false_opens_an_existing_store(tmp_path: Path) -> None:
    """An existing flowdrop_local file opens as usual with create=False."""
    _flowdrop_file(tmp_path / "x.db", messages=2)
    with Store(tmp_path / "x.db", create=False) as store:
        assert not store.created
        assert len(store.buffer("session", "s", "chat")) == 2


READ_ONLY_COMMANDS = [
    ["check"],
    ["check", "--json"],
    ["show", "session", "s", "chat"],
    ["show", "session", "s", "chat", "--format", "anthropic"],
    ["export"],
    ["vacuum"],
    ["backup", "{tmp}/copy.db"],
    ["sessions", "list", "--as", "alice"],
    ["sessions", "show", "0" * 8 + "-0000-7000-8000-" + "0" * 12, "--admin"],
]


@pytest.mark.parametrize(
    "args", READ_ONLY_COMMANDS, ids=[" ".join(a[:2]) for a in READ_ONLY_COMMANDS]
)
def test_read_only_commands_refuse_a_missing_database(tmp_path: Path, args: list[str]) -> None:
    """check/show/export/vacuum/backup/sessions on a typo: one Error line, exit 2, no file."""
    path = tmp_path / "typo.db"
    argv = ["--db", str(path), *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert f"Error: {path} does not exist" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["import", "-"], '{"not": "a record"}\n'),
        (["import", "-"], "not json\n"),
        (["append", "s", "", "k", "--json", '{"role": "robot"}'], None),
        (["sessions", "create", "--as", "alice", " "], None),
    ],
    ids=["import-bad-record", "import-bad-json", "append-bad-message", "session-bad-workflow"],
)
def test_a_failed_command_leaves_no_file_it_created(
    tmp_path: Path, args: list[str], stdin: str | None
) -> None:
    """A command that would create the database but fails leaves the folder as it was."""
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "new.db"), *args], input=stdin)
    assert result.exit_code == 2, result.output
    assert list(tmp_path.iterdir()) == []


def test_a_failed_command_keeps_a_database_it_did_not_create(tmp_path: Path) -> None:
    """The clean-up only removes what the failing command made."""
    path = tmp_path / "x.db"
    _flowdrop_file(path, messages=2)
    result = CliRunner().invoke(cli, ["--db", str(path), "import", "-"], input="not json\n")
    assert result.exit_code == 2
    with Store(path) as store:
        assert len(store.buffer("session", "s", "chat")) == 2

"""What may be at the database path, and what may be beside our tables (issue 21, C and E).

* A symbolic link at the database path (or at its -wal, -shm or -journal) is
  refused with ``SymlinkRefused``: nothing is written through it, created at its
  target, or removed.
* A libpq keyword/value string given as a path is refused with ``InvalidArgument``
  (its values, a password among them, are not shown), instead of becoming a file.
* The user's own views are allowed, on our tables too (a view runs only when a
  statement reads it, and none of ours reads a view), unless one takes a name the
  library uses; triggers stay refused: they run inside our statements.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import flowdrop_local._files as files
from flowdrop_local import (
    FlowdropError,
    InvalidArgument,
    NotAFlowdropDatabase,
    Store,
    SymlinkRefused,
    UnsafeFile,
)
from flowdrop_local.cli import cli

from .conftest import SLOW_TESTS

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def _entries(folder: Path) -> dict[str, object]:
    """Each entry of ``folder``: a link's target, or a file's bytes and mode."""
    entries: dict[str, object] = {}
    for p in sorted(folder.iterdir()):
        if p.is_symlink():
            entries[p.name] = ("link", os.readlink(p))
        else:
            entries[p.name] = (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
    return entries


def _store_file(path: Path | str) -> None:
    with Store(path) as store:
        store.buffer("session", "s", "chat").append({"role": "user", "content": "secret"})


def _append(db: str) -> list[str]:
    return ["--db", db, "append", "session", "s", "chat", "--role", "user", "--content", "hi"]


# ------------------------------------------------------ links at the database path

OPENS: dict[str, Callable[[Path], object]] = {
    "Store": lambda path: Store(path).close(),
    "create=False": lambda path: Store(path, create=False).close(),
    "read_only": lambda path: Store(path, read_only=True).close(),
}


@pytest.mark.parametrize("open_", OPENS.values(), ids=OPENS.keys())
def test_a_dangling_link_at_the_database_path_is_refused(
    tmp_path: Path, open_: Callable[[Path], object]
) -> None:
    """No database is created where the link points (it was, mode 0644); the link dangles on."""
    link = tmp_path / "chat.db"
    link.symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(SymlinkRefused, match=r"chat\.db is a symbolic link"):
        open_(link)
    assert _entries(tmp_path) == {"chat.db": ("link", str(tmp_path / "elsewhere.db"))}


def test_append_refuses_a_dangling_link_at_db(tmp_path: Path) -> None:
    """The command of the report: one Error line, exit 2, nothing made at the link's target."""
    link = tmp_path / "chat.db"
    link.symlink_to(tmp_path / "elsewhere.db")
    result = CliRunner().invoke(cli, _append(str(link)))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: {link} is a symbolic link")
    assert _entries(tmp_path) == {"chat.db": ("link", str(tmp_path / "elsewhere.db"))}


TARGETS: dict[str, Callable[[Path], None]] = {
    "empty-file": lambda path: path.touch(),
    "text-file": lambda path: path.write_text("my notes\n"),
    "flowdrop-database": _store_file,
}


@pytest.mark.parametrize("make", TARGETS.values(), ids=TARGETS.keys())
@pytest.mark.parametrize(
    "args",
    [["append", "session", "s", "chat", "--role", "user", "--content", "hi"], ["check"]],
    ids=["append", "check"],
)
def test_a_link_to_an_existing_file_is_refused_and_the_file_kept(
    tmp_path: Path, make: Callable[[Path], None], args: list[str]
) -> None:
    """The file a link names is never opened through it: an empty one is not overwritten."""
    target = tmp_path / "elsewhere.db"
    make(target)
    link = tmp_path / "chat.db"
    link.symlink_to(target)
    before = _entries(tmp_path)
    result = CliRunner().invoke(cli, ["--db", str(link), *args])
    assert result.exit_code == 2, result.output
    assert "is a symbolic link" in result.stderr
    with pytest.raises(SymlinkRefused):
        Store(link)
    assert _entries(tmp_path) == before


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_link_at_a_sidecar_is_refused_by_name(tmp_path: Path, suffix: str) -> None:
    """A link planted as the -wal, -shm or -journal: SymlinkRefused naming it (SQLite's own
    refusal read as a corrupt file), and the file it names is untouched."""
    path = tmp_path / "chat.db"
    _store_file(path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f"chat.db{suffix}").symlink_to(victim)
    before = _entries(tmp_path)
    with pytest.raises(SymlinkRefused, match=rf"chat\.db{suffix} is a symbolic link"):
        Store(path).buffer("session", "s", "chat").append({"role": "user", "content": "x"})
    assert _entries(tmp_path) == before


def _swap_in_a_link(name: str, victim: Path) -> None:
    os.unlink(name)
    os.symlink(victim, name)


def _swap_in_a_file(name: str, victim: Path) -> None:
    shutil.copyfile(victim, name + ".new")
    os.replace(name + ".new", name)


@pytest.mark.parametrize(
    ("swap", "error"),
    [(_swap_in_a_link, SymlinkRefused), (_swap_in_a_file, FlowdropError)],
    ids=["link", "file"],
)
def test_what_is_put_in_place_of_a_new_database_is_not_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    swap: Callable[[str, Path], None],
    error: type[FlowdropError],
) -> None:
    """The database is created as backup creates its target: exclusive, no link followed,
    and the file SQLite opened must still be the one created; what took its place is
    neither written nor removed.

    The race (a link or a file swapped in between the creation and SQLite's open) is
    staged by doing the swap right after the library creates the file.
    """
    path = tmp_path / "chat.db"
    victim = tmp_path / "victim.db"
    victim.touch()
    create = files.create_private

    def create_then_swap(name: str) -> int:
        fd = create(name)
        swap(name, victim)
        return fd

    monkeypatch.setattr(files, "create_private", create_then_swap)
    with pytest.raises(error, match=r"symbolic link|was replaced"):
        Store(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.db", "victim.db"]
    assert victim.read_bytes() == b""  # no schema written into it
    assert path.is_symlink() if swap is _swap_in_a_link else path.read_bytes() == b""


def test_a_new_database_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """The file append creates is 0600 with umask 000 (the report found 0644 through a link)."""
    old = os.umask(0)
    try:
        result = CliRunner().invoke(cli, _append(str(tmp_path / "chat.db")))
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {
        "chat.db": 0o600
    }


# ------------------------------------------------------- libpq keyword strings

CONNINFO = [
    "dbname=chat host=localhost",
    "host=localhost port=5432 dbname=chat user=me password=hunter2",
    "host = db.example.org  password='s3cret pass' dbname=chat",
    "service=chat",
]


@pytest.mark.parametrize("conninfo", CONNINFO)
def test_a_libpq_keyword_string_is_refused_not_made_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conninfo: str
) -> None:
    """InvalidArgument pointing at the postgresql:// form, without the values; no file."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgument, match="postgresql://") as caught:
        Store(conninfo)
    for word in ("hunter2", "s3cret", "localhost", "db.example.org"):
        assert word not in str(caught.value)
    result = CliRunner().invoke(cli, _append(conninfo))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: ") and "postgresql://" in result.stderr
    assert "hunter2" not in result.output and "s3cret" not in result.output
    monkeypatch.setenv("FLOWDROP_DB", conninfo)
    assert CliRunner().invoke(cli, _append(conninfo)[2:]).exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_a_keyword_string_is_refused_as_a_backup_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """backup would make a file of that name too."""
    monkeypatch.chdir(tmp_path)
    _store_file(tmp_path / "chat.db")
    before = _entries(tmp_path)
    with Store(tmp_path / "chat.db") as store, pytest.raises(InvalidArgument, match="postgres"):
        store.backup("dbname=copy host=localhost")
    assert _entries(tmp_path) == before


@pytest.mark.parametrize("name", ["./dbname=chat", "notes=1 more=2", "chat.db", "a b.db"])
def test_file_names_that_are_not_keyword_strings_still_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """``./`` before a name makes it a path; words that are not libpq's keywords are a name."""
    monkeypatch.chdir(tmp_path)
    _store_file(name)  # a str: Path would drop the ./
    assert (tmp_path / name).is_file()


# ------------------------------------------------------------- the user's views

USERS_VIEW = (
    "CREATE VIEW chat_lines AS SELECT b.scope, b.scope_id, b.key, m.role, m.content "
    "FROM messages AS m JOIN buffers AS b ON b.id = m.buffer_id"
)


def test_the_users_view_on_our_tables_is_allowed(tmp_path: Path) -> None:
    """A view for sqlite-utils or Datasette: every command works, check included."""
    path = tmp_path / "chat.db"
    _store_file(path)
    conn = sqlite3.connect(path)
    conn.executescript(USERS_VIEW)
    conn.close()
    with Store(path) as store:
        store.buffer("session", "s", "chat").append({"role": "user", "content": "more"})
        assert store.check() == []
    with Store(path, read_only=True) as store:
        assert len(store.buffer("session", "s", "chat")) == 2
    result = CliRunner().invoke(cli, ["--db", str(path), "check"])
    assert result.exit_code == 0, result.output
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT content FROM chat_lines ORDER BY content").fetchall() == [
        ("more",),
        ("secret",),
    ]
    conn.close()


def test_a_view_made_through_store_db_is_not_a_finding_of_check(tmp_path: Path) -> None:
    """check() reported a view on our tables made after the open; it is the user's."""
    with Store(tmp_path / "chat.db") as store:
        store.buffer("session", "s", "chat").append({"role": "user", "content": "x"})
        store.db.execute(USERS_VIEW)
        assert store.check() == []


def test_an_upgrade_keeps_the_users_view_on_a_table_it_does_not_rebuild(tmp_path: Path) -> None:
    """A version-2 file with a view on memory (the upgrade rebuilds buffers, messages and
    tool_calls only) upgrades, and the view still reads."""
    path = tmp_path / "v2.db"
    shutil.copyfile(FIXTURES / "v2.db", path)
    conn = sqlite3.connect(path)
    conn.execute("CREATE VIEW memory_keys AS SELECT scope, key FROM memory")
    conn.close()
    with Store(path) as store:
        assert store.check() == []
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone() == (3,)
    conn.execute("SELECT * FROM memory_keys").fetchall()
    conn.close()


@pytest.mark.parametrize(
    "name", ["message_search", "message_search_text", "flowdrop_sync_replica", "Flowdrop_Later"]
)
def test_a_view_taking_a_name_the_library_uses_is_refused(tmp_path: Path, name: str) -> None:
    """The search index's and sync's tables are made when first needed, and every
    ``flowdrop_`` name is kept for later ones: a view in their place would feed our
    statements its rows."""
    path = tmp_path / "chat.db"
    _store_file(path)
    conn = sqlite3.connect(path)
    conn.execute(f'CREATE VIEW "{name}" AS SELECT 1 AS x')
    conn.close()
    before = _entries(tmp_path)
    with pytest.raises(NotAFlowdropDatabase, match=f"view {name} .*takes a name"):
        Store(path)
    assert _entries(tmp_path) == before


TRIGGERS = {
    "instead-of-on-the-users-view": (
        USERS_VIEW + "; CREATE TRIGGER chat_lines_insert INSTEAD OF INSERT ON chat_lines "
        "BEGIN DELETE FROM messages; END"
    ),
    "on-our-table": "CREATE TRIGGER spy AFTER INSERT ON messages BEGIN SELECT 1; END",
}


@pytest.mark.parametrize("sql", TRIGGERS.values(), ids=TRIGGERS.keys())
def test_triggers_naming_our_tables_stay_refused(tmp_path: Path, sql: str) -> None:
    """A trigger runs inside the statement that fires it: refused, the view beside it is not."""
    path = tmp_path / "chat.db"
    _store_file(path)
    conn = sqlite3.connect(path)
    conn.executescript(sql)
    conn.close()
    with pytest.raises(NotAFlowdropDatabase, match="trigger") as caught:
        Store(path)
    assert "view chat_lines" not in str(caught.value)
    assert isinstance(caught.value, FlowdropError)


# -------------------------------------------------------- the suite's own files


def test_the_postgresql_server_keeps_its_files_outside_pytests_shared_root(
    postgresql_server: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Another pytest run by the same user makes pytest's shared root owner-only again;
    the embedded server, running as its own user, then lost a data folder kept there."""
    if os.environ.get("FLOWDROP_TEST_POSTGRESQL_URL"):
        pytest.skip("the server is FLOWDROP_TEST_POSTGRESQL_URL's, not the suite's")
    import psycopg

    with psycopg.connect(postgresql_server) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    data = Path(row[0]).resolve()
    basetemp = tmp_path_factory.getbasetemp().resolve()
    shared = basetemp.parent if basetemp.parent.name.startswith("pytest-of-") else basetemp
    assert shared not in data.parents, data


def test_the_slowest_tests_are_marked_slow(pytestconfig: pytest.Config) -> None:
    """``-m "not slow"`` leaves out the slowest tests (docs/index.md: how long each part takes);
    each test SLOW_TESTS names still exists, and collection marks it."""
    assert any(line.startswith("slow:") for line in pytestconfig.getini("markers"))
    gone = [
        f"{file}::{name}"
        for file, name in SLOW_TESTS
        if f"def {name}(" not in (REPO / "tests" / file).read_text(encoding="utf-8")
    ]
    assert gone == []
    files = ["tests/test_crash.py", "tests/test_quality.py"]
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    marked = {line.split("[")[0] for line in listed.stdout.splitlines() if "::" in line}
    assert marked == {
        "tests/test_crash.py::test_fifty_sigkills_lose_nothing_and_leave_a_sound_file",
        "tests/test_quality.py::test_mypy_strict_is_clean",
    }, listed.stdout[-2000:]


# ------------------------------------- what is at the path: its kind, owner and mode

NOT_FILES: dict[str, Callable[[Path], None]] = {
    "fifo": lambda path: os.mkfifo(path),
    "folder": lambda path: path.mkdir(),
    "socket": lambda path: _bind_socket(path),
}


def _bind_socket(path: Path) -> None:
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the socket file stays


@pytest.mark.parametrize("open_", ["Store", "create=False", "read_only"])
@pytest.mark.parametrize("make", NOT_FILES.values(), ids=NOT_FILES.keys())
def test_what_is_not_a_regular_file_is_refused_on_every_open(
    tmp_path: Path, make: Callable[[Path], None], open_: str
) -> None:
    """A FIFO at the path made Store(path, read_only=True) wait for ever (an O_RDONLY open
    of a FIFO blocks until a writer comes); each kind is now NotADatabase, before SQLite
    opens it. Run in a child, so that a hang fails the test instead of stopping the run."""
    path = tmp_path / "chat.db"
    make(path)
    arguments = {"Store": "", "create=False": ", create=False", "read_only": ", read_only=True"}
    code = (
        "import sys, flowdrop_local as f\n"
        "try:\n"
        f"    f.Store(sys.argv[1]{arguments[open_]})\n"
        "except f.NotADatabase as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=30
    )
    assert "not a regular file" in done.stdout, done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.db"]


@pytest.mark.parametrize("command", [["check"], ["serve", "--no-browser"], ["buffers"]])
def test_the_cli_refuses_a_fifo_at_db_instead_of_waiting(
    tmp_path: Path, command: list[str]
) -> None:
    """``check`` and ``serve`` hung on a FIFO at --db; now one Error line, exit 2."""
    path = tmp_path / "chat.db"
    os.mkfifo(path)
    done = subprocess.run(
        [sys.executable, "-m", "flowdrop_local.cli", "--db", str(path), *command],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"Error: {path} is a FIFO (named pipe), not a regular file; a database is a file: "
        "check the path, --db or FLOWDROP_DB"
    ]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o666, 0o604])
def test_an_empty_file_that_is_not_private_gets_no_schema(tmp_path: Path, mode: int) -> None:
    """An empty file already at the path (made by someone, with group or other bits) had
    the schema written into it, and the -wal and -shm took its mode; now UnsafeFile and
    the file is left as it was."""
    path = tmp_path / "chat.db"
    path.touch()
    path.chmod(mode)
    with pytest.raises(UnsafeFile, match=rf"chat\.db exists, empty, .*mode {mode:04o}"):
        _store_file(path)
    assert _entries(tmp_path) == {"chat.db": (b"", mode)}


def test_an_empty_file_with_a_second_link_gets_no_schema(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    path.touch()
    path.chmod(0o600)
    os.link(path, tmp_path / "other-name")
    with pytest.raises(UnsafeFile, match="2 link"):
        _store_file(path)
    assert path.read_bytes() == b""


def test_an_empty_private_file_of_ours_becomes_the_database(tmp_path: Path) -> None:
    """Pre-creating the file oneself (mode 0600) still works."""
    path = tmp_path / "chat.db"
    path.touch()
    path.chmod(0o600)
    _store_file(path)
    with Store(path) as store:
        assert store.buffer("session", "s", "chat").read()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_cli_append_refuses_a_planted_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    path.touch()
    path.chmod(0o666)
    result = CliRunner().invoke(cli, _append(str(path)))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: {path} exists, empty")
    assert len(result.stderr.strip().splitlines()) == 1
    assert path.read_bytes() == b""


NOBODY = 65534
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root"
)


@as_root
@pytest.mark.parametrize("mode", [0o600, 0o666])
def test_an_empty_file_another_user_planted_gets_no_schema(tmp_path: Path, mode: int) -> None:
    """The review's case: another user (nobody) makes an empty file, 0666, in a shared
    folder; Store(path) wrote the schema and the messages into it, and nobody read them."""
    path = tmp_path / "chat.db"
    path.touch()
    path.chmod(mode)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(UnsafeFile, match=rf"owned by uid {NOBODY}"):
        _store_file(path)
    assert _entries(tmp_path) == {"chat.db": (b"", mode)}


@as_root
@pytest.mark.parametrize("suffix", ["", "-wal", "-journal"])
def test_another_users_writable_database_is_not_written(tmp_path: Path, suffix: str) -> None:
    """A database (or a sidecar beside it) another user owns and others may write is
    refused for writing; read-only, the database still opens."""
    path = tmp_path / "chat.db"
    _store_file(path)
    planted = Path(str(path) + suffix)
    planted.touch()
    planted.chmod(0o666)
    os.chown(planted, NOBODY, NOBODY)
    before = _entries(tmp_path)
    with pytest.raises(UnsafeFile, match="writable by group or others"):
        _store_file(path)
    assert _entries(tmp_path) == before
    if not suffix:
        with Store(path, read_only=True) as store:
            assert store.buffer("session", "s", "chat").read()


@as_root
def test_another_users_private_database_still_opens(tmp_path: Path) -> None:
    """Not writable by group or others: the file is its owner's, and opening it (root
    reading a user's store, say) is not refused."""
    path = tmp_path / "chat.db"
    _store_file(path)
    os.chown(path, NOBODY, NOBODY)
    _store_file(path)

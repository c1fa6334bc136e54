"""`flowdrop-local copy` and export format 2: everything moves, losslessly, both ways.

SQLite to PostgreSQL and back: ids, positions exactly as stored, timestamps,
healed marks, content parts, sessions, their viewers and memory values. A target
that already holds what would be copied is refused unless ``--replace``, and a
refused copy writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from flowdrop_local import ExecutionContext, InvalidImport, Principal, Store
from flowdrop_local.cli import cli

from .test_portability import _rich_history


def _everything(store: Store) -> None:
    _rich_history(store)
    api = store.sessions(Principal("alice"))
    session = api.create("wf", name="trip", metadata={"topic": "lisbon"})
    api.grant(session.id, "bob")
    api.drive(session.id, {"role": "user", "content": "hi from a session"})
    api.reset(session.id)
    store.memory_set(ExecutionContext(user_id="alice"), "user", "prefs", {"units": "metric"})
    store.memory_set(None, "global", "motd", "hello")


def _full(store: Store) -> list[dict[str, object]]:
    return list(store.export(full=True))


def _copy(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, ["copy", "--quiet", *args])
    assert result.exit_code == 0, result.output
    report: dict[str, object] = json.loads(result.stdout)
    return report


def test_copy_sqlite_to_postgresql_and_back_is_lossless(
    tmp_path: Path, postgresql_url: str
) -> None:
    """a.db -> PostgreSQL -> b.db: the three complete exports are equal, and show agrees."""
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    with Store(a) as source:
        _everything(source)
        original = _full(source)
    report = _copy(a, postgresql_url)
    assert (report["sessions"], report["viewers"], report["memory"]) == (1, 1, 2)
    assert report["healed"] == 0 and report["dropped"] == 0  # stored as it was, not re-healed
    with Store(postgresql_url) as middle:
        assert _full(middle) == original
        assert middle.check() == []
        bob = middle.sessions(Principal("bob"))
        assert [s.name for s in bob.list()] == ["trip"]  # the grant came along (MEM-15)
        assert middle.memory_get(ExecutionContext(user_id="alice"), "user", "prefs").value == {
            "units": "metric"
        }
    _copy(postgresql_url, b)
    with Store(b) as back:
        assert _full(back) == original
        assert back.check() == []
    shows = [
        CliRunner().invoke(cli, ["--db", db, "show", "session", "s1", "chat"]).stdout
        for db in (a, postgresql_url, b)
    ]
    assert shows[0] and shows[0] == shows[1] == shows[2]


def test_copy_refuses_what_exists_unless_replace(tmp_path: Path) -> None:
    """A buffer, session or memory key already in the target: refused, nothing written."""
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    with Store(a) as source:
        _everything(source)
    _copy(a, b)
    with Store(b) as target:
        before = _full(target)
        target.buffer("session", "s1", "chat").append({"role": "user", "content": "new"})
        changed = _full(target)
    again = CliRunner().invoke(cli, ["copy", "--quiet", a, b])
    assert again.exit_code == 2 and "already" in again.stderr and "--replace" in again.stderr
    with Store(b) as target:
        assert _full(target) == changed  # the refused copy wrote nothing
    _copy("--replace", a, b)
    with Store(b) as target:
        assert _full(target) == before
        assert target.check() == []


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({"record": "session", "id": "s"}, "must be a"),
        ({"record": "planet"}, "unknown record kind"),
        ({"record": ["session"]}, "unknown record kind"),  # not hashable: was a TypeError
        ({"record": {"kind": "memory"}}, "unknown record kind"),
        ({"record": 7}, "unknown record kind"),
        ({"flowdrop_export": 3}, "upgrade flowdrop_local"),
        ({"flowdrop_export": "2"}, "header"),
        (
            {
                "record": "memory",
                "scope": "user",
                "scope_id": "0",
                "key": "k",
                "value": 1,
                "created_at": "t",
                "updated_at": "t",
            },
            "refuses",
        ),
        (
            {"record": "viewer", "session_id": "missing", "user_id": "bob", "granted_at": "t"},
            "viewer",
        ),
    ],
)
def test_bad_format_2_records_are_refused_by_line(
    store: Store, record: dict[str, object], problem: str
) -> None:
    """Each bad side record is an InvalidImport naming its line; nothing is written."""
    with pytest.raises(InvalidImport, match=problem) as refused:
        store.import_records([{"flowdrop_export": 2}, record])
    assert refused.value.line == 2
    assert _full(store) == [{"flowdrop_export": 2}]


def test_a_version_1_file_still_imports(store: Store) -> None:
    """Messages only, no header: the format every earlier export wrote."""
    with Store(":memory:") as source:
        _rich_history(source)
        old = list(source.export())
    assert "flowdrop_export" not in old[0]
    store.import_records(old)
    assert list(store.export()) == old


def test_copy_of_a_missing_source_creates_nothing(tmp_path: Path) -> None:
    """copy refuses a source that does not exist, and leaves no target behind."""
    result = CliRunner().invoke(cli, ["copy", str(tmp_path / "nope.db"), str(tmp_path / "t.db")])
    assert result.exit_code == 2 and "Error:" in result.stderr
    assert not (tmp_path / "nope.db").exists() and not (tmp_path / "t.db").exists()


def test_copy_onto_itself_is_refused(tmp_path: Path) -> None:
    """SOURCE and TARGET naming one database is bad input."""
    db = str(tmp_path / "a.db")
    Store(db).close()
    result = CliRunner().invoke(cli, ["copy", db, db])
    assert result.exit_code == 2 and "same database" in result.stderr


def test_the_cli_runs_on_postgresql(postgresql_url: str) -> None:
    """--db takes a URL: demo, show and check work there, and the password never shows."""
    demo = CliRunner().invoke(cli, ["--db", postgresql_url, "demo"])
    assert demo.exit_code == 0, demo.output
    assert "Tool call was interrupted" in demo.stdout or "interrupted" in demo.stdout
    shown = CliRunner().invoke(
        cli, ["--db", postgresql_url, "show", "demo", "local", "weather-agent"]
    )
    assert shown.exit_code == 0 and "Lisbon" in shown.stdout
    checked = CliRunner().invoke(cli, ["--db", postgresql_url, "check"])
    assert checked.exit_code == 0 and checked.stdout.strip().endswith("ok")


def test_the_cli_never_prints_a_password(postgresql_url: str) -> None:
    """A URL with a password (the test server trusts, so it is ignored): check and demo
    print the URL with *** in its place."""
    assert "postgres:@" in postgresql_url
    url = postgresql_url.replace("postgres:@", "postgres:s3cret@", 1)
    for command in (["demo"], ["check"], ["show", "demo", "local", "weather-agent"]):
        result = CliRunner().invoke(cli, ["--db", url, *command])
        assert result.exit_code == 0, result.output
        assert "s3cret" not in result.stdout + result.stderr

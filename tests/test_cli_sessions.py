"""``flowdrop-local sessions create|list|show`` with --as and --admin, on real files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from flowdrop_local import Principal, Store
from flowdrop_local.cli import cli

from .conftest import snapshot


def run(db: Path, *args: str) -> click.testing.Result:
    return CliRunner().invoke(cli, ["--db", str(db), "sessions", *args], catch_exceptions=False)


def create(db: Path, *args: str) -> dict[str, Any]:
    result = run(db, "create", *args)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_create_list_show_as_the_owner(db_path: Path) -> None:
    """alice creates a session, lists it, and shows it with its conversation."""
    session = create(
        db_path, "wf1", "--name", "support", "--metadata", '{"tier": 2}', "--as", "alice"
    )
    assert (session["owner_id"], session["status"], session["metadata"]) == (
        "alice",
        "active",
        {"tier": 2},
    )
    with Store(db_path) as store:
        store.sessions(Principal("alice")).drive(session["id"], {"role": "user", "content": "hi"})
    listed = run(db_path, "list", "--as", "alice", "--json")
    assert [s["id"] for s in json.loads(listed.stdout)] == [session["id"]]
    shown = run(db_path, "show", session["id"], "--as", "alice", "--json")
    data = json.loads(shown.stdout)
    assert data["session"] == session
    assert data["messages"] == [{"role": "user", "content": "hi", "metadata": {}}]
    text = run(db_path, "show", session["id"], "--as", "alice")
    assert "owner alice" in text.stdout and "user      hi" in text.stdout
    table = run(db_path, "list", "--as", "alice")
    assert session["id"] in table.stdout and "support" in table.stdout


def test_admin_creates_an_ownerless_session_nobody_else_sees(db_path: Path) -> None:
    """--admin --no-owner makes a session owned by nobody; an anonymous caller cannot see it."""
    session = create(db_path, "wf1", "--admin", "--no-owner")
    assert session["owner_id"] is None
    assert json.loads(run(db_path, "list", "--json").stdout) == []
    assert json.loads(run(db_path, "list", "--as", "0", "--json").stdout) == []
    assert [s["id"] for s in json.loads(run(db_path, "list", "--admin", "--json").stdout)] == [
        session["id"]
    ]
    assert "(nobody)" in run(db_path, "list", "--admin").stdout


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["show", "{id}", "--as", "bob"], "view_denied"),
        (["show", "{id}"], "view_denied"),
        (["show", "{id}", "--as", "0"], "view_denied"),
        (["show", "no-such-session", "--admin"], "session_unavailable"),
        (["create", "wf1"], "create_denied"),
        (["create", "wf1", "--as", "bob", "--owner", "alice"], "create_denied"),
        (["create", "wf1", "--as", "bob", "--no-owner"], "create_denied"),
    ],
)
def test_denials_exit_3_and_name_their_code(db_path: Path, args: list[str], code: str) -> None:
    """A denial is one 'Error: access denied (code)' line, exit status 3, nothing written."""
    session = create(db_path, "wf1", "--as", "alice")
    before = snapshot(db_path)
    result = run(db_path, *[a.replace("{id}", session["id"]) for a in args])
    assert result.exit_code == 3
    assert result.stderr.strip() == result.stderr.strip().splitlines()[0]
    assert f"Error: access denied ({code})" in result.stderr
    assert snapshot(db_path) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "  ", "--as", "alice"], "workflow id must not be blank"),
        (["create", "wf1", "--as", "alice", "--metadata", "{"], "--metadata is not valid JSON"),
        (["create", "wf1", "--as", "alice", "--metadata", "[1]"], "metadata must be a JSON object"),
        (["create", "wf1", "--admin", "--owner", "0"], "not a usable user identity"),
        (["create", "wf1", "--admin", "--owner", "a", "--no-owner"], "not both"),
    ],
)
def test_bad_input_exits_2(db_path: Path, args: list[str], message: str) -> None:
    """Bad input is one 'Error:' line with status 2, and writes nothing."""
    Store(db_path).close()
    before = snapshot(db_path)
    result = run(db_path, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert snapshot(db_path) == before

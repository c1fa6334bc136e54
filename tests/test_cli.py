"""The flowdrop-local command, driven through click's CliRunner on real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from flowdrop_local import Store
from flowdrop_local.cli import DEMO_ADDRESS, cli


def run(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_append_json_then_show_json(db_path: Path) -> None:
    """append prints the AppendResult; show --json prints the stored messages."""
    db = str(db_path)
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    first = run("--db", db, "append", "session", "s1", "chat", "--json", json.dumps(call))
    assert first.exit_code == 0
    assert json.loads(first.stdout) == {
        "count": 1,
        "appended": 1,
        "appended_any": True,
        "message_ids": json.loads(first.stdout)["message_ids"],
        "healed_ids": [],
        "replaced_ids": [],
        "dropped": 0,
        "evicted": 0,
    }
    second = run("--db", db, "append", "session", "s1", "chat", "--role", "user", "--content", "hi")
    report = json.loads(second.stdout)
    assert (report["count"], report["appended"], len(report["healed_ids"])) == (3, 1, 1)
    shown = run("--db", db, "show", "session", "s1", "chat", "--json")
    messages = json.loads(shown.stdout)
    assert [m["role"] for m in messages] == ["assistant", "tool", "user"]
    assert messages[1]["metadata"] == {"tool_call_id": "c1", "healed": True}
    last = json.loads(
        run("--db", db, "show", "session", "s1", "chat", "--json", "--limit", "1").stdout
    )
    assert last == [{"role": "user", "content": "hi", "metadata": {}}]


def test_show_text_marks_healed_messages(db_path: Path) -> None:
    """The text view names calls, answers and HEALED placeholders."""
    with Store(db_path) as store:
        store.buffer("s", "1", "k").append(
            [
                {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},
                {"role": "user", "content": "?"},
            ]
        )
    out = run("--db", str(db_path), "show", "s", "1", "k").stdout
    assert "calls c1:f" in out and "answers c1; HEALED" in out


def test_database_from_environment_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--db, else FLOWDROP_DB, else ./flowdrop.db."""
    monkeypatch.chdir(tmp_path)
    run("append", "s", "1", "k", "--role", "user", "--content", "default", env={"FLOWDROP_DB": ""})
    assert (tmp_path / "flowdrop.db").exists()
    env_db = tmp_path / "env.db"
    run(
        "append",
        "s",
        "1",
        "k",
        "--role",
        "user",
        "--content",
        "env",
        env={"FLOWDROP_DB": str(env_db)},
    )
    with Store(env_db) as store:
        assert store.buffer("s", "1", "k").read()[0]["content"] == "env"


def test_demo_heals_and_can_run_twice(db_path: Path) -> None:
    """demo shows the dangling call, the healed history and the late result; reruns cleanly."""
    for _ in range(2):
        result = run("--db", str(db_path), "demo")
        assert result.exit_code == 0
        assert "HEALED" in result.stdout
        assert "replaced=1" in result.stdout and "dropped=1" in result.stdout
    with Store(db_path) as store:
        history = store.buffer(*DEMO_ADDRESS).read()
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool", "user"]
    assert history[3]["content"] == "Rain, 14 C, 80%"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["append", "s", "1", "k", "--json", "{not json"], "--json is not valid JSON"),
        (["append", "s", "1", "k", "--json", '{"role": "robot"}'], "message 0: role"),
        (["append", "s", "1", "k"], "give the message"),
        (["append", "s", "1", "k", "--json", "{}", "--role", "user"], "not both"),
        (["append", "s", "1", " ", "--role", "user", "--content", "x"], "key must not be blank"),
    ],
)
def test_bad_input_is_one_line_and_status_2(db_path: Path, args: list[str], message: str) -> None:
    """Bad input: exit status 2, one 'Error:' line on stderr, no traceback."""
    result = CliRunner().invoke(cli, ["--db", str(db_path), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.startswith("Error:") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_not_a_database_is_reported_not_raised(tmp_path: Path) -> None:
    """Pointing --db at a text file gives a clear error and leaves the file alone."""
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\n" * 100)
    result = CliRunner().invoke(cli, ["--db", str(path), "show", "s", "1", "k"])
    assert result.exit_code == 2
    assert "not an SQLite database" in result.stderr
    assert path.read_text() == "just some notes\n" * 100


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        found.append((prefix + name, command))
        if isinstance(command, click.Group):
            found.extend(_commands(command, prefix + name + " "))
    return found


@pytest.mark.parametrize(
    ("name", "command"), _commands(cli), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_command_has_help(name: str, command: click.Command) -> None:
    """Every command documents itself."""
    assert command.help, f"{name} has no help text"
    result = run(*name.split(), "--help")
    assert result.exit_code == 0 and "Usage:" in result.stdout


def test_module_entry_point_runs(tmp_path: Path) -> None:
    """python -m flowdrop_local.cli works as the console script does."""
    out = subprocess.run(
        [sys.executable, "-m", "flowdrop_local.cli", "--db", str(tmp_path / "x.db"), "demo"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "HEALED" in out.stdout

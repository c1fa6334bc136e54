"""The flowdrop-local command, driven through click's CliRunner on real files."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from flowdrop_local import Store
from flowdrop_local._cli_common import FlowdropGroup
from flowdrop_local.access import AccessDenied
from flowdrop_local.cli import DEMO_ADDRESS, cli
from flowdrop_local.errors import InvalidArgument

from .conftest import snapshot


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


DEEP_JSON = "[" * 5_000 + "]" * 5_000
LONG_INTEGER = '{"role": "user", "content": "x", "n": ' + "9" * 5_000 + "}"
IMPORT_FILES = {
    "not-utf8.jsonl": b"\n" + b'{"scope": "s", "content": "caf\xe9"}\n',  # Latin-1, on line 2
    "deep.jsonl": DEEP_JSON.encode() + b"\n",
    "long-int.jsonl": LONG_INTEGER.encode() + b"\n",
}

# Each printed a traceback before (the built-in error it raised is in the comment).
HOSTILE: list[tuple[list[str], bytes | None, str]] = [
    # OverflowError
    (["show", "s", "1", "k", "--limit", "99999999999999999999"], None, "not in the range"),
    (["sessions", "show", "x", "--limit", "99999999999999999999"], None, "not in the range"),
    # UnicodeEncodeError: an undecodable byte in argv arrives as a lone surrogate
    (["append", "s", "\udcff", "k", "--role", "user", "--content", "x"], None, "SCOPE_ID is not"),
    (["export", "s", "\udcff", "k"], None, "ADDRESS is not valid UTF-8"),
    (["show", "\udce9", "1", "k"], None, "SCOPE is not valid UTF-8"),
    (["sessions", "list", "--as", "\udcff"], None, "--as is not valid UTF-8"),
    # RecursionError
    (["append", "s", "1", "k", "--json", DEEP_JSON], None, "--json is nested too deeply"),
    (["sessions", "create", "w", "--as", "u", "--metadata", DEEP_JSON], None, "--metadata is"),
    (["import", "{deep.jsonl}"], None, "line 1: JSON nested too deeply"),
    # ValueError: Python's 4,300-digit limit
    (["append", "s", "1", "k", "--json", LONG_INTEGER], None, "more than 4,300 digits"),
    (["import", "{long-int.jsonl}"], None, "line 1: the line holds an integer of more than 4,300"),
    # UnicodeDecodeError
    (["import", "{not-utf8.jsonl}"], None, "line 2: not UTF-8 text"),
    (["import", "-"], b'{"scope": "\xff"}\n', "line 1: not UTF-8 text"),
    # ValueError: embedded null character
    (["show", "s", "1", "k\x00"], None, "NUL"),
    (["--db", "x\x00.db", "check"], None, "NUL"),
]


@pytest.mark.parametrize(("args", "stdin", "message"), HOSTILE, ids=[h[2] for h in HOSTILE])
def test_hostile_input_is_one_error_line_and_the_file_unchanged(
    db_path: Path, tmp_path: Path, args: list[str], stdin: bytes | None, message: str
) -> None:
    """Each input that printed a traceback now prints one Error line, exit 2, file untouched."""
    for name, data in IMPORT_FILES.items():
        (tmp_path / name).write_bytes(data)
    files = {f"{{{name}}}": str(tmp_path / name) for name in IMPORT_FILES}
    args = [files.get(arg, arg) for arg in args]
    with Store(db_path) as store:
        store.buffer("s", "1", "k").append({"role": "user", "content": "kept"})
    before = (db_path.read_bytes(), snapshot(db_path))
    argv = args if args[0] == "--db" else ["--db", str(db_path), *args]
    result = CliRunner().invoke(cli, argv, input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [result.stderr.splitlines()[-1]] and message in errors[0], result.stderr
    assert (db_path.read_bytes(), snapshot(db_path)) == before


def test_any_flowdrop_error_of_a_new_command_is_one_line() -> None:
    """The group converts errors as a class: a command that catches nothing still gets it."""
    group = FlowdropGroup(name="demo-group")

    @group.command()
    @click.argument("kind")
    def fail(kind: str) -> None:
        """Raise a library error."""
        if kind == "denied":
            raise AccessDenied("view_denied", "not yours")
        raise InvalidArgument("limit must be \x1b[2J small")

    bad = CliRunner().invoke(group, ["fail", "argument"])
    assert (bad.exit_code, bad.stderr) == (2, "Error: limit must be \\x1b[2J small\n")
    denied = CliRunner().invoke(group, ["fail", "denied"])
    assert denied.exit_code == 3 and denied.stderr.startswith("Error: access denied (view_denied)")


def test_show_prints_stored_terminal_escapes_visibly(db_path: Path) -> None:
    """A stored OSC title, a screen clear, a carriage return and a bidi override are shown."""
    with Store(db_path) as store:
        store.buffer("s", "1", "k").append(
            [
                {"role": "user", "content": "a\x1b]0;pwned\x07b\x1b[2Jc\rd\u202ee\x9bf\nline 2"},
                {"role": "assistant", "tool_calls": [{"id": "c\x1b[1m", "name": "f\x07"}]},
            ]
        )
    result = run("--db", str(db_path), "show", "s", "1", "k")
    for raw in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
        assert raw not in result.stdout
    assert "a\\x1b]0;pwned\\x07b\\x1b[2Jc\\x0dd\\u202ee\\x9bf\nline 2" in result.stdout
    assert "calls c\\x1b[1m:f\\x07" in result.stdout


def test_error_lines_escape_terminal_controls(tmp_path: Path, db_path: Path) -> None:
    """An error naming a user-given path shows its escape sequence instead of running it."""
    target = tmp_path / "copy\x1b[2J.db"
    target.write_text("exists")
    with Store(db_path):
        pass
    result = CliRunner().invoke(cli, ["--db", str(db_path), "backup", str(target)])
    assert result.exit_code == 2 and "\x1b" not in result.stderr
    assert "copy\\x1b[2J.db" in result.stderr and result.stderr.count("\n") == 1


def test_sessions_output_escapes_terminal_controls(db_path: Path) -> None:
    """Session names and workflow ids are stored text too: escaped in list and show."""
    made = run(
        "--db", str(db_path), "sessions", "create", "w\x1b[2J", "--as", "u", "--name", "\x07"
    )
    session_id = json.loads(made.stdout)["id"]
    listed = run("--db", str(db_path), "sessions", "list", "--as", "u").stdout
    shown = run("--db", str(db_path), "sessions", "show", session_id, "--as", "u").stdout
    for out in (listed, shown):
        assert "\x1b" not in out and "\x07" not in out and "w\\x1b[2J" in out


def test_role_tool_without_call_id_warns(db_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """--role tool without --tool-call-id stores a result of no call: a logged warning says so."""
    base = ["--db", str(db_path), "append", "s", "1", "k", "--role", "tool", "--content", "42"]
    with caplog.at_level(logging.WARNING, logger="flowdrop_local"):
        run(*base)
    assert [r.getMessage() for r in caplog.records if "--tool-call-id" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flowdrop_local"):
        run(*base[:-2], "--content", "43", "--tool-call-id", "c1")
    assert not caplog.records


def test_show_of_an_agents_sdk_buffer_is_readable_text(db_path: Path) -> None:
    """The SDK session's items (output_text parts, calls, reasoning) print as text, not JSON."""
    from flowdrop_local.integrations.openai_agents import DEFAULT_KEY, Session

    items: list[Any] = [
        {"role": "user", "content": "Weather in Lisbon?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Need the forecast tool."}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_forecast",
            "arguments": '{"city": "Lisbon"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Rain, 14 C"},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Take an umbrella.", "annotations": []}],
        },
    ]
    session = Session("conv-1", db_path)
    asyncio.run(session.add_items(items))
    session.close()
    assert DEFAULT_KEY == "openai-agents"
    out = run("--db", str(db_path), "show", "session", "conv-1", "openai-agents").stdout
    lines = out.splitlines()
    assert lines[0].endswith("user      Weather in Lisbon?")
    assert lines[1].endswith("[reasoning] Need the forecast tool.")
    assert "calls call_1:get_forecast" in lines[2]
    assert lines[3].endswith("Rain, 14 C  [answers call_1]")
    assert lines[4].endswith("assistant Take an umbrella.")
    assert "output_text" not in out and "{" not in out

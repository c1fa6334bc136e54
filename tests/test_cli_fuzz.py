"""Hostile arguments for every CLI command: one ``Error:`` line, never a traceback.

The commands are found by walking click's command tree, so a new command is
fuzzed without touching this file. Each example builds a command line from the
command's own parameters, filled from a pool of hostile values (wrong types,
huge and overlong integers, lone surrogates, NUL, ``-``, deep JSON, files that
are not UTF-8 or hold unreadable JSON), runs it through ``CliRunner`` against a
real database file, and asserts: no exception other than ``SystemExit``; an
exit status the CLI guide (docs/cli.md) documents; on failure exactly one ``Error:`` line (the
last on stderr); and, after a rejected command, the database file and every
table byte-for-byte as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import Principal, Store
from flowdrop_local.cli import cli

from .conftest import snapshot

DEEP_JSON = "[" * 5_000 + "]" * 5_000
LONG_INTEGER = '{"role": "user", "content": "x", "n": ' + "9" * 5_000 + "}"


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


@pytest.fixture(autouse=True)
def _serve_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve`` binds and prints its URL, then returns instead of serving forever.

    Its arguments are fuzzed like any command's; only the endless loop and the
    browser (a real one may be installed) are left out.
    """
    import webbrowser

    from flowdrop_local.viewer.server import ViewerServer

    monkeypatch.setattr(ViewerServer, "serve_forever", lambda self, poll_interval=0.5: None)
    monkeypatch.setattr(webbrowser, "open", lambda *args, **kwargs: True)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Hostile input files, made once."""
    folder = tmp_path_factory.mktemp("hostile")
    made = {
        "not-utf8.jsonl": b'{"scope": "s", "content": "\xff\xfe"}\n',
        "deep.jsonl": DEEP_JSON.encode() + b"\n",
        "long-int.jsonl": LONG_INTEGER.encode() + b"\n",
        "text.txt": b"just some notes\n" * 50,
        "empty.jsonl": b"",
    }
    for name, data in made.items():
        (folder / name).write_bytes(data)
    return {name: str(folder / name) for name in made} | {
        "missing": str(folder / "missing.jsonl"),
        "folder": str(folder),
    }


SPECIAL = [
    "",
    " ",
    "-",
    "--",
    "0",
    "-1",
    "2.5",
    "99999999999999999999",
    "9" * 5_000,
    "\udcff",
    "caf\udce9",
    "a\x00b",
    "\x1b]0;pwned\x07\x1b[2J",
    "\u202eevil",
    "user",
    "tool",
    "{not json",
    "null",
    "[]",
    "{}",
    '{"role": "tool"}',
    '{"role": "user", "contnet": "x"}',
    DEEP_JSON,
    LONG_INTEGER,
    "x" * 20_000,
]
STDIN = b'\xff\xfe{"scope": "s"}\n'  # what "-" reads: not UTF-8


def _hostile(files: dict[str, str]) -> list[str]:
    return SPECIAL + sorted(files.values())


def _baseline(command: click.Command, tmp_path: Path, files: dict[str, str]) -> list[list[str]]:
    """Plausible values for each parameter in order (arguments only; options are added)."""
    address = iter(["session", "s1", "chat"] * 2)
    values: list[list[str]] = []
    for param in command.params:
        if not isinstance(param, click.Argument):
            values.append([])
        elif isinstance(param.type, click.File):
            values.append([files["empty.jsonl"]])
        elif isinstance(param.type, click.Path):
            values.append([str(tmp_path / f"new-{len(os.listdir(tmp_path))}")])
        elif param.nargs == -1:
            values.append(["session", "s1", "chat"])
        else:
            values.append([next(address) for _ in range(param.nargs)])
    return values


def _flatten(command: click.Command, values: list[list[str]]) -> list[str]:
    argv: list[str] = []
    for param, chosen in zip(command.params, values, strict=True):
        if isinstance(param, click.Option) and chosen:
            for value in chosen:
                argv += [max(param.opts, key=len)] if param.is_flag else [param.opts[-1], value]
        else:
            argv += chosen
    return argv


def _state(path: Path) -> tuple[bytes, object]:
    return path.read_bytes(), snapshot(path)


def _make_db(path: Path) -> None:
    if not path.exists():
        with Store(path) as store:
            store.buffer("session", "s1", "chat").append(
                [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},
                ]
            )


def _run_and_check(
    tmp_path: Path, path: tuple[str, ...], argv: list[str], stdin: bytes = STDIN
) -> int:
    """Run one command line; assert the CLI's promises; return the exit status."""
    db = tmp_path / "fuzz.db"
    _make_db(db)
    before = _state(db)
    with contextlib.chdir(tmp_path):  # a relative backup target lands beside the file
        result = CliRunner().invoke(cli, ["--db", str(db), *path, *argv], input=stdin)
    shown = f"{path} {[a[:80] for a in argv]!r}: exit {result.exit_code}\n{result.output[:2000]}"
    assert result.exception is None or isinstance(result.exception, SystemExit), shown + repr(
        result.exception
    )
    allowed = {0, 1, 2, 3} if path[0] == "sessions" else {0, 1, 2}  # 3: access denied
    assert result.exit_code in allowed, shown
    assert "Traceback" not in result.output, shown
    if result.exit_code in (2, 3):
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and result.stderr.splitlines()[-1] == errors[0], shown
        assert "\x1b" not in result.stderr and "\x00" not in result.stderr, shown
        assert _state(db) == before, shown
    return result.exit_code


COMMANDS = list(_commands(cli))


def test_the_walk_finds_every_command() -> None:
    """The walk reaches the sub-group's commands too (so a new one is fuzzed)."""
    assert {"append", "show", "check", "import", "export", "backup"} <= {c[-1] for c in COMMANDS}
    assert ("sessions", "create") in COMMANDS and ("sessions", "show") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_each_parameter_takes_each_hostile_value(
    tmp_path: Path, files: dict[str, str], path: tuple[str, ...]
) -> None:
    """Every parameter of the command, in turn, gets every hostile value, the rest plausible."""
    command = _command(path)
    statuses = []
    for index, param in enumerate(command.params):
        if isinstance(param, click.Option) and (param.is_flag or param.name == "help"):
            continue
        for value in _hostile(files):
            values = _baseline(command, tmp_path, files)
            current = values[index]
            values[index] = [value, *current[1:]]
            statuses.append(_run_and_check(tmp_path, path, _flatten(command, values)))
    assert statuses == [] or 2 in statuses or 3 in statuses  # something was refused


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_hostile_command_lines(
    tmp_path: Path, files: dict[str, str], path: tuple[str, ...], data: st.DataObject
) -> None:
    """Random mixes: arguments missing or extra, options repeated, any value anywhere."""
    values = st.one_of(st.sampled_from(_hostile(files)), st.text(max_size=12))
    argv = data.draw(st.composite(lambda draw: _argv(draw, _command(path), values))())
    stdin = data.draw(st.sampled_from([b"", STDIN, DEEP_JSON.encode(), LONG_INTEGER.encode()]))
    _run_and_check(tmp_path, path, argv, stdin)


def _argv(draw: st.DrawFn, command: click.Command, values: st.SearchStrategy[str]) -> list[str]:
    """Arguments in their places (sometimes too few or too many), then some options."""
    argv: list[str] = []
    for param in command.params:
        if isinstance(param, click.Argument):
            count = param.nargs if param.nargs > 0 else draw(st.integers(0, 4))
            argv += [draw(values) for _ in range(count) if draw(st.integers(0, 9)) > 0]
    options = [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]
    for option in draw(st.lists(st.sampled_from(options), max_size=3)) if options else []:
        argv.append(max(option.opts, key=len))
        if not option.is_flag:
            argv.append(draw(values))
    if draw(st.integers(0, 9)) == 0:
        argv.append(draw(values))  # one too many
    return argv


# ------------------------------------------------------- issue 21 D: what the user is told


def _damaged(path: Path) -> str:
    """A file whose message content, conversation metadata and session metadata are not
    JSON (written with the CHECKs off, as another program could); the session's id."""
    import sqlite3

    with Store(path) as store:
        store.buffer("session", "s1", "chat").append({"role": "user", "content": "hi"})
        store.buffer("session", "s1", "chat").set_title("t")
        session = store.sessions(Principal("alice")).create("wf")
        store.sessions(Principal("alice")).drive(session.id, {"role": "user", "content": "hi"})
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute("UPDATE messages SET content = '{bad', content_parts = 1")
    conn.execute("UPDATE buffers SET metadata = '{bad'")
    conn.execute("UPDATE sessions SET metadata = '{bad'")
    conn.close()
    return session.id


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "session", "s1", "chat"],
        ["show", "session", "s1", "chat", "--json"],
        ["show", "session", "s1", "chat", "--format", "anthropic"],
        ["export"],
        ["buffers"],
        ["sessions", "show", "SESSION", "--as", "alice"],
        ["sessions", "list", "--as", "alice"],
    ],
    ids=" ".join,
)
def test_a_damaged_row_is_one_error_line_not_a_traceback(tmp_path: Path, argv: list[str]) -> None:
    db = tmp_path / "damaged.db"
    session_id = _damaged(db)
    before = _state(db)
    argv = [session_id if a == "SESSION" else a for a in argv]
    result = CliRunner().invoke(cli, ["--db", str(db), *argv])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.stderr.splitlines()[-1].startswith("Error:") and "damaged" in result.stderr
    assert _state(db) == before


def test_show_and_delete_of_a_conversation_that_does_not_exist_say_so(tmp_path: Path) -> None:
    """A typo in an address: one Error line, exit 2 (bad input), nothing changed; an
    existing but empty conversation still shows as empty and deletes as 0 messages."""
    db = tmp_path / "x.db"
    _make_db(db)
    before = _state(db)
    for command in (["show"], ["delete", "--yes"], ["show", "--json"]):
        result = CliRunner().invoke(cli, ["--db", str(db), *command, "session", "s1", "chta"])
        assert result.exit_code == 2, (command, result.output)
        assert result.stderr.splitlines()[-1] == (
            f"Error: no conversation session/s1/chta in {db}"
        ), result.stderr
        assert _state(db) == before
    with Store(db) as store:
        store.buffer("s", "", "titled").set_title("nothing yet")
    shown = CliRunner().invoke(cli, ["--db", str(db), "show", "s", "", "titled"])
    assert shown.exit_code == 0 and shown.stdout == ""
    deleted = CliRunner().invoke(cli, ["--db", str(db), "delete", "--yes", "s", "", "titled"])
    assert deleted.exit_code == 0 and "(0 message(s))" in deleted.stdout


def test_a_scope_one_letter_from_an_identity_scope_is_warned_about(tmp_path: Path) -> None:
    """``append sesion ...`` stores into an ordinary, shared scope: it works (exit 0) and
    stderr says which identity scope it is one letter away from."""
    import subprocess
    import sys

    db = tmp_path / "x.db"
    argv = ["--db", str(db), "append", "sesion", "s1", "chat", "--role", "user"]
    result = subprocess.run(
        [sys.executable, "-m", "flowdrop_local.cli", *argv, "--content", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "one letter away from the identity scope 'session'" in result.stderr
    exact_argv = [*argv[:3], "session", *argv[4:]]
    exact = subprocess.run(
        [sys.executable, "-m", "flowdrop_local.cli", *exact_argv, "--content", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "one letter away" not in exact.stderr


def test_lock_timeout_option_gives_up_with_one_error_line(tmp_path: Path) -> None:
    """``--lock-timeout 0.5`` while another process holds the write lock: exit 2, one
    Error line naming the timeout, the file as it was."""
    from .test_errors_typed import sqlite_write_lock_held

    db = tmp_path / "x.db"
    _make_db(db)
    before = _state(db)
    argv = ["--db", str(db), "--lock-timeout", "0.5", "append", "s", "", "k", "--role", "user"]
    with sqlite_write_lock_held(db):
        result = CliRunner().invoke(cli, [*argv, "--content", "x"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1].startswith("Error: gave up on a write")
    assert "lock_timeout=0.5 s" in result.stderr
    assert _state(db) == before
    for bad in ("0", "-1", "nan", "1e400", "x"):
        refused = CliRunner().invoke(cli, [*argv[:2], "--lock-timeout", bad, "buffers"])
        assert refused.exit_code == 2 and "Traceback" not in refused.output

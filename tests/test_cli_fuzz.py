"""Hostile arguments for every CLI command: one ``Error:`` line, never a traceback.

The commands are found by walking click's command tree, so a new command is
fuzzed without touching this file. Each example builds a command line from the
command's own parameters, filled from a pool of hostile values (wrong types,
huge and overlong integers, lone surrogates, NUL, ``-``, deep JSON, files that
are not UTF-8 or hold unreadable JSON), runs it through ``CliRunner`` against a
real database file, and asserts: no exception other than ``SystemExit``; an
exit status the README documents; on failure exactly one ``Error:`` line (the
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

from flowdrop_local import Store
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

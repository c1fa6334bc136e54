"""The CLI of issue 13: buffers, title, delete, fork and search (with --enable)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowdrop_local import Store
from flowdrop_local.cli import cli


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "chat.db")
    with Store(path) as store:
        main = store.buffer("chat", "u1", "main")
        main.append([{"role": "user", "content": "rain in Lisbon?"}])
        main.append(
            {
                "role": "assistant",
                "content": "",
                "metadata": {"tool_calls": [{"tool_call_id": "c1", "name": "weather"}]},
            }
        )
        main.append({"role": "tool", "content": "heavy rain", "metadata": {"tool_call_id": "c1"}})
        store.buffer("notes", "u2", "todo").append({"role": "user", "content": "buy umbrella"})
    return path


def run(db: str, *args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(cli, ["--db", db, *args], input=input)


def test_buffers_lists_most_recent_first_with_titles(db: str) -> None:
    assert run(db, "title", "chat", "u1", "main", "Weather").exit_code == 0
    result = run(db, "buffers", "--json")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert [(b["key"], b["title"], b["count"]) for b in listed] == [
        ("todo", "", 1),
        ("main", "Weather", 3),
    ]
    text = run(db, "buffers", "--scope", "chat").output.splitlines()
    assert len(text) == 1 and text[0].endswith("chat/u1/main  Weather")
    assert len(json.loads(run(db, "buffers", "--limit", "1", "--json").output)) == 1


def test_title_prints_info(db: str) -> None:
    result = run(db, "title", "chat", "u1", "main", "Trip")
    assert json.loads(result.output)["title"] == "Trip"


def test_fork_then_continue(db: str) -> None:
    with Store(db) as store:
        call = store.buffer("chat", "u1", "main").messages()[1].id
    result = run(db, "fork", "chat", "u1", "main", "--at", call, "--to", "chat", "u1", "edit")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["count"] == 2
    run(db, "append", "chat", "u1", "edit", "--role", "user", "--content", "again")
    with Store(db) as store:
        roles = [m.role for m in store.buffer("chat", "u1", "edit").messages()]
        assert roles == ["user", "assistant", "tool", "user"]  # healed at the cut
        assert store.check() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fork", "chat", "u1", "main", "--at", "nope", "--to", "chat", "u1", "x"], "no message"),
        (["fork", "chat", "u1", "main", "--at", "AT", "--to", "notes", "u2", "todo"], "holds 1"),
        (["fork", "chat", "u1", "main", "--at", "AT", "--to", "user", "0", "x"], "cannot fork"),
        (["title", "chat", "u1", "main", "x" * 1001], "at most 1,000"),
        (["search", "rain"], "search is not enabled"),
        (["search"], "give a QUERY"),
        (["buffers", "--scope", ""], "scope"),
    ],
)
def test_errors_are_one_line_exit_2(db: str, args: list[str], message: str) -> None:
    """Each bad input is one `Error:` line on stderr and exit status 2, no traceback."""
    with Store(db) as store:
        at = store.buffer("chat", "u1", "main").messages()[0].id
    result = run(db, *[at if a == "AT" else a for a in args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0]


def test_delete_with_yes_and_without_a_terminal(db: str) -> None:
    """Input that is not a terminal (CliRunner's) is not asked; --yes is never asked."""
    result = run(db, "delete", "notes", "u2", "todo")
    assert result.exit_code == 0 and "deleted notes/u2/todo (1 message(s))" in result.output
    assert run(db, "delete", "chat", "u1", "main", "--yes").exit_code == 0
    assert json.loads(run(db, "buffers", "--json").output) == []


def test_search_enable_then_search(db: str) -> None:
    enabled = run(db, "search", "--enable")
    assert enabled.exit_code == 0 and enabled.output == "search index built\n"
    assert run(db, "search", "--enable", "--quiet").output == "search was enabled already\n"
    hits = json.loads(run(db, "search", "rain", "--json").output)
    assert {h["snippet"] for h in hits} == {"[rain] in Lisbon?", "heavy [rain]"}
    assert json.loads(run(db, "search", "rain", "--scope", "notes", "--json").output) == []
    assert len(json.loads(run(db, "search", "rain", "--limit", "1", "--json").output)) == 1
    text = run(db, "search", "umbrella").output.splitlines()
    assert text[0].startswith("user      notes/u2/todo  ") and text[1] == "    buy [umbrella]"


# ------------------------------------------------------- on a real terminal (a pty)


def _on_terminal(db: str, *args: str, answer: bytes = b"") -> tuple[int, str, str]:
    """Run the CLI with stdin and stderr on a pseudo-terminal; (status, stdout, terminal)."""
    primary, secondary = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "COLUMNS": "80"}
    process = subprocess.Popen(
        [sys.executable, "-m", "flowdrop_local.cli", "--db", db, *args],
        stdin=secondary,
        stdout=subprocess.PIPE,
        stderr=secondary,
        env=env,
    )
    os.close(secondary)
    if answer:
        os.write(primary, answer)
    screen = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:
            break
        if not chunk:
            break
        screen += chunk
    out = process.stdout.read().decode() if process.stdout else ""
    status = process.wait(timeout=60)
    os.close(primary)
    return status, out, screen.decode(errors="replace")


def test_delete_asks_on_a_terminal(db: str) -> None:
    """On a terminal delete asks first: 'n' keeps the buffer, 'y' deletes it."""
    status, _, screen = _on_terminal(db, "delete", "notes", "u2", "todo", answer=b"n\n")
    assert status == 1 and "Delete notes/u2/todo and its 1 message(s)?" in screen
    with Store(db) as store:
        assert len(store.buffer("notes", "u2", "todo")) == 1
    status, out, _ = _on_terminal(db, "delete", "notes", "u2", "todo", answer=b"y\n")
    assert status == 0 and "deleted notes/u2/todo" in out
    status, out, screen = _on_terminal(db, "delete", "chat", "u1", "main", "--yes")
    assert status == 0 and "?" not in screen


def test_progress_bars_on_a_terminal_only(db: str) -> None:
    """search --enable and fork draw a bar on a terminal; --quiet draws none."""
    with Store(db) as store:
        at = store.buffer("chat", "u1", "main").messages()[2].id
    status, _, screen = _on_terminal(db, "search", "--enable", "--quiet")
    assert status == 0 and "indexing" not in screen
    status, _, screen = _on_terminal(
        db, "fork", "chat", "u1", "main", "--at", at, "--to", "a", "b", "c"
    )
    assert status == 0 and "forking" in screen and "3/3" in screen
    status, _, screen = _on_terminal(
        db, "fork", "chat", "u1", "main", "--at", at, "--to", "a", "b", "d", "--quiet"
    )
    assert status == 0 and "forking" not in screen


def test_search_enable_draws_a_bar_on_a_terminal(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    with Store(path) as store:
        store.buffer("chat", "u", "k").append({"role": "user", "content": "a"})
    status, out, screen = _on_terminal(path, "search", "--enable")
    assert status == 0 and "indexing" in screen and "1/1" in screen
    assert out == "search index built\n"

"""The invariant checker catches a file changed behind the library's back."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from flowdrop_local import Store
from flowdrop_local._schema import schema_sql, statements
from flowdrop_local.cli import cli

FIXED_ID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
FIXED_BLOB = "X'" + "f" * 32 + "'"  # its stored form (16 bytes)
OTHER_BLOB = "X'" + "e" * 32 + "'"
# Put back after the tampering it let through: a file missing it does not open.
MEM3_TRIGGER = next(s for s in statements(schema_sql()) if "messages_user_needs_answered" in s)


def _healthy(path: Path) -> None:
    with Store(path) as store:
        store.buffer("session", "s", "chat").append(
            [
                {"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
                {"role": "tool", "tool_call_id": "c2", "content": "ok"},
                {"role": "user", "content": "next"},  # heals c1
                {"role": "assistant", "content": "done"},
            ]
        )


def _raw(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = OFF")
    for statement in statements:
        conn.execute(statement)
    conn.close()


TAMPERING: list[tuple[str, Callable[[Path], None], str]] = [
    ("count", lambda p: _raw(p, "UPDATE messages SET tally = 99"), "stored count is 99"),
    (
        "ledger",
        lambda p: _raw(p, "DELETE FROM tool_calls WHERE call_id = 'c2'"),
        "not in the ledger",
    ),
    (
        "ledger",
        lambda p: _raw(p, "UPDATE tool_calls SET answered_by = NULL WHERE call_id = 'c2'"),
        "answered by None",
    ),
    (
        "placeholder",
        lambda p: _raw(p, "UPDATE messages SET content = 'edited' WHERE healed = 1"),
        "placeholder's shape",
    ),
    (
        "MEM-3",
        lambda p: _raw(
            p,
            "DROP TRIGGER messages_user_needs_answered_calls",
            f"INSERT INTO messages (id, buffer_id, position, role, content, metadata) VALUES "
            f"({FIXED_BLOB}, 1, 'b0', 'assistant', '', '{{\"tool_calls\":[{{\"id\":\"c9\"}}]}}')",
            "INSERT INTO messages (id, buffer_id, position, role, content) VALUES "
            f"({OTHER_BLOB}, 1, 'b1', 'user', 'bypassed the guard')",
            MEM3_TRIGGER,
        ),
        "user turn after unanswered call 'c9'",
    ),
    (
        "placeholder",
        lambda p: _raw(
            p,
            "INSERT INTO messages (id, buffer_id, position, role, content, metadata) VALUES "
            f"({FIXED_BLOB}, 1, 'b0', 'tool', 'Tool call was interrupted; no result.', "
            '\'{"tool_call_id":"zz","healed":true}\')',
        ),
        "which no turn declares",
    ),
    (
        "foreign_key_check",
        lambda p: _raw(p, "UPDATE messages SET buffer_id = 5 WHERE 0 = 1", "DELETE FROM buffers"),
        "missing",
    ),
]


@pytest.mark.parametrize(
    ("check", "tamper", "words"), TAMPERING, ids=[f"{i}-{t[0]}" for i, t in enumerate(TAMPERING)]
)
def test_checker_reports_each_kind_of_tampering(
    tmp_path: Path, check: str, tamper: Callable[[Path], None], words: str
) -> None:
    """A healthy file checks clean; each tampering is reported by the check that guards it."""
    path = tmp_path / "x.db"
    _healthy(path)
    with Store(path) as store:
        assert store.check() == []
    tamper(path)
    with Store(path) as store:
        violations = store.check()
    assert any(v.check == check and words in str(v) for v in violations), violations


def test_cli_check_exit_codes_and_json(tmp_path: Path) -> None:
    """check exits 0 when clean, 1 with one line per violation; --json gives the list."""
    path = tmp_path / "x.db"
    _healthy(path)
    clean = CliRunner().invoke(cli, ["--db", str(path), "check"])
    assert clean.exit_code == 0 and "ok" in clean.stdout
    _raw(path, "UPDATE messages SET tally = 99")
    dirty = CliRunner().invoke(cli, ["--db", str(path), "check"])
    assert dirty.exit_code == 1
    assert "count: the stored count is 99" in dirty.stdout
    report = json.loads(CliRunner().invoke(cli, ["--db", str(path), "check", "--json"]).stdout)
    assert report["ok"] is False and report["violations"][0]["check"] == "count"


def _several_kinds(path: Path) -> None:
    """Four kinds of damage at once: a count, a ledger row, a placeholder, a dangling reference."""
    _raw(
        path,
        "UPDATE messages SET tally = 99",
        "DELETE FROM tool_calls WHERE call_id = 'c2'",
        "UPDATE messages SET content = 'edited' WHERE healed = 1",
        "INSERT INTO tool_calls (buffer_id, call_id, declared_by, ordinal) "
        f"VALUES (1, 'c7', {FIXED_BLOB}, 0)",
    )


def test_every_kind_of_violation_is_reported_in_one_run(tmp_path: Path) -> None:
    """A foreign-key finding no longer hides the others: one run reports all four kinds."""
    path = tmp_path / "x.db"
    _healthy(path)
    _several_kinds(path)
    with Store(path) as store:
        kinds = {v.check for v in store.check()}
    assert kinds >= {"count", "ledger", "placeholder", "foreign_key_check"}, kinds


def test_foreign_key_finding_names_the_buffer_and_the_call(tmp_path: Path) -> None:
    """A dangling ledger row says which call of which buffer, in text and in --json."""
    path = tmp_path / "x.db"
    _healthy(path)
    _several_kinds(path)
    text = CliRunner().invoke(cli, ["--db", str(path), "check"])
    assert text.exit_code == 1
    [line] = [line for line in text.stdout.splitlines() if line.startswith("foreign_key_check")]
    assert "call 'c7'" in line and "session/s/chat" in line and FIXED_ID in line, line
    assert "row None" not in line
    report = json.loads(CliRunner().invoke(cli, ["--db", str(path), "check", "--json"]).stdout)
    [finding] = [v for v in report["violations"] if v["check"] == "foreign_key_check"]
    assert (finding["buffer"], finding["call_id"], finding["message_id"]) == (
        "session/s/chat",
        "c7",
        FIXED_ID,
    )


def test_foreign_key_finding_of_a_missing_buffer_says_so(tmp_path: Path) -> None:
    """Rows of a deleted buffer are named by their id and the buffer's number."""
    path = tmp_path / "x.db"
    _healthy(path)
    _raw(path, "DELETE FROM buffers")
    with Store(path) as store:
        found = [v for v in store.check() if v.check == "foreign_key_check"]
    assert found and all(v.buffer == "#1 (missing)" for v in found)
    assert {v.call_id for v in found} >= {"c1", "c2"}
    assert any(v.message_id and "message:" in v.detail for v in found)


def _big(path: Path) -> None:
    with Store(path) as store:
        store.buffer("session", "s", "chat").append(
            [{"role": "user", "content": f"message {i} " * 50} for i in range(300)]
        )


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("truncated", ("the file cannot be opened",)),
        # What a read of the broken page gives depends on the ids on it (random):
        # the buffer cannot be read, or only part of it is, against its count.
        ("root page of messages overwritten", ("cannot read the buffer", "the buffer holds")),
    ],
)
def test_corrupt_file_is_a_finding_exit_1(
    tmp_path: Path, damage: str, words: tuple[str, ...]
) -> None:
    """check on a damaged SQLite file exits 1 with integrity_check findings (not 2, bad input)."""
    path = tmp_path / "x.db"
    _big(path)
    if damage == "truncated":
        with open(path, "r+b") as file:
            file.truncate(4096 * 3)
    else:
        conn = sqlite3.connect(path)
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'messages'"
        ).fetchone()
        conn.close()
        with open(path, "r+b") as file:
            file.seek(4096 * (root - 1) + 12)
            file.write(b"\xff" * 64)
    result = CliRunner().invoke(cli, ["--db", str(path), "check"])
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("integrity_check:")
    assert any(w in result.stdout for w in words), result.stdout
    assert "Traceback" not in result.output
    report = json.loads(CliRunner().invoke(cli, ["--db", str(path), "check", "--json"]).stdout)
    assert report["ok"] is False and report["violations"][0]["check"] == "integrity_check"


def test_a_file_that_is_not_sqlite_is_bad_input_exit_2(tmp_path: Path) -> None:
    """A text file is not a damaged database: check refuses it with one Error line, exit 2."""
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\n" * 100)
    result = CliRunner().invoke(cli, ["--db", str(path), "check"])
    assert result.exit_code == 2 and result.stderr.startswith("Error:")


def test_metadata_that_is_not_an_object_is_reported_not_raised(tmp_path: Path) -> None:
    """Metadata that is JSON but no object (CHECK bypassed) is a finding naming the row."""
    path = tmp_path / "x.db"
    _healthy(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute("UPDATE messages SET metadata = '[1]' WHERE role = 'tool'")
    conn.execute("UPDATE messages SET metadata = '\"text\"' WHERE role = 'assistant'")
    conn.close()
    with Store(path) as store:
        found = [v for v in store.check() if v.check == "json"]
    assert len(found) == 4 and all(v.buffer == "session/s/chat" and v.message_id for v in found)


def test_check_text_output_escapes_terminal_controls(tmp_path: Path) -> None:
    """A stored escape sequence in a buffer's name is printed visibly, not executed."""
    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("global", "\x1b]0;pwned\x07", "\x1b[2J").append(
            {"role": "user", "content": "hi"}
        )
    _raw(path, "UPDATE messages SET tally = 99")
    result = CliRunner().invoke(cli, ["--db", str(path), "check"])
    assert result.exit_code == 1
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "global/\\x1b]0;pwned\\x07/\\x1b[2J" in result.stdout

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

FIXED_ID = "f" * 36
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
    ("count", lambda p: _raw(p, "UPDATE buffers SET message_count = 99"), "message_count is 99"),
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
            f"('{FIXED_ID}', 1, 'b0', 'assistant', '', '{{\"tool_calls\":[{{\"id\":\"c9\"}}]}}')",
            "INSERT INTO messages (id, buffer_id, position, role, content) VALUES "
            "('" + "e" * 36 + "', 1, 'b1', 'user', 'bypassed the guard')",
            MEM3_TRIGGER,
        ),
        "user turn after unanswered call 'c9'",
    ),
    (
        "placeholder",
        lambda p: _raw(
            p,
            "INSERT INTO messages (id, buffer_id, position, role, content, metadata) VALUES "
            f"('{FIXED_ID}', 1, 'b0', 'tool', 'Tool call was interrupted; no result.', "
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
    _raw(path, "UPDATE buffers SET message_count = 99")
    dirty = CliRunner().invoke(cli, ["--db", str(path), "check"])
    assert dirty.exit_code == 1
    assert "count: buffers.message_count is 99" in dirty.stdout
    report = json.loads(CliRunner().invoke(cli, ["--db", str(path), "check", "--json"]).stdout)
    assert report["ok"] is False and report["violations"][0]["check"] == "count"

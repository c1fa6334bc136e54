"""Export, import and backup: lossless round trips, one-transaction imports, live backups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowdrop_local import FlowdropError, InvalidImport, Store
from flowdrop_local.cli import cli
from flowdrop_local.errors import BackupTargetExists

from .conftest import snapshot

ROOT = Path(__file__).resolve().parent.parent


def _rich_history(store: Store) -> None:
    chat = store.buffer("session", "s1", "chat")
    chat.append({"role": "system", "content": "be brief"})
    chat.append(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
            ],
        }
    )
    chat.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "b", "arguments": "{}"}},
            ],
        }
    )
    chat.append({"role": "tool", "tool_call_id": "c2", "content": "b done"})
    chat.append({"role": "user", "content": "and a?"})  # heals c1
    chat.append(
        {"role": "assistant", "content": '{"looks": "like json"}', "metadata": {"model": "m1"}}
    )
    store.buffer("user", "7", "notes").append(
        [
            {"role": "assistant", "tool_calls": [{"tool_call_id": "t1"}]},
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "t1", "content": "late"},
        ]  # MEM-10 replaced
    )


def test_export_import_round_trip_is_lossless(tmp_path: Path) -> None:
    """ids, positions, metadata, healed marks, content parts and timestamps all survive."""
    with Store(tmp_path / "a.db") as source:
        _rich_history(source)
        exported = list(source.export())
    with Store(tmp_path / "b.db") as target:
        report = target.import_records(exported)
        assert (report.buffers, report.imported, report.healed, report.dropped) == (
            2,
            len(exported),
            0,
            0,
        )
        assert list(target.export()) == exported
        assert target.check() == []
    healed = [r for r in exported if r["metadata"].get("healed")]
    assert len(healed) == 1 and healed[0]["metadata"]["tool_call_id"] == "c1"


def test_cli_export_then_import(tmp_path: Path) -> None:
    """flowdrop-local export > file.jsonl; flowdrop-local import file.jsonl."""
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    with Store(a) as source:
        _rich_history(source)
    out = CliRunner().invoke(cli, ["--db", a, "export"])
    assert out.exit_code == 0
    (tmp_path / "dump.jsonl").write_text(out.stdout)
    one = CliRunner().invoke(cli, ["--db", a, "export", "user", "7", "notes"])
    assert [json.loads(line)["key"] for line in one.stdout.splitlines()] == ["notes"] * 3
    result = CliRunner().invoke(cli, ["--db", b, "import", str(tmp_path / "dump.jsonl")])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines[0] == {"flowdrop_export": 2}  # the complete export: format 2
    assert json.loads(result.stdout)["imported"] == sum("role" in line for line in lines)
    again = CliRunner().invoke(cli, ["--db", b, "import", str(tmp_path / "dump.jsonl")])
    assert again.exit_code == 2 and "already holds messages (use --replace)" in again.stderr
    replaced = CliRunner().invoke(
        cli, ["--db", b, "import", "--replace", str(tmp_path / "dump.jsonl")]
    )
    assert replaced.exit_code == 0 and json.loads(replaced.stdout)["replaced_buffers"] == 2
    assert CliRunner().invoke(cli, ["--db", b, "export"]).stdout == out.stdout


GOOD = {"scope": "s", "scope_id": "1", "key": "k", "role": "user", "content": "fine"}
BAD_LINES = [
    ("{not json", 2, "not valid JSON"),
    ("[1, 2]", 2, "must be a JSON object"),
    (json.dumps({**GOOD, "scope": 5}), 2, "scope, scope_id and key must be strings"),
    (json.dumps({**GOOD, "role": "robot"}), 2, "role"),
    (json.dumps({**GOOD, "position": "10"}), 2, "not a valid key"),
    (json.dumps({**GOOD, "id": "short"}), 2, "is not a UUID"),
    (json.dumps({**GOOD, "content": {"a": 1}}), 2, "content"),
]


@pytest.mark.parametrize(("line", "number", "words"), BAD_LINES)
def test_a_bad_line_is_named_and_nothing_is_written(
    tmp_path: Path, line: str, number: int, words: str
) -> None:
    """Every line is validated first; a bad one names its line number and writes nothing."""
    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("other", "", "k").append({"role": "user", "content": "before"})
        before = snapshot(path)
        with pytest.raises(InvalidImport, match=words) as caught:
            store.import_jsonl([json.dumps(GOOD), line, json.dumps(GOOD)])
        assert caught.value.line == number
        assert snapshot(path) == before


def test_duplicate_ids_and_mixed_positions_are_refused(tmp_path: Path) -> None:
    """An id twice, or positions on some lines of a buffer only, are refused."""
    record = {**GOOD, "id": "00000000-0000-7000-8000-000000000000", "position": "a0"}
    with Store(tmp_path / "x.db") as store:
        with pytest.raises(InvalidImport, match="appears twice"):
            store.import_records([record, {**record, "position": "a1"}])
        with pytest.raises(InvalidImport, match="on every line or on none"):
            store.import_records([record, GOOD])
        assert store.buffers() == []


OTHER_TOOL = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "w1", "name": "forecast"}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "w2", "name": "radar"}]},
    {"role": "tool", "tool_call_id": "w2", "content": "dry"},
    {"role": "user", "content": "hello?"},
    {"role": "tool", "tool_call_id": "w2", "content": "dry again"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "w3", "name": "x"}]},
    {"role": "user", "content": "bye"},
]


@pytest.mark.parametrize("with_positions", [False, True], ids=["file-order", "given-positions"])
def test_an_unhealed_history_is_healed_as_appends_would(
    tmp_path: Path, with_positions: bool
) -> None:
    """A history from another tool, with user turns after unanswered calls, heals like appends."""
    with Store(tmp_path / "appended.db") as store:
        buffer = store.buffer("s", "1", "k")
        for message in OTHER_TOOL:
            buffer.append(message)
        expected = buffer.read()
    records: list[dict[str, Any]] = [
        {"scope": "s", "scope_id": "1", "key": "k", **m} for m in OTHER_TOOL
    ]
    if with_positions:
        for i, record in enumerate(records):
            record["position"] = f"b{i:02d}"
    with Store(tmp_path / "imported.db") as store:
        report = store.import_records(records)
        assert (report.healed, report.dropped) == (2, 1)
        assert store.buffer("s", "1", "k").read() == expected
        assert store.check() == []
        if with_positions:
            kept = [m.position for m in store.buffer("s", "1", "k").messages() if not m.healed]
            assert kept == [f"b{i:02d}" for i in range(len(OTHER_TOOL)) if i != 5]


@pytest.mark.timeout(120)
def test_backup_of_a_live_database_is_consistent(tmp_path: Path) -> None:
    """A backup taken while another process appends opens cleanly and passes check()."""
    db = tmp_path / "live.db"
    Store(db).close()
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.writer", str(db), "w", "400"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    (tmp_path / "live.db.go").touch()
    with Store(db) as store:
        deadline = time.monotonic() + 60
        while len(store.buffer("session", "shared", "chat")) < 60 and time.monotonic() < deadline:
            time.sleep(0.01)
        store.backup(tmp_path / "copy.db")
        with pytest.raises(BackupTargetExists):
            store.backup(tmp_path / "copy.db")
        assert isinstance(BackupTargetExists("x"), FlowdropError | FileExistsError)
    assert writer.wait(timeout=100) == 0
    with Store(tmp_path / "copy.db") as copy:
        assert copy.check() == []
        history = copy.buffer("session", "shared", "chat").read()
        assert len(history) >= 60  # a snapshot taken mid-run: whole appends only
        assert len(history) % 3 in (0, 1)  # (call, placeholder, user) steps, maybe one more call
    with Store(db) as store:
        assert len(store.buffer("session", "shared", "chat")) == 1200


def test_ids_and_timestamps_are_kept_without_positions(tmp_path: Path) -> None:
    """Lines without positions go at the end in file order, keeping their ids and timestamps."""
    record = {
        **GOOD,
        "id": "01234567-89ab-7def-8123-456789abcdef",
        "created_at": "2020-01-01T00:00:00.000Z",
    }
    with Store(tmp_path / "x.db") as store:
        store.import_records([record])
        (message,) = store.buffer("s", "1", "k").messages()
    assert (message.id, message.created_at) == (record["id"], record["created_at"])


@pytest.mark.parametrize(
    ("scope", "scope_id", "words"),
    [
        ("user", "-3", "refuses"),
        ("user", "0", "refuses"),
        ("session", " ", "refuses"),
        ("User", "", "identity scope"),
    ],
)
def test_import_judges_identity_scopes_like_every_other_path(
    tmp_path: Path, scope: str, scope_id: str, words: str
) -> None:
    """An import cannot create a user or session bucket the scope rules would refuse."""
    with Store(tmp_path / "x.db") as store:
        with pytest.raises(InvalidImport, match=words):
            store.import_records([{**GOOD, "scope": scope, "scope_id": scope_id}])
        assert store.buffers() == []


def test_import_stores_the_canonical_identity(tmp_path: Path) -> None:
    """' 7 ' is user 7: the import lands in the bucket store.buffer('user', '7', ...) reads."""
    with Store(tmp_path / "x.db") as store:
        store.import_records([{**GOOD, "scope": "user", "scope_id": " 7 "}])
        assert store.buffer("user", "7", "k").read()[0]["content"] == "fine"


def test_two_spellings_of_one_identity_in_one_import_are_refused(tmp_path: Path) -> None:
    """'7' and ' 7' name one user bucket: the import says so instead of mixing or wiping them."""
    with Store(tmp_path / "x.db") as store:
        with pytest.raises(InvalidImport, match="another spelling"):
            store.import_records(
                [
                    {**GOOD, "scope": "user", "scope_id": "7", "content": "one"},
                    {**GOOD, "scope": "user", "scope_id": " 7", "content": "two"},
                ],
                replace=True,
            )
        assert store.buffers() == []

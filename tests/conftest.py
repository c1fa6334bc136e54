"""Shared fixtures: real SQLite files in a temporary folder, never mocks."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import Store

SPEC_EXAMPLES = Path(__file__).parent / "spec_examples"


def spec_examples(rule: str) -> list[dict[str, Any]]:
    """The examples of a rule, as copied from the spec (see spec_examples/README.md)."""
    data = json.loads((SPEC_EXAMPLES / f"{rule}.json").read_text(encoding="utf-8"))
    return data["examples"]


def snapshot(path: Path | str) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Every table's rows and the header pragmas, read through a separate connection."""
    conn = sqlite3.connect(path)
    try:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        result = [
            (table, sorted(conn.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr))
            for table in tables
        ]
        for pragma in ("user_version", "application_id"):
            result.append((pragma, [conn.execute(f"PRAGMA {pragma}").fetchone()]))
        return result
    finally:
        conn.close()


@pytest.fixture
def store() -> Iterator[Store]:
    with Store(":memory:") as s:
        yield s


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "chat.db"


@pytest.fixture
def file_store(db_path: Path) -> Iterator[Store]:
    with Store(db_path) as s:
        yield s

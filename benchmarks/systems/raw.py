"""The floor: raw ``sqlite3``, one table, one INSERT+COMMIT per message.

Same pragmas as flowdrop_local at each durability (WAL, synchronous NORMAL or
FULL). ``json.dumps`` and ``json.loads`` run inside the timer, as a library would
have to run them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import ClassVar

from ..core import (
    APPEND,
    COLD,
    HEAL_1,
    HEAL_10,
    IMPORT,
    READ,
    Msg,
    System,
    declaring_turn,
    pragmas_of,
)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, buffer TEXT NOT NULL, "
    "body TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS messages_buffer ON messages (buffer, id);"
)
_INSERT = "INSERT INTO messages (buffer, body) VALUES (?, ?)"
_LAST = "SELECT body FROM messages WHERE buffer = ? ORDER BY id DESC LIMIT ?"
_BUFFER = "conversation-1"
_SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}


class RawSqlite(System):
    """``sqlite3`` with no library on top: the cost any store has to pay."""

    family = "raw"
    label = "raw sqlite3"
    supports: ClassVar[frozenset[str]] = frozenset({APPEND, HEAL_1, HEAL_10, READ, COLD, IMPORT})
    measured_always = True

    def _connect(self, path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path)  # default isolation: INSERT opens, commit() ends
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.durability]}")
        return conn

    def open(self, path: Path, messages: list[Msg]) -> None:
        self.path = path
        self.conn = self._connect(path)
        self.conn.executescript(_SCHEMA)
        self.conn.executemany(_INSERT, [(_BUFFER, json.dumps(m)) for m in messages])
        self.conn.commit()

    def pragmas(self) -> str:
        return pragmas_of(self.conn)

    def close(self) -> None:
        self.conn.close()

    def append(self, msg: Msg) -> int:
        conn = self.conn
        started = time.perf_counter_ns()
        conn.execute(_INSERT, (_BUFFER, json.dumps(msg)))
        conn.commit()
        return time.perf_counter_ns() - started

    def heal(self, call_ids: list[str], user: Msg) -> int:
        """The floor of healing: k placeholder rows and the user row in one transaction."""
        conn = self.conn
        conn.execute(_INSERT, (_BUFFER, json.dumps(declaring_turn(call_ids))))
        conn.commit()
        started = time.perf_counter_ns()
        conn.executemany(
            _INSERT,
            [
                (_BUFFER, json.dumps({"role": "tool", "tool_call_id": c, "content": "[no result]"}))
                for c in call_ids
            ],
        )
        conn.execute(_INSERT, (_BUFFER, json.dumps(user)))
        conn.commit()
        return time.perf_counter_ns() - started

    def read(self, limit: int) -> int:
        conn = self.conn
        started = time.perf_counter_ns()
        rows = conn.execute(_LAST, (_BUFFER, limit)).fetchall()
        rows.reverse()
        [json.loads(body) for (body,) in rows]
        return time.perf_counter_ns() - started

    def cold_read(self, limit: int) -> int:
        assert self.path is not None
        started = time.perf_counter_ns()
        conn = self._connect(self.path)
        rows = conn.execute(_LAST, (_BUFFER, limit)).fetchall()
        rows.reverse()
        [json.loads(body) for (body,) in rows]
        elapsed = time.perf_counter_ns() - started
        conn.close()
        return elapsed

    def import_batch(self, path: Path, messages: list[Msg]) -> int:
        conn = self._connect(path)
        conn.executescript(_SCHEMA)
        started = time.perf_counter_ns()
        conn.executemany(_INSERT, [(_BUFFER, json.dumps(m)) for m in messages])
        conn.commit()
        elapsed = time.perf_counter_ns() - started
        conn.close()
        return elapsed

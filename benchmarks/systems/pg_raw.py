"""The floor on PostgreSQL: raw psycopg, one table, one ``INSERT`` committing per message.

The table is ``(id bigserial PRIMARY KEY, session text, body text)`` with an index
on ``(session, id)``. The connection is in autocommit mode, so an ``INSERT`` is its
own transaction and commits in the one round trip that sends it: the cheapest
durable append psycopg can make. (psycopg's default mode would add a ``BEGIN``
and a ``COMMIT``, each a round trip of its own.) Statements are prepared;
``json.dumps`` and ``json.loads`` run inside the timer, as a library would have to
run them.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar

import psycopg

from ..core import APPEND, COLD, HEAL_1, HEAL_10, READ, Msg, declaring_turn
from ..server import ServerSystem

SCHEMA = (
    "CREATE TABLE messages (id bigserial PRIMARY KEY, session text NOT NULL, "
    "body text NOT NULL);"
    "CREATE INDEX messages_session ON messages (session, id);"
)
INSERT = "INSERT INTO messages (session, body) VALUES (%s, %s)"
_LAST = "SELECT body FROM messages WHERE session = %s ORDER BY id DESC LIMIT %s"
SESSION = "conversation-1"


def connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit connection: each statement commits, a pipeline holds a transaction."""
    return psycopg.connect(url, autocommit=True)


class RawPsycopg(ServerSystem):
    """psycopg 3 with no library on top: the cost any store on this server has to pay."""

    family = "raw"
    label = "raw psycopg"
    supports: ClassVar[frozenset[str]] = frozenset({APPEND, HEAL_1, HEAL_10, READ, COLD})
    measured_always = True
    driver = f"psycopg {psycopg.__version__}, autocommit INSERT"

    def connect(self, url: str, messages: list[Msg]) -> None:
        self.url = url
        self.conn = connect(url)
        self.cursor = self.conn.cursor()
        self.conn.execute(SCHEMA)
        with self.cursor.copy("COPY messages (session, body) FROM STDIN") as copy:
            for message in messages:
                copy.write_row((SESSION, json.dumps(message)))
        self.conn.execute("ANALYZE messages")

    def close(self) -> None:
        self.conn.close()

    def append(self, msg: Msg) -> int:
        execute = self.cursor.execute
        started = time.perf_counter_ns()
        execute(INSERT, (SESSION, json.dumps(msg)), prepare=True)
        return time.perf_counter_ns() - started

    def heal(self, call_ids: list[str], user: Msg) -> int:
        """The floor of healing: k placeholder rows and the user row, one transaction, one trip."""
        cursor = self.cursor
        cursor.execute(INSERT, (SESSION, json.dumps(declaring_turn(call_ids))), prepare=True)
        started = time.perf_counter_ns()
        with self.conn.pipeline():
            cursor.execute("BEGIN")
            cursor.executemany(
                INSERT,
                [
                    (
                        SESSION,
                        json.dumps({"role": "tool", "tool_call_id": c, "content": "[no result]"}),
                    )
                    for c in call_ids
                ],
            )
            cursor.execute(INSERT, (SESSION, json.dumps(user)), prepare=True)
            cursor.execute("COMMIT")
        return time.perf_counter_ns() - started

    @staticmethod
    def _last(cursor: psycopg.Cursor[Any], limit: int) -> None:
        rows = cursor.execute(_LAST, (SESSION, limit), prepare=True).fetchall()
        rows.reverse()
        [json.loads(body) for (body,) in rows]

    def read(self, limit: int) -> int:
        cursor = self.cursor
        started = time.perf_counter_ns()
        self._last(cursor, limit)
        return time.perf_counter_ns() - started

    def cold_read(self, limit: int) -> int:
        started = time.perf_counter_ns()
        conn = connect(self.url)
        self._last(conn.cursor(), limit)
        elapsed = time.perf_counter_ns() - started
        conn.close()
        return elapsed

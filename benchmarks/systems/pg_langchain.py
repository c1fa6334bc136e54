"""LangChain ``PostgresChatMessageHistory`` (langchain-postgres) on one psycopg connection.

As its documentation shows: ``psycopg.connect(url)`` in psycopg's default
transaction mode, ``create_tables`` once, a UUID session id. It has no "last N"
read: ``history.messages`` loads the whole session (``ORDER BY id``), and a caller
slices the last 50. Its table is indexed on ``session_id`` alone.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
from langchain_postgres import PostgresChatMessageHistory

from ..core import Msg
from ..server import ServerSystem
from .langchain_sql import to_langchain

_TABLE = "chat_history"
_SESSION = str(uuid.UUID(int=1))


class PgLangchainHistory(ServerSystem):
    """One connection and one ``PostgresChatMessageHistory``, as an application keeps them."""

    family = "langchain"
    label = "LangChain PostgresChatMessageHistory"
    driver = f"psycopg {psycopg.__version__}, default transactions"

    def _history(self) -> tuple[psycopg.Connection[Any], PostgresChatMessageHistory]:
        conn = psycopg.connect(self.url)
        return conn, PostgresChatMessageHistory(_TABLE, _SESSION, sync_connection=conn)

    def connect(self, url: str, messages: list[Msg]) -> None:
        self.url = url
        self.conn, self.history = self._history()
        PostgresChatMessageHistory.create_tables(self.conn, _TABLE)
        if messages:
            self.history.add_messages([to_langchain(m) for m in messages])

    def close(self) -> None:
        self.conn.close()

    def append(self, msg: Msg) -> int:
        message = to_langchain(msg)
        add = self.history.add_message
        started = time.perf_counter_ns()
        add(message)
        return time.perf_counter_ns() - started

    def read(self, limit: int) -> int:
        history = self.history
        started = time.perf_counter_ns()
        history.messages[-limit:]
        elapsed = time.perf_counter_ns() - started
        self.conn.rollback()  # it leaves the read's transaction open; end it untimed
        return elapsed

    def cold_read(self, limit: int) -> int:
        started = time.perf_counter_ns()
        conn, history = self._history()
        history.messages[-limit:]
        elapsed = time.perf_counter_ns() - started
        conn.close()
        return elapsed

"""LangGraph on PostgreSQL: ``add_messages`` state checkpointed by ``PostgresSaver``.

The connection is made as langgraph-checkpoint-postgres requires (autocommit,
``prepare_threshold=0``, ``dict_row``), ``setup()`` creates its tables. Appending
is ``graph.update_state(config, {"messages": [m]})``, reading
``graph.get_state(config)``, as with ``SqliteSaver`` (see ``langgraph_saver``).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from ..core import Msg
from ..server import ServerSystem
from .langchain_sql import to_langchain
from .langgraph_saver import _CONFIG, _builder


class PgLanggraphSaver(ServerSystem):
    """One connection, one ``PostgresSaver``, one compiled graph."""

    family = "langgraph"
    label = "LangGraph add_messages + PostgresSaver"
    driver = f"psycopg {psycopg.__version__}, autocommit"

    def _graph(self) -> tuple[psycopg.Connection[Any], Any]:
        conn: psycopg.Connection[Any] = psycopg.connect(
            self.url, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        return conn, _builder().compile(checkpointer=PostgresSaver(conn))

    def connect(self, url: str, messages: list[Msg]) -> None:
        self.url = url
        self.conn, self.graph = self._graph()
        PostgresSaver(self.conn).setup()
        self.graph.update_state(_CONFIG, {"messages": [to_langchain(m) for m in messages]})

    def close(self) -> None:
        self.conn.close()

    def append(self, msg: Msg) -> int:
        update = {"messages": [to_langchain(msg)]}
        update_state = self.graph.update_state
        started = time.perf_counter_ns()
        update_state(_CONFIG, update)
        return time.perf_counter_ns() - started

    def read(self, limit: int) -> int:
        get_state = self.graph.get_state
        started = time.perf_counter_ns()
        get_state(_CONFIG).values["messages"][-limit:]
        return time.perf_counter_ns() - started

    def cold_read(self, limit: int) -> int:
        started = time.perf_counter_ns()
        conn, graph = self._graph()
        graph.get_state(_CONFIG).values["messages"][-limit:]
        elapsed = time.perf_counter_ns() - started
        conn.close()
        return elapsed

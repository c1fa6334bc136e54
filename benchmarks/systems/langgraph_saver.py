"""LangGraph: a ``StateGraph`` whose state is ``messages`` reduced by ``add_messages``,
checkpointed by ``SqliteSaver``.

Appending is ``graph.update_state(config, {"messages": [m]})``: the reducer merges
the message and the saver writes one checkpoint, with no node run (cheaper than
``invoke``). Reading is ``graph.get_state(config)``, which loads the latest
checkpoint: the whole list. Each checkpoint stores the whole list again.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from ..core import Msg, System, pragmas_of
from .langchain_sql import to_langchain

_CONFIG: Any = {"configurable": {"thread_id": "conversation-1"}}


class _State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _respond(state: _State) -> dict[str, Any]:
    return {}


def _builder() -> Any:
    builder = StateGraph(_State)
    builder.add_node("agent", _respond)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder


class LanggraphSaver(System):
    """One connection, one ``SqliteSaver``, one compiled graph; one thread."""

    family = "langgraph"
    label = "LangGraph add_messages + SqliteSaver"
    durabilities = ("full",)

    @staticmethod
    def _graph(path: Path) -> tuple[sqlite3.Connection, Any]:
        conn = sqlite3.connect(path, check_same_thread=False)
        return conn, _builder().compile(checkpointer=SqliteSaver(conn))

    def open(self, path: Path, messages: list[Msg]) -> None:
        self.path = path
        self.conn, self.graph = self._graph(path)
        self.graph.update_state(_CONFIG, {"messages": [to_langchain(m) for m in messages]})

    def pragmas(self) -> str:
        return pragmas_of(self.conn)

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
        assert self.path is not None
        started = time.perf_counter_ns()
        conn, graph = self._graph(self.path)
        graph.get_state(_CONFIG).values["messages"][-limit:]
        elapsed = time.perf_counter_ns() - started
        conn.close()
        return elapsed

    def import_batch(self, path: Path, messages: list[Msg]) -> int:
        update = {"messages": [to_langchain(m) for m in messages]}
        conn, graph = self._graph(path)
        try:
            started = time.perf_counter_ns()
            graph.update_state(_CONFIG, update)
            return time.perf_counter_ns() - started
        finally:
            conn.close()

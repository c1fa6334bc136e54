"""LangChain ``SQLChatMessageHistory`` (langchain_community) on a SQLAlchemy engine.

It has no "last N" read: ``history.messages`` loads the whole session, and a
caller slices the last 50. Its SQLite file keeps SQLite's defaults (rollback
journal, synchronous FULL) and no index on ``session_id``.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from sqlalchemy import Engine, create_engine

from ..core import Msg, System, pragmas_of

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from langchain_community.chat_message_histories import SQLChatMessageHistory

_SESSION = "conversation-1"


def to_langchain(msg: Msg) -> BaseMessage:
    """The LangChain message for an OpenAI chat one (built outside the timer)."""
    role = msg["role"]
    if role == "user":
        return HumanMessage(msg["content"])
    if role == "tool":
        return ToolMessage(msg["content"], tool_call_id=msg["tool_call_id"])
    calls = [
        {
            "name": call["function"]["name"],
            "args": json.loads(call["function"]["arguments"]),
            "id": call["id"],
        }
        for call in msg.get("tool_calls", ())
    ]
    return AIMessage(msg["content"], tool_calls=calls)


class LangchainHistory(System):
    """One engine and one ``SQLChatMessageHistory``, as an application keeps them."""

    family = "langchain"
    label = "LangChain SQLChatMessageHistory"
    durabilities = ("full",)

    @staticmethod
    def _history(path: Path) -> tuple[Engine, SQLChatMessageHistory]:
        engine = create_engine(f"sqlite:///{path}")
        return engine, SQLChatMessageHistory(_SESSION, connection=engine)

    def open(self, path: Path, messages: list[Msg]) -> None:
        self.path = path
        self.engine, self.history = self._history(path)
        if messages:
            self.history.add_messages([to_langchain(m) for m in messages])

    def pragmas(self) -> str:
        raw = self.engine.raw_connection()
        try:
            return pragmas_of(raw.driver_connection)  # type: ignore[arg-type]
        finally:
            raw.close()

    def close(self) -> None:
        self.engine.dispose()

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
        return time.perf_counter_ns() - started

    def cold_read(self, limit: int) -> int:
        assert self.path is not None
        started = time.perf_counter_ns()
        engine, history = self._history(self.path)
        history.messages[-limit:]
        elapsed = time.perf_counter_ns() - started
        engine.dispose()
        return elapsed

    def import_batch(self, path: Path, messages: list[Msg]) -> int:
        batch = [to_langchain(m) for m in messages]
        engine, history = self._history(path)
        try:
            started = time.perf_counter_ns()
            history.add_messages(batch)
            return time.perf_counter_ns() - started
        finally:
            engine.dispose()

"""OpenAI Agents SDK ``SQLiteSession``: async, so every call goes through one event loop.

The timer runs inside the coroutine around the awaited call, so it counts the
session's own thread hop (``asyncio.to_thread``) but not the loop's start-up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from agents.memory import SQLiteSession

from ..core import Msg, System, pragmas_of

_SESSION = "conversation-1"


def to_items(messages: list[Msg]) -> list[Any]:
    """Responses-API input items for OpenAI chat messages: a call and its output are items."""
    items: list[Any] = []
    for msg in messages:
        if msg["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": msg["tool_call_id"],
                    "output": msg["content"],
                }
            )
        elif msg.get("tool_calls"):
            items += [
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                }
                for call in msg["tool_calls"]
            ]
        else:
            items.append({"role": msg["role"], "content": msg["content"]})
    return items


async def _timed(call: Awaitable[Any]) -> int:
    started = time.perf_counter_ns()
    await call
    return time.perf_counter_ns() - started


class AgentsSession(System):
    """``SQLiteSession(session_id, db_path)``: WAL, Python's default synchronous (FULL)."""

    family = "agents"
    label = "OpenAI Agents SQLiteSession"

    durabilities = ("full",)

    def open(self, path: Path, messages: list[Msg]) -> None:
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.session = SQLiteSession(_SESSION, path)
        if messages:
            self.loop.run_until_complete(self.session.add_items(to_items(messages)))

    def pragmas(self) -> str:
        return pragmas_of(self.session._get_connection())

    def close(self) -> None:
        self.session.close()
        self.loop.close()

    def append(self, msg: Msg) -> int:
        items = to_items([msg])
        return self.loop.run_until_complete(_timed(self.session.add_items(items)))

    def read(self, limit: int) -> int:
        return self.loop.run_until_complete(_timed(self.session.get_items(limit)))

    def cold_read(self, limit: int) -> int:
        assert self.path is not None
        path = self.path
        holder: list[SQLiteSession] = []

        async def open_and_read() -> int:
            started = time.perf_counter_ns()
            session = SQLiteSession(_SESSION, path)
            holder.append(session)
            await session.get_items(limit)
            return time.perf_counter_ns() - started

        elapsed = self.loop.run_until_complete(open_and_read())
        holder[0].close()
        return elapsed

    def import_batch(self, path: Path, messages: list[Msg]) -> int:
        items = to_items(messages)
        loop = asyncio.new_event_loop()
        session = SQLiteSession(_SESSION, path)
        try:
            return loop.run_until_complete(_timed(session.add_items(items)))
        finally:
            session.close()
            loop.close()

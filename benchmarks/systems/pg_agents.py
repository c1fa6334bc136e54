"""OpenAI Agents SDK ``SQLAlchemySession`` on PostgreSQL: SQLAlchemy async with asyncpg.

``asyncpg`` is the driver the SDK's documentation shows for PostgreSQL. Every
call runs on one event loop; the timer runs inside the coroutine around the
awaited call. The session's tables are created by the session itself
(``create_tables=True``); ``search_path`` goes to the server as a setting of each
connection.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg  # type: ignore[import-untyped]
import psycopg
from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..core import Msg
from ..server import ServerSystem
from .agents_sdk import _timed, to_items

_SESSION = "conversation-1"


def _engine(url: str) -> AsyncEngine:
    """An asyncpg engine for a libpq URL (host may be a socket directory)."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    options = str(info.get("options", ""))
    settings = {}
    if options.startswith("-csearch_path="):
        settings["search_path"] = options.removeprefix("-csearch_path=")
    target = URL.create(
        "postgresql+asyncpg",
        username=str(info.get("user") or "") or None,
        password=str(info.get("password") or "") or None,
        host=str(info.get("host") or "") or None,
        port=int(info["port"]) if info.get("port") else None,
        database=str(info.get("dbname") or "") or None,
    )
    return create_async_engine(target, connect_args={"server_settings": settings})


class PgAgentsSession(ServerSystem):
    """``SQLAlchemySession(session_id, engine=...)``: one engine (its pool), one loop."""

    family = "agents"
    label = "OpenAI Agents SQLAlchemySession"
    driver = f"SQLAlchemy async + asyncpg {asyncpg.__version__}"

    def _open(self) -> tuple[AsyncEngine, SQLAlchemySession]:
        engine = _engine(self.url)
        return engine, SQLAlchemySession(_SESSION, engine=engine, create_tables=True)

    def connect(self, url: str, messages: list[Msg]) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.engine, self.session = self._open()
        items = to_items(messages)
        self.loop.run_until_complete(self.session.add_items(items))

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.dispose())
        self.loop.close()

    def append(self, msg: Msg) -> int:
        items = to_items([msg])
        return self.loop.run_until_complete(_timed(self.session.add_items(items)))

    def read(self, limit: int) -> int:
        return self.loop.run_until_complete(_timed(self.session.get_items(limit)))

    def cold_read(self, limit: int) -> int:
        holder: list[AsyncEngine] = []

        async def open_and_read() -> int:
            started = time.perf_counter_ns()
            engine, session = self._open()
            holder.append(engine)
            await session.get_items(limit)
            return time.perf_counter_ns() - started

        elapsed = self.loop.run_until_complete(open_and_read())
        self.loop.run_until_complete(holder[0].dispose())
        return elapsed

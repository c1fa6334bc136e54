"""flowdrop_local on PostgreSQL, through its public API: ``Store(url)``, ``append``, ``read``."""

from __future__ import annotations

import time
from typing import ClassVar

from flowdrop_local import Store

from ..core import APPEND, COLD, HEAL_1, HEAL_10, READ, Msg
from ..server import ServerSystem
from .flowdrop import ADDRESS, BufferTimings


class PgFlowdrop(BufferTimings, ServerSystem):
    """One ``Store`` (a pool of up to 8 connections) and one ``Buffer``, as a service keeps them."""

    family = "flowdrop"
    label = "flowdrop_local"
    supports: ClassVar[frozenset[str]] = frozenset({APPEND, HEAL_1, HEAL_10, READ, COLD})
    measured_always = True
    driver = "psycopg 3 pool, pipelined"

    def connect(self, url: str, messages: list[Msg]) -> None:
        self.url = url
        self.store = Store(url)
        self.buffer = self.store.buffer(*ADDRESS)
        if messages:
            self.buffer.append(messages)  # one call, one transaction, every rule applied

    def close(self) -> None:
        self.store.close()


    def cold_read(self, limit: int) -> int:
        started = time.perf_counter_ns()
        store = Store(self.url)
        store.buffer(*ADDRESS).read(limit=limit)
        elapsed = time.perf_counter_ns() - started
        store.close()
        return elapsed

"""flowdrop_local through its public API: ``Store``, ``store.buffer``, ``append``, ``read``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

from flowdrop_local import Buffer, Store

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

ADDRESS = ("user", "u-1", "conversation-1")


class BufferTimings:
    """The timed calls on one ``Buffer`` handle, the same on either backend."""

    buffer: Buffer

    def append(self, msg: Msg) -> int:
        append = self.buffer.append
        started = time.perf_counter_ns()
        append(msg)
        return time.perf_counter_ns() - started

    def heal(self, call_ids: list[str], user: Msg) -> int:
        self.buffer.append(declaring_turn(call_ids))
        append = self.buffer.append
        started = time.perf_counter_ns()
        result = append(user)
        elapsed = time.perf_counter_ns() - started
        if len(result.healed_ids) != len(call_ids):  # the workload is wrong, not slow
            raise RuntimeError(f"expected {len(call_ids)} healed, got {len(result.healed_ids)}")
        return elapsed

    def read(self, limit: int) -> int:
        read = self.buffer.read
        started = time.perf_counter_ns()
        read(limit=limit)
        return time.perf_counter_ns() - started


class Flowdrop(BufferTimings, System):
    """One ``Store`` (one connection) and one ``Buffer`` handle, as an agent loop keeps them."""

    family = "flowdrop"
    label = "flowdrop_local"
    supports: ClassVar[frozenset[str]] = frozenset({APPEND, HEAL_1, HEAL_10, READ, COLD, IMPORT})
    measured_always = True

    def open(self, path: Path, messages: list[Msg]) -> None:
        self.path = path
        self.store = Store(path, durability=self.durability)  # type: ignore[arg-type]
        self.buffer = self.store.buffer(*ADDRESS)
        if messages:
            self.buffer.append(messages)

    def pragmas(self) -> str:
        return pragmas_of(self.store.db.conn)  # synchronous is per connection: ask the store's

    def close(self) -> None:
        self.store.close()


    def cold_read(self, limit: int) -> int:
        assert self.path is not None
        started = time.perf_counter_ns()
        store = Store(self.path, durability=self.durability)  # type: ignore[arg-type]
        store.buffer(*ADDRESS).read(limit=limit)
        elapsed = time.perf_counter_ns() - started
        store.close()
        return elapsed

    def import_batch(self, path: Path, messages: list[Msg]) -> int:
        with Store(path, durability=self.durability) as store:  # type: ignore[arg-type]
            buffer = store.buffer(*ADDRESS)
            started = time.perf_counter_ns()
            buffer.append(messages)
            return time.perf_counter_ns() - started

"""What every benchmarked system implements, the message corpus, and the statistics.

A system is one storage library at one durability, behind the :class:`System`
interface. Each operation does its own untimed preparation (converting a message
to the library's type, declaring the calls a healing append will answer) and
returns the nanoseconds of the timed part only: the call a user of the library
would make.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sqlite3
import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import attrs

Msg = dict[str, Any]
"""A message in the neutral ``{"role", "content"}`` shape; systems convert it."""

APPEND = "append"
HEAL_1 = "heal k=1"
HEAL_10 = "heal k=10"
READ = "read last 50"
COLD = "cold open + read last 50"
IMPORT = "import batch"
WORKLOADS: tuple[str, ...] = (APPEND, HEAL_1, HEAL_10, READ, COLD, IMPORT)
"""Every workload, in run order."""
READ_LIMIT = 50

_TEXT = (
    "The quick brown fox jumps over the lazy dog while the agent plans its next tool call, "
    "weighs the user's request against the history it has, and writes a reply that is long "
    "enough to look like a real turn of a conversation with a language model. "
)


_CALL_IDS = itertools.count()  # unique across workloads: one buffer serves them all


def message(i: int) -> Msg:
    """The ``i``-th message of a pre-filled agent conversation, in the OpenAI chat shape.

    Turns repeat in fours: a user turn, an assistant turn declaring one tool call,
    the tool's result, the assistant's reply. A quarter of the history declares a
    call, so a buffer of n messages holds n / 4 answered calls in its ledger.
    """
    start = (i * 7) % 80
    text = f"[{i}] " + (_TEXT * 2)[start : start + 220]
    turn = i % 4
    if turn == 0:
        return {"role": "user", "content": text}
    if turn == 1:
        return declaring_turn([f"call_h{i}"], arguments=f'{{"query": "{text[:60]}"}}')
    if turn == 2:
        return {"role": "tool", "tool_call_id": f"call_h{i - 1}", "content": text}
    return {"role": "assistant", "content": text}


def history(n: int) -> list[Msg]:
    """The first ``n`` messages of the corpus, never ending on an unanswered call."""
    messages = [message(i) for i in range(n)]
    if messages and messages[-1].get("tool_calls"):
        messages[-1] = {"role": "assistant", "content": "[the call was never made]"}
    return messages


def declaring_turn(call_ids: list[str], arguments: str = "{}") -> Msg:
    """An assistant turn declaring ``call_ids`` in the OpenAI chat shape."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "lookup", "arguments": arguments},
            }
            for call_id in call_ids
        ],
    }


def remove_database(path: Path) -> None:
    """Delete a SQLite file with its WAL and shared-memory companions."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")


def pragmas_of(conn: sqlite3.Connection) -> str:
    """``"WAL, synchronous=FULL"``: what a connection runs with."""
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return f"{str(mode).upper()}, synchronous={['OFF', 'NORMAL', 'FULL', 'EXTRA'][sync]}"


class Unsupported(Exception):
    """The system has no equivalent of this workload."""


class System(ABC):
    """One library at one durability, holding one pre-filled buffer."""

    family: ClassVar[str]
    """The ``--systems`` name: flowdrop, raw, agents, langchain, langgraph."""
    label: ClassVar[str]
    """How the tables name the library."""
    supports: ClassVar[frozenset[str]] = frozenset({APPEND, READ, COLD, IMPORT})
    """The workloads it has an equivalent for."""
    measured_always: ClassVar[bool] = False
    """Never skipped for time (flowdrop_local and its floor): at least the minimum rounds."""
    durabilities: ClassVar[tuple[str, ...]] = ("normal", "full")
    """The settings it can run with; a peer has one, its default, named by the floor it meets."""

    def __init__(self, durability: str) -> None:
        self.durability = durability
        self.path: Path | None = None

    @property
    def key(self) -> str:
        """A unique name: the family and, where it has a choice, the durability."""
        if len(self.durabilities) == 1:
            return self.family
        return f"{self.family}-{self.durability}"

    @property
    def name(self) -> str:
        """The row label of the tables."""
        if len(self.durabilities) == 1:
            return self.label
        return f"{self.label} ({self.durability})"

    @property
    def floor(self) -> str:
        """The key of the raw sqlite3 system this one is compared with."""
        return f"raw-{self.durability}"

    @abstractmethod
    def open(self, path: Path, messages: list[Msg]) -> None:
        """Create ``path`` holding one buffer pre-filled with ``messages`` (untimed)."""

    @abstractmethod
    def pragmas(self) -> str:
        """The journal mode and synchronous setting the library runs with."""

    @abstractmethod
    def close(self) -> None:
        """Release every connection."""

    @abstractmethod
    def append(self, msg: Msg) -> int:
        """Append one message; return the timed nanoseconds."""

    def heal(self, call_ids: list[str], user: Msg) -> int:
        """Declare ``call_ids`` in one turn (untimed), then time the user append answering them."""
        raise Unsupported

    @abstractmethod
    def read(self, limit: int) -> int:
        """Read the last ``limit`` messages in order."""

    @abstractmethod
    def cold_read(self, limit: int) -> int:
        """Open the file anew (new connection, new library object) and read the last ``limit``."""

    @abstractmethod
    def import_batch(self, path: Path, messages: list[Msg]) -> int:
        """Store ``messages`` into a new file ``path`` in one call; time that call only."""

    def operation(self, workload: str) -> Callable[[], int]:
        """A no-argument operation for ``workload`` (raises :class:`Unsupported`)."""
        if workload not in self.supports or workload == IMPORT:
            raise Unsupported
        if workload == APPEND:
            counter = itertools.count()
            return lambda: self.append(
                {"role": "user", "content": f"appended turn {next(counter)}: " + _TEXT[:200]}
            )
        if workload in (HEAL_1, HEAL_10):
            k = 1 if workload == HEAL_1 else 10
            return lambda: self.heal(
                [f"call_{next(_CALL_IDS)}" for _ in range(k)],
                {"role": "user", "content": "the next user turn " + _TEXT[:160]},
            )
        if workload == READ:
            return lambda: self.read(READ_LIMIT)
        if workload == COLD:
            return lambda: self.cold_read(READ_LIMIT)
        raise Unsupported


def timed(call: Callable[[], object]) -> int:
    """Run ``call`` and return its nanoseconds."""
    started = time.perf_counter_ns()
    call()
    return time.perf_counter_ns() - started


@attrs.frozen
class Cell:
    """The samples of one system for one workload at one history length."""

    workload: str
    size: int
    system: str
    name: str
    floor: str
    samples: tuple[int, ...] = ()
    skipped: str | None = None
    peak_bytes: int | None = None

    @property
    def median(self) -> float:
        """Median nanoseconds."""
        return float(statistics.median(self.samples))

    @property
    def p95(self) -> float:
        """95th percentile in nanoseconds (nearest rank)."""
        ordered = sorted(self.samples)
        return float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)])


def fmt_ns(ns: float) -> str:
    """A duration in the unit that keeps three significant digits readable."""
    if ns < 1_000_000:
        return f"{ns / 1_000:.1f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.2f} ms"
    return f"{ns / 1_000_000_000:.2f} s"


def fmt_bytes(n: int) -> str:
    """A byte count in KiB or MiB."""
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"

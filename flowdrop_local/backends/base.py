"""What every backend offers the handles above it."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Literal, TypeVar

from ..check import Violation
from ..plans import AsyncTransaction, BufferState, Transaction

Durability = Literal["normal", "full"]
T = TypeVar("T")


class Tx(Transaction, abc.ABC):
    """One open transaction: the engine's steps plus what the handles need."""

    @abc.abstractmethod
    def remember(self, state: BufferState) -> None:
        """Keep ``state`` as the buffer's tail once this transaction commits (a cache)."""

    def script(self, sql: str) -> None:
        """Run SQL that is not a named statement (creating the optional search objects)."""
        raise NotImplementedError


class AsyncTx(AsyncTransaction, abc.ABC):
    """:class:`Tx`, awaited: the async PostgreSQL transaction, the source its blocking
    twin is generated from (backends/postgresql_io_async.py)."""

    @abc.abstractmethod
    def remember(self, state: BufferState) -> None:
        """As :meth:`Tx.remember`."""

    async def script(self, sql: str) -> None:
        """As :meth:`Tx.script`."""
        raise NotImplementedError


class Backend(abc.ABC):
    """A database: its connections, transactions and dialect.

    ``kind`` is ``"sqlite"`` or ``"postgresql"``; ``where`` names the database for
    messages (a path, or a URL without its password).
    """

    kind: str
    where: str
    read_only: bool
    durability: Durability

    @abc.abstractmethod
    def write(self, *, keep_tails: bool = False) -> AbstractContextManager[Tx]:
        """One write transaction, serialised with every other writer (MEM-12).

        Commits when the block ends, rolls back on any exception (``KeyboardInterrupt``
        included) and raises the library's error for a damaged or read-only database.
        """

    def transact(self, work: Callable[[Tx], T], *, keep_tails: bool = False) -> T:
        """Run ``work`` in one write transaction (again, where a backend retries conflicts)."""
        with self.write(keep_tails=keep_tails) as tx:
            return work(tx)

    @abc.abstractmethod
    def read(self, *, snapshot: bool = True) -> AbstractContextManager[Tx]:
        """One read transaction: every statement in it sees one snapshot.

        ``snapshot=False`` is for a block of one statement, which is consistent on
        its own: PostgreSQL then runs it without BEGIN/COMMIT (one round trip).
        """

    @abc.abstractmethod
    def snapshot_rows(self, reads: list[tuple[str, Any]]) -> Iterator[tuple[int, Any]]:
        """``(i, row)`` for the rows of each read in turn (an export), all from one
        snapshot on a connection of its own.

        Fetched a chunk at a time as the caller iterates; the store's writers go on
        meanwhile. The connection is released when the iteration ends, is closed or
        is dropped.
        """

    @abc.abstractmethod
    def check(self) -> list[Violation]:
        """Every broken invariant (empty when sound); see :mod:`flowdrop_local.check`."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once :meth:`close` ran."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connections. Idempotent."""

    @abc.abstractmethod
    def ensure_open(self) -> None:
        """Raise ``StoreClosed`` when the backend can no longer be used."""

    @abc.abstractmethod
    def vacuum(self) -> None:
        """Compact the database (SQLite: VACUUM and a WAL checkpoint)."""

    @abc.abstractmethod
    def backup(self, path: str) -> None:
        """Write a consistent copy to a new file at ``path``."""

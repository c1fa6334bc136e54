"""Plans and their steps: how the rules speak to storage without touching it.

A plan is a generator that *asks* for what it needs and *says* what to write, one
step at a time, as h11 does for HTTP. A step is one of the small records below,
plain data; a driver answers each step on a real transaction and sends the answer
back: :func:`run_plan` on a blocking transaction, :func:`run_plan_async` on an
async one. So the engine's rules and the handles' operations are written once and
run unchanged on SQLite and PostgreSQL, blocking or async.

``statement`` names a statement every backend defines in its own dialect
(``backends/sqlite.py``, ``backends/postgresql.py``;
``tests/test_backends.py`` checks that each name a plan uses exists in both).
The step's type says what it wants back:

* :class:`One`: the first row, or ``None``; :class:`All`: every row;
* :class:`Run`: the number of rows changed; :class:`Write`: nothing (a backend may
  queue it and send it with the next step, one round trip for many writes);
* :class:`Many`: nothing; ``rows`` is a list of parameter rows (executemany);
* :class:`OpenBuffer`: the buffer's :class:`BufferState`, creating its row and
  taking its write lock.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final, NamedTuple, Protocol


class One(NamedTuple):
    """Read the first row of ``statement`` (``None`` when there is none)."""

    statement: str
    params: Any = ()


class All(NamedTuple):
    """Read every row of ``statement``."""

    statement: str
    params: Any = ()


class Run(NamedTuple):
    """Execute ``statement``; the answer is how many rows it changed."""

    statement: str
    params: Any = ()


class Write(NamedTuple):
    """Execute ``statement``; no answer (the backend may send it with the next step)."""

    statement: str
    params: Any = ()


class Many(NamedTuple):
    """Execute ``statement`` once per parameter row of ``rows``; no answer."""

    statement: str
    rows: Any


class OpenBuffer(NamedTuple):
    """The buffer at this address, made if need be and locked for writing: the answer
    is its :class:`BufferState`. ``known_id`` is the row id a handle remembers (a
    hint: a backend checks it)."""

    scope: str
    scope_id: str
    key: str
    known_id: int | None


Step = One | All | Run | Write | Many | OpenBuffer
Plan = Generator[Step, Any, Any]


class BufferState(NamedTuple):
    """What an append needs to know of a buffer before it starts (the answer to
    :class:`OpenBuffer`)."""

    id: int
    message_count: int  # the tally of the last message (0 when empty)
    tail: str | None  # the last position, None when empty
    may_hold_unanswered: bool  # may hold an unanswered call
    updated: int  # buffers.updated_at, in seconds since the epoch
    # The store's clock when read (its newest buffer stamp, seconds): an append
    # compares with the later of it and the wall clock, so a wall clock set back
    # still stamps the buffer when offline sync needs it (sync.scan's marks).
    clock: int


class Transaction(Protocol):
    """What a backend's open transaction offers the driver: one method per step type."""

    def one(self, statement: str, params: Any = ()) -> Any: ...
    def all(self, statement: str, params: Any = ()) -> list[Any]: ...
    def run(self, statement: str, params: Any = ()) -> int: ...
    def write(self, statement: str, params: Any = ()) -> None: ...
    def many(self, statement: str, rows: Any) -> None: ...
    def open_buffer(
        self, scope: str, scope_id: str, key: str, known_id: int | None
    ) -> BufferState: ...


class AsyncTransaction(Protocol):
    """:class:`Transaction`, awaited: what an async backend's open transaction offers."""

    async def one(self, statement: str, params: Any = ()) -> Any: ...
    async def all(self, statement: str, params: Any = ()) -> list[Any]: ...
    async def run(self, statement: str, params: Any = ()) -> int: ...
    async def write(self, statement: str, params: Any = ()) -> None: ...
    async def many(self, statement: str, rows: Any) -> None: ...
    async def open_buffer(
        self, scope: str, scope_id: str, key: str, known_id: int | None
    ) -> BufferState: ...


# Which method of a transaction answers each type of step (its fields are the
# method's arguments, in order).
ANSWERED_BY: Final[dict[type, str]] = {
    One: "one",
    All: "all",
    Run: "run",
    Write: "write",
    Many: "many",
    OpenBuffer: "open_buffer",
}


def run_plan(plan: Plan, tx: Transaction) -> Any:
    """Run a plan on a blocking transaction; return what the plan returns."""
    answer: Any = None
    send = plan.send
    answered_by = ANSWERED_BY
    try:
        while True:
            step = send(answer)
            answer = getattr(tx, answered_by[type(step)])(*step)
    except StopIteration as done:
        return done.value


async def run_plan_async(plan: Plan, tx: AsyncTransaction) -> Any:
    """Run a plan on an async transaction: the same steps as :func:`run_plan`."""
    answer: Any = None
    send = plan.send
    answered_by = ANSWERED_BY
    try:
        while True:
            step = send(answer)
            answer = await getattr(tx, answered_by[type(step)])(*step)
    except StopIteration as done:
        return done.value

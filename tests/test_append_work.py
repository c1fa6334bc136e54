"""No operation on a buffer does work in proportion to the buffer's length.

Measured, not timed: each kind of operation in ``tests/_workload.py`` runs on a
buffer of 1,000 messages and on one of 20,000 of the same shape, and the work the
database did must not grow with it. On SQLite the work is the virtual machine's
instruction count (a progress handler called every instruction batch), which
counts every row a statement, a trigger or a foreign-key action visits; on
PostgreSQL it is the rows each statement's scans of ``messages`` and
``tool_calls`` examined (``EXPLAIN ANALYZE``: rows returned plus rows filtered
out, times loops), for every statement the operation ran.

Issue 19 was the reason: ``pairing_state`` walked the primary key's ``buffer_id``
prefix, so every declaring turn and tool result cost 20 times more work at 20,000
messages than at 1,000 (45 ms at 100,000), while the plan tests, looking for
``SCAN``, passed.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import Store
from flowdrop_local.backends import postgresql_dialect as pg_dialect
from flowdrop_local.backends import postgresql_io as pg

from ._workload import ADDRESS, KINDS, fill

SMALL, LARGE = 1_000, 20_000
# Work at LARGE may exceed work at SMALL by this factor plus this constant (B-tree
# depth grows by a level, a longer key or two): a walk of the buffer is 20x.
FACTOR, SLACK = 1.3, 200
REPEAT = 3


def _within(small: float, large: float) -> bool:
    return large <= small * FACTOR + SLACK


# ------------------------------------------------------------------------ SQLite


def _vm_work(store: Store, operation: Any) -> int:
    conn = store.backend.connection()
    calls = [0]

    def tick() -> int:
        calls[0] += 1
        return 0

    conn.set_progress_handler(tick, 1)
    try:
        operation()
    finally:
        conn.set_progress_handler(None, 1)
    return calls[0]


@pytest.fixture(scope="module", params=["no statistics", "analyzed", "search index"])
def sqlite_stores(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, Store]]:
    """A real file per size: without statistics and with ``ANALYZE`` (the planner's
    two worlds), and with the optional search index (its triggers run on each write)."""
    folder = tmp_path_factory.mktemp("work")
    stores = {}
    for size in (SMALL, LARGE):
        store = Store(folder / f"{size}.db")
        fill(store, size)
        if request.param == "search index":
            store.enable_search()
        if request.param == "analyzed":
            with store.backend.write() as tx:
                tx.script("ANALYZE")
        stores[size] = store
    yield stores
    for store in stores.values():
        store.close()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_sqlite_work_does_not_grow_with_the_buffer(
    sqlite_stores: dict[int, Store], kind: str
) -> None:
    work = {}
    for size, store in sqlite_stores.items():
        # The median of a few: FTS5 merges its segments now and then, a cost of how
        # much the index has taken in so far, not of this buffer (and bounded).
        work[size] = statistics.median(
            _vm_work(store, KINDS[kind](store, store.buffer(*ADDRESS))) for _ in range(REPEAT)
        )
    assert work[SMALL] > 0
    assert _within(work[SMALL], work[LARGE]), (
        f"{kind}: {work[SMALL]:,} VM instructions at {SMALL:,} messages, "
        f"{work[LARGE]:,} at {LARGE:,}"
    )


def test_the_measure_sees_a_walk_of_the_buffer(sqlite_stores: dict[int, Store]) -> None:
    """The oracle itself: the plan issue 19 found (the primary key's buffer_id prefix,
    filtered on tool_call_id; the unary + keeps the index out) costs 20x."""
    old = (
        "SELECT 1, tool_call_id, id_text(id), healed FROM messages "
        "WHERE buffer_id = ?1 AND +tool_call_id IN (SELECT value FROM json_each(?2))"
    )
    work: dict[int, float] = {}
    for size, store in sqlite_stores.items():
        buffer_id = (
            store.backend.connection()
            .execute("SELECT id FROM buffers WHERE key = 'agent'")
            .fetchone()[0]
        )
        conn = store.backend.connection()
        work[size] = _vm_work(
            store, lambda c=conn, b=buffer_id: c.execute(old, (b, '["h1"]')).fetchall()
        )
    assert not _within(work[SMALL], work[LARGE]), work


# -------------------------------------------------------------------- PostgreSQL


def _scans_ours(node: dict[str, Any]) -> bool:
    """A scan node (not the ModifyTable of a write) of messages or tool_calls."""
    return str(node.get("Node Type", "")).endswith("Scan") and node.get("Relation Name") in (
        "messages",
        "tool_calls",
    )


def _rows_examined(plan: Any) -> int:
    """Rows the scans of messages and tool_calls visited, over every loop."""
    total = 0
    if isinstance(plan, dict):
        if _scans_ours(plan) and "Actual Loops" in plan:
            visited = (
                plan.get("Actual Rows", 0)
                + plan.get("Rows Removed by Filter", 0)
                + plan.get("Rows Removed by Index Recheck", 0)
            )
            total += int(visited * plan["Actual Loops"])
        for value in plan.values():
            total += _rows_examined(value)
    elif isinstance(plan, list):
        for item in plan:
            total += _rows_examined(item)
    return total


def _index_keyed(plan: Any) -> bool:
    """Without ANALYZE (an INSERT that would collide): every scan is an index scan
    whose condition names the buffer and something more, or a single row by id."""
    if isinstance(plan, dict):
        if _scans_ours(plan):
            if "Index" not in str(plan.get("Node Type")):
                return False
            cond = str(plan.get("Index Cond", ""))
            if cond.count("=") + cond.count(">") + cond.count("<") < 2 and "(id =" not in cond:
                return False
        return all(_index_keyed(value) for value in plan.values())
    if isinstance(plan, list):
        return all(_index_keyed(item) for item in plan)
    return True


class _Recorder:
    """Records the named statements a store's transactions run, with their parameters."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.on = False
        for kind in ("one", "all", "run", "write", "many"):
            original = getattr(pg.PgTx, kind)

            def spy(tx: Any, statement: str, params: Any = (), _original: Any = original) -> Any:
                if self.on:
                    self.seen.append((statement, params))
                return _original(tx, statement, params)

            monkeypatch.setattr(pg.PgTx, kind, spy)


def _pg_work(url: str, recorder: _Recorder, operation: Any) -> dict[str, int]:
    """Run the operation, then each statement it ran under EXPLAIN ANALYZE (rolled back)."""
    import psycopg

    recorder.seen.clear()
    recorder.on = True
    try:
        operation()
    finally:
        recorder.on = False
    work: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        for name, params in recorder.seen:
            if name not in pg_dialect.SQL:
                continue
            sql = pg_dialect.SQL[name]
            rows = params if isinstance(params, list) else [params]
            for row in rows[:3]:
                bound = pg_dialect.statement_params(name, row)
                try:
                    plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, bound).fetchone()
                    examined = _rows_examined(plan[0])  # type: ignore[index]
                except psycopg.errors.IntegrityError:  # an INSERT of rows now stored
                    conn.rollback()
                    if " SELECT " in sql:  # INSERT ... SELECT: what its SELECT reads
                        select = sql[sql.index(" SELECT ") :]
                        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON)" + select, bound)
                        examined = _rows_examined(plan.fetchone()[0])  # type: ignore[index]
                    else:  # INSERT ... VALUES: its look-ups are keyed
                        plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql, bound).fetchone()
                        assert _index_keyed(plan[0]), (name, plan)  # type: ignore[index]
                        examined = 0
                conn.rollback()
                work[name] = work.get(name, 0) + examined
    return work


@pytest.fixture(scope="module")
def pg_server(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("postgresql_server")
    return url


@pytest.fixture(scope="module", params=["no statistics", "analyzed"])
def pg_stores(request: pytest.FixtureRequest, pg_server: str) -> Iterator[dict[int, str]]:
    import psycopg

    urls = {}
    for size in (SMALL, LARGE):
        schema = f"work_{size}_{request.param.replace(' ', '_')}"
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f"CREATE SCHEMA {schema}")
        separator = "&" if "?" in pg_server else "?"
        url = f"{pg_server}{separator}options=-csearch_path%3D{schema}"
        with Store(url) as store:
            with psycopg.connect(url, autocommit=True) as conn:
                # Statistics only when this run says so: autovacuum would ANALYZE
                # the tables behind the test's back.
                for table in ("messages", "tool_calls", "buffers"):
                    conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            fill(store, size)
            with psycopg.connect(url, autocommit=True) as conn:
                if request.param == "analyzed":
                    conn.execute("ANALYZE")
        urls[size] = url
    yield urls
    with psycopg.connect(pg_server, autocommit=True) as conn:
        for url in urls.values():
            conn.execute(f"DROP SCHEMA {url.rsplit('%3D', 1)[1]} CASCADE")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_postgresql_work_does_not_grow_with_the_buffer(
    pg_stores: dict[int, str], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _Recorder(monkeypatch)
    work: dict[int, dict[str, int]] = {}
    for size, url in pg_stores.items():
        with Store(url) as store:
            operation = KINDS[kind](store, store.buffer("global", "", "agent"))
            work[size] = _pg_work(url, recorder, operation)
    assert work[SMALL], f"{kind} ran no statement"
    grown = {
        name: (work[SMALL].get(name, 0), rows)
        for name, rows in work[LARGE].items()
        if not _within(work[SMALL].get(name, 0), rows)
    }
    assert not grown, f"{kind}: rows examined at {SMALL:,} and {LARGE:,} messages: {grown}"


def test_postgresql_measure_sees_a_walk_of_the_buffer(pg_stores: dict[int, str]) -> None:
    """The oracle itself: a look-up by tool_call_id that cannot use its index walks."""
    import psycopg

    examined = {}
    for size, url in pg_stores.items():
        with psycopg.connect(url) as conn:
            plan = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT id FROM messages "
                "WHERE buffer_id = (SELECT id FROM buffers WHERE key = 'agent') "
                "AND metadata LIKE '%h1\"%'"
            ).fetchone()
            examined[size] = _rows_examined(plan[0])  # type: ignore[index]
    assert not _within(examined[SMALL], examined[LARGE]), examined


# Statements of the path no kind reaches, and why that is fine.
_NOT_REACHED = {
    "touch_buffer": "at most once a minute per buffer: an UPDATE of the buffer's row by id",
    "read_all_at": "read() with no limit: the whole buffer, as asked",
    "clear_messages": "clear(): deletes every message of the buffer, as asked",
    "clear_ledger": "clear(): deletes the buffer's ledger with its messages",
    "delete_buffer": "delete(): clear(), then the buffer's row by id, as asked",
}


def test_the_workload_reaches_every_path_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every statement the engine and the buffer handle ask for runs in some kind, so
    the two tests above measure the whole path, not a part of it."""
    import re

    from flowdrop_local.backends import sqlite

    root = Path(__file__).resolve().parent.parent
    asked = re.compile(r'\b(?:One|All|Run|Write|Many)\(\s*"(\w+)"')  # the steps (plans.py)
    names = {
        match.group(1)
        for file in ("flowdrop_local/engine.py", "flowdrop_local/buffer.py")
        for match in asked.finditer((root / file).read_text())
    }
    seen: set[str] = set()
    for kind in ("one", "all", "run", "write", "many"):
        original = getattr(sqlite._SqliteTx, kind)

        def spy(tx: Any, statement: str, params: Any = (), _original: Any = original) -> Any:
            seen.add(statement)
            return _original(tx, statement, params)

        monkeypatch.setattr(sqlite._SqliteTx, kind, spy)
    with Store(tmp_path / "cover.db") as store:
        from flowdrop_local.syncing import enable

        enable(store)  # edits then also forget sync's summary of the buffer
        buffer = fill(store, 200)
        for make in KINDS.values():
            make(store, buffer)()
    assert len(names) > 30, names
    missing = names - seen - set(_NOT_REACHED)
    assert not missing, f"no kind runs {sorted(missing)}"

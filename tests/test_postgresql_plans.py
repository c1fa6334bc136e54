"""Every statement on PostgreSQL's append and read paths is keyed by one buffer.

So a deployment sharded by buffer (Citus, distributing ``messages`` and
``tool_calls`` by ``buffer_id``) keeps each append and each read on one shard. The
statements are recorded while a real workload runs (appends, healing, MEM-1/2/10,
a window, pop, reads, paging), then each is EXPLAINed with the parameters it ran
with: every scan of ``messages`` or ``tool_calls`` must name ``buffer_id`` in its
index condition or filter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import Store
from flowdrop_local.backends import postgresql_dialect as pg_dialect
from flowdrop_local.backends import postgresql_io as pg
from flowdrop_local.engine import new_message_id
from flowdrop_local.plans import run_plan
from flowdrop_local.rules.pairing import placeholder_message

ROOT = Path(__file__).resolve().parent.parent
# The statements the engine and the buffer handle ask for, read from their source.
_ASKED = re.compile(
    r'\b(?:One|All|Run|Write|Many)\(\s*"(\w+)"|tx\.(?:one|all|run|write|many)\(\s*"(\w+)"'
)
PATH_STATEMENTS = sorted(
    {
        name
        for file in ("flowdrop_local/engine.py", "flowdrop_local/buffer.py")
        for match in _ASKED.finditer((ROOT / file).read_text())
        for name in match.groups()
        if name
    }
    - {"message_for_removal"}  # the admin's look-up of a message by its id alone (docs/identity.md)
)


@pytest.fixture
def recorded(
    postgresql_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []
    for kind in ("one", "all", "run", "write", "many"):
        original = getattr(pg.PgTx, kind)

        def spy(self: Any, statement: str, params: Any = (), _original: Any = original) -> Any:
            seen.append((statement, params))
            return _original(self, statement, params)

        monkeypatch.setattr(pg.PgTx, kind, spy)
    with Store(postgresql_url) as store:
        from flowdrop_local.syncing import enable

        enable(store)  # a store that syncs: edits also forget sync's summary of a buffer
        buf = store.buffer("s", "", "k", window=12)
        buf.append({"role": "user", "content": "q"})
        buf.append({"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]})
        buf.append({"role": "tool", "tool_call_id": "c2", "content": "r2"})
        buf.append({"role": "user", "content": "heals c1"})
        buf.append({"role": "tool", "tool_call_id": "c1", "content": "late"})  # MEM-10
        buf.append({"role": "tool", "tool_call_id": "c1", "content": "again"})  # MEM-1
        buf.append({"role": "assistant", "tool_calls": [{"id": "c1"}]})  # MEM-2
        buf.append({"role": "assistant", "tool_calls": [{"id": "h"}]})
        buf.append(placeholder_message("h"))  # an imported placeholder, placed
        buf.append({"role": "assistant", "tool_calls": [{"id": "h2"}]})
        buf.append({"role": "assistant", "content": "meanwhile"})
        buf.append(placeholder_message("h2"))  # placed after its turn, before "meanwhile"
        buf.append([{"role": "user", "content": str(i)} for i in range(12)])  # evicts
        buf.append({"role": "user", "content": "a caller's id", "id": new_message_id()})
        buf.read(limit=5)
        buf.read(limit=5, before=buf.messages()[-1].id)
        buf.messages(limit=3)
        buf.messages(limit=3, before=buf.messages()[-1].id)  # the viewer's paging
        len(buf)
        buf.pop()
        buf.read()
        buf.to_openai_chat(limit=1)  # reads the head of the buffer for its system prompt
        turn = store.buffer("s", "", "k").append({"role": "assistant", "tool_calls": [{"id": "p"}]})
        with store.backend.write() as tx:
            from flowdrop_local import engine

            run_plan(engine.remove_message(turn.message_ids[0]), tx)
        other = store.buffer("s", "", "k2")
        result = other.append(
            [
                {"role": "assistant", "tool_calls": [{"id": "z"}]},
                {"role": "tool", "tool_call_id": "z", "content": "r"},
                {"role": "user", "content": "after"},
            ]
        )
        with store.backend.write() as tx:  # un-answers z before a user turn: healed at once
            run_plan(engine.remove_message(result.message_ids[1]), tx)
        # Conversations (issue 13): a fork (ledger copied), title, metadata, info, delete.
        forked = other.fork(at=result.message_ids[0], to=("s", "", "k3"))
        forked.set_title("t")
        forked.update_metadata({"a": 1})
        forked.info()
        forked.delete()
        store.buffer("s", "", "k").clear()
    monkeypatch.undo()
    yield seen


def _scans(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        scan = str(plan.get("Node Type", "")).endswith("Scan")  # not the ModifyTable of a write
        if scan and plan.get("Relation Name") in ("messages", "tool_calls"):
            yield plan
        for value in plan.values():
            yield from _scans(value)
    elif isinstance(plan, list):
        for item in plan:
            yield from _scans(item)


def test_append_and_read_statements_filter_on_the_buffer(
    recorded: list[tuple[str, Any]], postgresql_url: str
) -> None:
    import psycopg

    names = {name for name, _ in recorded}
    # touch_buffer runs at most once a minute per buffer; it updates the buffer's row by id.
    assert set(PATH_STATEMENTS) - {"delete_placeholder", "touch_buffer"} <= names, (
        "the workload should reach every statement of the path"
    )
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        statements = [
            (
                pg_dialect.SQL[name],
                pg_dialect.statement_params(name, p[0] if isinstance(p, list) else p),
            )
            for name, p in recorded
            if name in PATH_STATEMENTS
        ]
        statements += [
            (pg_dialect.LOCK_AT, ("s", "", "k")),
            (pg_dialect._STATE_AT, ("s", "", "k")),
            (pg_dialect._LOCK_ID, (1,)),
            (pg_dialect.SQL["buffer_state"], (1,)),
        ]
        for sql, params in statements:
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()[0]  # type: ignore[index]
            for scan in _scans(plan):
                conditions = " ".join(
                    str(scan.get(key, "")) for key in ("Index Cond", "Filter", "Recheck Cond")
                )
                if sql == pg_dialect.SQL["used_ids"]:  # caller-supplied ids: by primary key
                    assert "(id = ANY" in conditions, (sql, scan)
                    continue
                assert "buffer_id" in conditions, (sql, scan)


@pytest.mark.parametrize("name", ["read_last_at", "messages_last_at"])
def test_reading_the_last_n_does_not_sort_the_buffer(postgresql_url: str, name: str) -> None:
    """The last N of a 5,000-message buffer come from a backward index walk of
    (buffer_id, position), not a sort of every message (a join did that: 34 ms at
    100,000 messages against raw's 0.1 ms)."""
    import psycopg

    with Store(postgresql_url) as store:
        store.buffer("s", "", "big").append(
            [{"role": "user", "content": str(i)} for i in range(5000)]
        )
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + pg_dialect.SQL[name], ("s", "", "big", 50)
        ).fetchone()[0]  # type: ignore[index]
    nodes = list(_all_nodes(plan))
    assert not any(node["Node Type"] == "Sort" for node in nodes), nodes
    scans = [n for n in nodes if n.get("Relation Name") == "messages"]
    assert scans and all(n["Actual Rows"] <= 50 for n in scans), scans


def _all_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from _all_nodes(value)
    elif isinstance(plan, list):
        for item in plan:
            yield from _all_nodes(item)


# --------------------------------------------- the index each hot statement uses
# On a buffer of 20,000 messages of an agent's history, with and without
# statistics (autovacuum off, so only the test decides): each statement of the
# append, heal and read paths, with realistic parameters, names its index. A
# condition on buffer_id alone would read the whole buffer (issue 19).


def _pg_expected(bid: int, pos: str, mid: str) -> dict[str, tuple[Any, tuple[str, ...]]]:
    """name -> (parameters, the indexes its plan must scan)."""
    return {
        "pairing_state": ((bid, ["h1"], ["h1"]), ("messages_tool_result", "tool_calls_pkey")),
        "declare_call": ((bid, "h1", mid, 0), ("messages_tool_result",)),
        "mark_answered": ((mid, bid, "h1"), ("tool_calls_pkey",)),
        "unanswered_calls": ((bid,), ("tool_calls_unanswered",)),
        "declaring_turn": ((bid, "h1"), ("tool_calls_pkey",)),
        "declaring_message": ((bid, "h1"), ("tool_calls_pkey",)),
        "delete_placeholder": ((bid, "h1"), ("messages_tool_result",)),
        "non_tool_after": ((bid, pos), ("messages_buffer_id_position_key",)),
        "successor": ((bid, pos), ("messages_buffer_id_position_key",)),
        "last_user_after": ((bid, pos), ("messages_buffer_id_position_key",)),
        "set_tally": ((1, bid, pos), ("messages_buffer_id_position_key",)),
        "read_before": ((bid, pos, 20), ("messages_buffer_id_position_key",)),
        "messages_before": ((bid, pos, 20), ("messages_buffer_id_position_key",)),
        "read_last_at": (("global", "", "agent", 50), ("messages_buffer_id_position_key",)),
        "tail": ((bid,), ("messages_buffer_id_position_key",)),
        "replace_placeholder": (("c", 0, "{}", bid, mid), ("messages_id",)),
        "delete_message": ((bid, mid), ("messages_id",)),
        "fork_ledger": ((999, bid, pos), ("tool_calls_declared_by",)),
    }


# A walk of the buffer's (buffer_id, position) index that stops at its first row or
# its LIMIT (backwards for the last ones): the cost of the rows it returns.
_STOPS_EARLY = {"tail", "read_last_at"}


def _index_names(plan: Any) -> set[str]:
    return {n["Index Name"] for n in _all_nodes(plan) if "Index Name" in n}


def _buffer_only(plan: Any) -> list[dict[str, Any]]:
    """Scans of messages or tool_calls whose index condition is the buffer alone."""
    return [
        n
        for n in _scans(plan)
        if n.get("Index Name") != "tool_calls_unanswered"
        and re.fullmatch(r"\(buffer_id = [^()]+\)", str(n.get("Index Cond", "")).strip())
    ]


@pytest.mark.parametrize("statistics", ["no statistics", "analyzed"])
def test_each_hot_statement_names_its_index(postgresql_url: str, statistics: str) -> None:
    import psycopg

    from ._workload import fill

    with Store(postgresql_url) as store:
        with psycopg.connect(postgresql_url, autocommit=True) as conn:
            for table in ("messages", "tool_calls", "buffers"):
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        fill(store, 20_000)
    with psycopg.connect(postgresql_url) as conn:
        if statistics == "analyzed":
            conn.execute("ANALYZE")
        bid, pos, mid = conn.execute(
            "SELECT buffer_id, position, id FROM messages WHERE buffer_id = "
            "(SELECT id FROM buffers WHERE key = 'agent') ORDER BY position OFFSET 10000 LIMIT 1"
        ).fetchone()  # type: ignore[misc]
        for name, (params, indexes) in _pg_expected(bid, pos, mid).items():
            plan = conn.execute(
                "EXPLAIN (FORMAT JSON) " + pg_dialect.SQL[name],
                pg_dialect.statement_params(name, params),
            ).fetchone()[0]  # type: ignore[index]
            conn.rollback()
            used = _index_names(plan)
            assert set(indexes) <= used, (name, statistics, used)
            if name not in _STOPS_EARLY:
                assert _buffer_only(plan) == [], (name, statistics, plan)

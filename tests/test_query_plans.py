"""Every statement on the append, heal and read paths is an index search, never a scan.

This is what keeps an append's cost independent of the buffer's length (and it
failed once: without statistics the planner walked the ledger's primary key for
unanswered calls, so appends grew 38x from 100 to 100,000 messages). SQLite's own
EXPLAIN QUERY PLAN is the oracle; no timing is involved.
"""

from __future__ import annotations

import re

import pytest

from flowdrop_local import Store
from flowdrop_local.backends.sqlite import SQL

# Statements that read everything on purpose (listing, export, the admin's list,
# and the count enable_search shows progress against).
WHOLE_TABLE = {"list_buffers", "export_all", "session_list_all", "search_count_messages"}
# Offline sync's statements are not on the append path (its scan reads every message
# on purpose) and name its own tables, made at a store's first sync.
HOT_PATH = sorted(name for name in SQL if name not in WHOLE_TABLE and not name.startswith("sync_"))


def _plan(sql: str) -> list[str]:
    with Store(":memory:") as store:
        conn = store.backend.connection()
        # Some rows, so the planner sees real tables rather than empty ones.
        store.buffer("s", "", "k").append(
            [
                {"role": "assistant", "tool_calls": [{"id": "c1"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
                {"role": "user", "content": "u"},
            ]
        )
        if "message_search" in sql:  # the optional search index's statements
            store.enable_search()
        numbered = [int(n) for n in re.findall(r"\?(\d+)", sql)]
        params = ["x"] * (max(numbered) if numbered else sql.count("?"))
        return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


@pytest.mark.parametrize("name", HOT_PATH)
def test_hot_statements_search_indexes(name: str) -> None:
    """No full scan of messages, tool_calls or buffers (json_each's own scan is the input)."""
    plan = _plan(SQL[name])
    scans = [step for step in plan if re.match(r"SCAN (messages|tool_calls|buffers)\b", step)]
    assert scans == [], plan


@pytest.mark.parametrize("name", ["buffer_state", "unanswered_calls"])
def test_unanswered_calls_come_from_the_partial_index(name: str) -> None:
    """Unanswered calls are read from tool_calls_unanswered, not the ledger's primary key."""
    plan = _plan(SQL[name])
    assert any("tool_calls_unanswered" in step for step in plan), plan


def test_the_backstop_trigger_reads_the_partial_index() -> None:
    """The MEM-3 trigger runs on every user insert: it must not walk every declared call."""
    with Store(":memory:") as store:
        sql = (
            store.backend.connection()
            .execute(
                "SELECT sql FROM sqlite_master WHERE name = 'messages_user_needs_answered_calls'"
            )
            .fetchone()[0]
        )
    assert "INDEXED BY tool_calls_unanswered" in sql

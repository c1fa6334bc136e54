"""Every statement a user's call runs uses the index it is meant to use.

SQLite's own ``EXPLAIN QUERY PLAN`` is the oracle, on a store filled like a real
one (20,000 messages of an agent's history in one buffer, a few other buffers,
the search index, sync's tables), with and without ``ANALYZE``: the planner
chooses differently in the two worlds, and a plan that is right in one can walk
the buffer in the other. No timing is involved.

Two rules, and a table:

* no full scan of ``messages``, ``tool_calls`` or ``buffers`` (outside the
  statements that read everything on purpose);
* no search of ``messages`` or ``tool_calls`` constrained by ``buffer_id`` alone:
  that reads the whole buffer just the same as a scan (issue 19: ``pairing_state``
  did, 45 ms per tool call at 100,000 messages, while a test looking for ``SCAN``
  passed), unless the statement stops after a row or N rows in key order
  (:data:`STOPS_EARLY`) or reads the buffer whole on purpose (:data:`WHOLE_BUFFER`);
* :data:`EXPECTED` names, for each statement of the append, heal and read paths,
  the index (and the columns it is searched by) of each step.

``tests/test_append_work.py`` measures what the plans promise: the work each kind
of operation does, at 1,000 and at 20,000 messages, on both backends.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowdrop_local import Store
from flowdrop_local.backends.sqlite import SQL
from flowdrop_local.syncing import enable

from ._workload import fill

# Statements that read a whole table on purpose (listing, export, the admin's list,
# the count enable_search shows progress against, the search index's build).
WHOLE_TABLE = {
    "list_buffers",
    "export_all",
    "export_memory",
    "export_session",
    "export_viewer",
    "session_list_all",
    "search_count_messages",
    "search_enabled",
    "export_conversation",
}
# Statements that read or delete one buffer whole, because that is what was asked.
WHOLE_BUFFER = {
    "read_all_at": "read() with no limit",
    "messages_all_at": "messages() with no limit",
    "export_one": "export of one conversation",
    "clear_messages": "clear()",
    "clear_ledger": "clear(): the buffer's ledger",
    "delete_buffer": "Buffer.delete(): the cascade deletes its rows",
}
# A buffer_id-prefix search that stops after its first row or its LIMIT, walking the
# primary key in position order (no sort): the cost of the rows returned.
STOPS_EARLY = {
    "count": "the tally of the last row",
    "count_at": "the tally of the last row",
    "tail": "max(position): the last row",
    "first_message": "LIMIT 1 in position order",
    "last_message": "LIMIT 1, backwards",
    "buffer_state": "the last row (LIMIT 1, backwards)",
    "read_first_at": "LIMIT n in position order",
    "read_last_at": "LIMIT n, backwards",
    "messages_last_at": "LIMIT n, backwards",
    "evict_oldest": "LIMIT n in position order: the rows it deletes",
    "buffer_info": "the tally of the last row",
    "conversations_recent": "each listed buffer's tally: its last row",
    "conversations_of": "each listed buffer's tally: its last row",
    "sync_candidates": "each candidate's last row (max(position))",
    "sync_summary_one": "the buffer's last row (max(position))",
}

# Plan steps SQLite lists but never runs: on a store that syncs (a delete trigger on
# buffers), an INSERT OR IGNORE of a buffer's row lists the cascade's look-ups of a
# row it would delete; it never deletes one (test_append_work measures its work
# flat at 1,000 and 20,000 messages).
PLANNED_NOT_RUN = {"create_buffer": "the ON DELETE cascade of a row INSERT OR IGNORE never deletes"}

# The store's clock (sync/schema.py: SQLITE_STORE_CLOCK), in every buffer stamp and in
# the append's state: the newest stamp, one seek to the end of buffers_recent.
_CLOCK = "buffers USING COVERING INDEX buffers_recent (updated_at<?)"

# The append, heal and read paths: each statement's steps that must be in its plan.
EXPECTED: dict[str, tuple[str, ...]] = {
    "find_buffer": ("buffers USING COVERING INDEX sqlite_autoindex_buffers_1 (scope=? AND",),
    "create_buffer": (_CLOCK,),
    "buffer_state": ("tool_calls USING INDEX tool_calls_unanswered (buffer_id=?)", _CLOCK),
    "pairing_state": (
        "messages USING INDEX messages_tool_result (buffer_id=? AND tool_call_id=?)",
        "tool_calls USING PRIMARY KEY (buffer_id=? AND call_id=?)",
    ),
    "declare_call": ("messages USING INDEX messages_tool_result (buffer_id=? AND tool_call_id=?)",),
    "mark_answered": ("tool_calls USING PRIMARY KEY (buffer_id=? AND call_id=?)",),
    "unanswered_calls": (
        "t USING INDEX tool_calls_unanswered (buffer_id=?)",
        "m USING INDEX sqlite_autoindex_messages_1 (id=?)",
        "n USING PRIMARY KEY (buffer_id=? AND position>?)",
    ),
    "declaring_turn": (
        "t USING PRIMARY KEY (buffer_id=? AND call_id=?)",
        "m USING INDEX sqlite_autoindex_messages_1 (id=?)",
    ),
    "declaring_message": (
        "t USING PRIMARY KEY (buffer_id=? AND call_id=?)",
        "m USING INDEX sqlite_autoindex_messages_1 (id=?)",
    ),
    "non_tool_after": ("messages USING PRIMARY KEY (buffer_id=? AND position>?)",),
    "successor": ("messages USING PRIMARY KEY (buffer_id=? AND position>?)",),
    "last_user_after": ("messages USING PRIMARY KEY (buffer_id=? AND position>?)",),
    "set_tally": ("messages USING PRIMARY KEY (buffer_id=? AND position=?)",),
    "replace_placeholder": ("messages USING INDEX sqlite_autoindex_messages_1 (id=?)",),
    "delete_placeholder": (
        "messages USING INDEX messages_tool_result (buffer_id=? AND tool_call_id=?)",
    ),
    "delete_message": (
        "messages USING INDEX sqlite_autoindex_messages_1 (id=?)",
        "tool_calls USING COVERING INDEX tool_calls_answered_by (answered_by=?)",
        "tool_calls USING COVERING INDEX tool_calls_declared_by (declared_by=?)",
    ),
    "message_for_removal": ("messages USING INDEX sqlite_autoindex_messages_1 (id=?)",),
    "used_ids": ("m USING INDEX sqlite_autoindex_messages_1 (id=?)",),
    "position_of": ("messages USING INDEX sqlite_autoindex_messages_1 (id=?)",),
    "read_before": ("messages USING PRIMARY KEY (buffer_id=? AND position<?)",),
    "messages_before": ("messages USING PRIMARY KEY (buffer_id=? AND position<?)",),
    "fork_messages": ("messages USING PRIMARY KEY (buffer_id=? AND position>? AND position<?)",),
    "fork_ledger": (
        "od USING PRIMARY KEY (buffer_id=? AND position",
        "t USING INDEX tool_calls_declared_by (declared_by=?)",
    ),
    "count_through": ("messages USING PRIMARY KEY (buffer_id=? AND position<?)",),
    "touch_buffer": ("buffers USING INTEGER PRIMARY KEY (rowid=?)", _CLOCK),
    "touch_edited": ("buffers USING INTEGER PRIMARY KEY (rowid=?)", _CLOCK),
    "lock_buffer": ("buffers USING INTEGER PRIMARY KEY (rowid=?)",),
    "sync_forget_summary": (
        "flowdrop_sync_state USING INDEX sqlite_autoindex_flowdrop_sync_state_1 "
        "(scope=? AND scope_id=? AND key=?)",
    ),
    "sync_drop_unanswered": ("tool_calls USING INDEX tool_calls_unanswered (buffer_id=?)",),
    # A merge's links (sync.order): by id, and a parent's children's highest rank.
    "sync_links_of": ("flowdrop_sync_links USING PRIMARY KEY (id=?)",),
    "sync_link_ranks": (
        "flowdrop_sync_links USING COVERING INDEX flowdrop_sync_links_parent (parent=?)",
    ),
    "sync_answered_refresh": (
        "tool_calls USING INDEX tool_calls_unanswered (buffer_id=?)",
        "m USING INDEX messages_tool_result (buffer_id=? AND tool_call_id=?)",
    ),
    "conversations_of": ("b USING INDEX sqlite_autoindex_buffers_1 (scope=? AND scope_id=?)",),
    "conversations_recent": ("b USING INDEX buffers_recent (updated_at<?)",),
    "message_home": ("m USING INDEX sqlite_autoindex_messages_1 (id=?)",),
    "message_by_id": ("messages USING INDEX sqlite_autoindex_messages_1 (id=?)",),
    "session_load": ("sessions USING INDEX sqlite_autoindex_sessions_1 (id=?)",),
    "session_list_for": (
        "sessions USING INDEX sessions_owner (owner_id=?)",
        "session_viewers USING COVERING INDEX session_viewers_user (user_id=?)",
    ),
}

# Offline sync's statements, other than those on an edit's path (EXPECTED names
# them), read what a sync compares, often a whole buffer or table on purpose.
_EDIT_PATH_SYNC = {name for name in EXPECTED if name.startswith("sync_")}
CHECKED = sorted(
    name
    for name in SQL
    if name not in WHOLE_TABLE
    and not name.startswith("sync_create_")
    and (not name.startswith("sync_") or name in _EDIT_PATH_SYNC)
)

_WHOLE_SCAN = re.compile(r"SCAN (messages|tool_calls|buffers|m|t|b|n|od|nd|oa|na)\b(?! VIRTUAL)")
# A search keyed by the buffer alone: the primary key's (or an index's) buffer_id
# prefix, nothing after it. tool_calls_unanswered holds only unanswered calls.
_BUFFER_ONLY = re.compile(
    r"SEARCH \w+ USING (?:COVERING )?(?:INDEX (\w+)|PRIMARY KEY) \(buffer_id=\?\)"
)


@pytest.fixture(scope="module", params=["no statistics", "analyzed"])
def conn(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[sqlite3.Connection]:
    path: Path = tmp_path_factory.mktemp("plans") / "real.db"
    store = Store(path)
    fill(store, 20_000)
    store.enable_search()
    enable(store)
    if request.param == "analyzed":
        with store.backend.write() as tx:
            tx.script("ANALYZE")
    yield store.backend.connection()
    store.close()


def _plan(conn: sqlite3.Connection, name: str) -> list[str]:
    sql = SQL[name]
    numbered = [int(n) for n in re.findall(r"\?(\d+)", sql)]
    params = ["x"] * (max(numbered) if numbered else sql.count("?"))
    rows = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
    return [row[3] for row in rows]


@pytest.mark.parametrize("name", CHECKED)
def test_no_statement_scans_a_table(conn: sqlite3.Connection, name: str) -> None:
    """No full scan of messages, tool_calls or buffers (json_each's own scan is the input)."""
    plan = _plan(conn, name)
    assert [step for step in plan if _WHOLE_SCAN.match(step)] == [], plan


@pytest.mark.parametrize("name", CHECKED)
def test_no_statement_walks_a_buffer(conn: sqlite3.Connection, name: str) -> None:
    """A search by buffer_id alone reads every row of the buffer: only a statement
    that stops after its first rows, or reads the buffer whole on purpose, may."""
    plan = _plan(conn, name)
    walks = [
        step
        for step in plan
        if (match := _BUFFER_ONLY.match(step)) and match.group(1) != "tool_calls_unanswered"
    ]
    if name in STOPS_EARLY or name in WHOLE_BUFFER or name in PLANNED_NOT_RUN:
        return
    assert walks == [], plan


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_hot_statement_uses_its_index(conn: sqlite3.Connection, name: str) -> None:
    plan = _plan(conn, name)
    for step in EXPECTED[name]:
        assert any(f"SEARCH {step}" in line or f"SEARCH main.{step}" in line for line in plan), (
            step,
            plan,
        )


def test_the_rules_catch_the_walk_issue_19_found(conn: sqlite3.Connection) -> None:
    """The old pairing_state (no INDEXED BY) walks the buffer without statistics;
    with them it is right: the rule must judge whichever plan the file gets."""
    old = SQL["pairing_state"].replace("INDEXED BY messages_tool_result ", "")
    params = [1, "[]", "[]"]
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + old, params)]
    analyzed = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'"
    ).fetchone()[0]
    walks = [step for step in plan if _BUFFER_ONLY.match(step)]
    if not analyzed:
        assert walks, plan
    expected = EXPECTED["pairing_state"][0]
    assert bool(walks) != any(f"SEARCH {expected}" in line for line in plan), plan


def test_every_exception_names_a_statement() -> None:
    """The lists above are of real statements (a rename would leave a stale pass)."""
    for name in (*WHOLE_TABLE, *WHOLE_BUFFER, *STOPS_EARLY, *PLANNED_NOT_RUN, *EXPECTED):
        assert name in SQL, name


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

"""The SQLite backend: one file, one connection, and the transactions around it.

Connection policy: a backend owns one connection, shared by all threads of the
process and serialised by a re-entrant lock. One connection is what makes
``":memory:"`` a single database for every thread, and SQLite takes one writer at
a time anyway; the lock costs a read only the wait for a write in progress in
this process. Other processes open their own and queue on SQLite's write lock
(WAL mode: readers never wait for writers). SQLite locks the whole file, so
appends to different buffers serialise too (PostgreSQL locks one buffer row).

Every write is :meth:`SqliteBackend.write`: ``BEGIN IMMEDIATE`` (the write lock is
taken before anything is read, so a read-then-write transaction can never fail
half way with "database is locked"), then one ``COMMIT``, or a ``ROLLBACK`` on
any exception, ``KeyboardInterrupt`` included.

The tail cache: what the append path knows of each buffer it wrote (its
:class:`~flowdrop_local.plans.BufferState`) is kept between appends, valid while
no other connection has committed (``PRAGMA data_version``, read after every
``BEGIN IMMEDIATE``) and this one wrote nothing else (``total_changes``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from .. import _files
from .._ids import id_blob, id_text
from .._schema import prepare
from ..check import Violation, check_database
from ..engine import new_message_id_bytes
from ..errors import (
    BackupTargetExists,
    CorruptRow,
    FlowdropError,
    InvalidArgument,
    LockTimeout,
    NotADatabase,
    ReadOnlyStore,
    StoreClosed,
    TooLarge,
    shown,
)
from ..plans import BufferState
from ..sync import statements as sync_statements
from ..sync.schema import (
    NEWEST_STAMP,
    SQLITE_STORE_CLOCK,
    adopt_copy,
    content_md5,
    sqlite_delete_triggers,
)
from .base import Backend, Durability, Tx

log = logging.getLogger("flowdrop_local")

_SYNCHRONOUS: dict[str, str] = {"normal": "NORMAL", "full": "FULL"}
_LIVE: weakref.WeakSet[SqliteBackend] = weakref.WeakSet()

_SESSION_COLUMNS = (
    "id, workflow_id, name, owner_id, status, conversation, metadata, created_at, updated_at, "
    "(SELECT json_group_array(user_id) FROM session_viewers WHERE session_id = sessions.id)"
)

# The messages of the buffer at an address (scope, scope_id, key), in one statement.
_AT = (
    "messages AS m WHERE m.buffer_id = "
    "(SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?)"
)
# A buffer's count: the tally of its last row (schema.sql), NULL when it is empty.
_TALLY = "SELECT tally FROM messages WHERE buffer_id = {} ORDER BY position DESC LIMIT 1"

# A conversation as Buffer.info / Store.conversations give it (model.BufferInfo),
# then the row id (the cursor's tie-break).
_INFO = (
    "b.scope, b.scope_id, b.key, b.title, b.metadata, b.created_at, b.updated_at, "
    f"coalesce(({_TALLY.format('b.id')}), 0), b.id"
)
# A message's searchable text (search.sql indexes the same): a string content, or
# the text of its text, input_text and output_text parts.
_TEXT = (
    "CASE WHEN content_parts = 0 THEN content ELSE coalesce((SELECT "
    "group_concat(json_extract(value, '$.text'), ' ') FROM json_each(content) "
    "WHERE json_type(value) = 'object' "
    "AND json_extract(value, '$.type') IN ('text', 'input_text', 'output_text') "
    "AND json_type(value, '$.text') = 'text'), '') END"
)

# The named statements of the engine and the handles, in SQLite's dialect
# (backends/postgresql.py defines the same names; a test holds them together).
# Ids are stored as 16 bytes and cross the boundary as text: id_blob(?) and
# id_text(id) are this connection's functions (_register_functions).
_DECODE_COLUMN = re.compile(r"column '([^']*)'")
STORE_CLOCK = SQLITE_STORE_CLOCK  # every buffer stamp (sync/schema.py says why)
_EDITED = (
    f"updated_at = max({STORE_CLOCK}, "
    # (coalesce: past 9999-12-31 strftime gives NULL, and max() of a NULL is NULL)
    "coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', updated_at, '+0.001 seconds'), updated_at))"
)

SQL: dict[str, str] = {
    # ----------------------------------------------------------- the append engine
    "find_buffer": "SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?",
    "create_buffer": (
        "INSERT OR IGNORE INTO buffers (scope, scope_id, key, updated_at) "
        f"VALUES (?, ?, ?, {STORE_CLOCK})"
    ),
    "buffer_state": (
        "SELECT last.tally, last.position, "
        "EXISTS (SELECT 1 FROM tool_calls INDEXED BY tool_calls_unanswered "
        "WHERE buffer_id = ?1 AND answered_by IS NULL), "
        # coalesce: a stamp that is not a time (a damaged file) reads as 0, so the
        # append stamps the row again (touch_buffer) instead of failing
        "coalesce(CAST(strftime('%s', b.updated_at) AS INTEGER), 0), "
        f"coalesce(CAST(strftime('%s', ({NEWEST_STAMP.format(t='buffers')})) AS INTEGER), 0) "
        "FROM buffers AS b LEFT JOIN (SELECT tally, position FROM messages "
        "WHERE buffer_id = ?1 ORDER BY position DESC LIMIT 1) AS last "
        "WHERE b.id = ?1"
    ),
    "insert_message": (
        "INSERT INTO messages "
        "(id, buffer_id, position, role, content, content_parts, metadata, created_at, tally) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, "  # the id as bytes: _SqliteTx converts it
        "coalesce(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), ?)"
    ),
    # The stored pairing state of a batch's call ids, in one statement: the result
    # standing for each (1, ...), and which are declared already (0, ...).
    # INDEXED BY: without statistics the planner walks the primary key's buffer_id
    # prefix (every message of the buffer) and filters on tool_call_id.
    "pairing_state": (
        "SELECT 1, tool_call_id, id_text(id), healed FROM messages "
        "INDEXED BY messages_tool_result "
        "WHERE buffer_id = ?1 AND tool_call_id IN (SELECT value FROM json_each(?2)) "
        "UNION ALL SELECT DISTINCT 0, call_id, NULL, NULL FROM tool_calls "
        "WHERE buffer_id = ?1 AND call_id IN (SELECT value FROM json_each(?3))"
    ),
    # One row per declaration (a turn naming an id twice keeps its first ordinal);
    # a result stored earlier already answers it.
    "declare_call": (
        "INSERT OR IGNORE INTO tool_calls (buffer_id, call_id, declared_by, ordinal, answered_by) "
        "VALUES (?1, ?2, id_blob(?3), ?4, "
        "(SELECT id FROM messages WHERE buffer_id = ?1 AND tool_call_id = ?2))"
    ),
    "mark_answered": (
        "UPDATE tool_calls SET answered_by = id_blob(?) WHERE buffer_id = ? AND call_id = ?"
    ),
    "replace_placeholder": (
        "UPDATE messages SET content = ?, content_parts = ?, metadata = ? "
        "WHERE buffer_id = ? AND id = id_blob(?)"
    ),
    "set_tally": "UPDATE messages SET tally = ? WHERE buffer_id = ? AND position = ?",
    "touch_buffer": f"UPDATE buffers SET updated_at = {STORE_CLOCK} WHERE id = ?",
    # After a delete or an in-place edit: a strictly later time (never equal, even
    # within one millisecond), so sync's per-buffer summary sees every change.
    "touch_edited": f"UPDATE buffers SET {_EDITED} WHERE id = ?",
    # INDEXED BY: the planner, without statistics, prefers the primary key, which
    # walks every declared call of the buffer instead of the unanswered ones.
    # With each call, its declaring turn's successor (where its placeholders go before).
    "unanswered_calls": (
        "SELECT m.position, t.call_id, (SELECT min(n.position) FROM messages AS n "
        "WHERE n.buffer_id = t.buffer_id AND n.position > m.position) "
        "FROM tool_calls AS t INDEXED BY tool_calls_unanswered "
        "JOIN messages AS m ON m.id = t.declared_by "
        "WHERE t.buffer_id = ? AND t.answered_by IS NULL ORDER BY m.position, t.ordinal"
    ),
    "declaring_turn": (  # the first declaration owns the pairing
        "SELECT m.position FROM tool_calls AS t JOIN messages AS m ON m.id = t.declared_by "
        "WHERE t.buffer_id = ? AND t.call_id = ? ORDER BY m.position LIMIT 1"
    ),
    "declaring_message": (
        "SELECT id_text(t.declared_by) FROM tool_calls AS t "
        "JOIN messages AS m ON m.id = t.declared_by "
        "WHERE t.buffer_id = ? AND t.call_id = ? ORDER BY m.position LIMIT 1"
    ),
    "non_tool_after": (
        "SELECT 1 FROM messages WHERE buffer_id = ? AND position > ? AND role != 'tool' LIMIT 1"
    ),
    # The last user turn after a position: a backward walk from the tail that stops
    # at that position (the first unanswered call), not at the buffer's head.
    "last_user_after": (
        "SELECT position FROM messages WHERE buffer_id = ? AND position > ? AND role = 'user' "
        "ORDER BY position DESC LIMIT 1"
    ),
    "tail": "SELECT max(position) FROM messages WHERE buffer_id = ?",
    "successor": (
        "SELECT position FROM messages WHERE buffer_id = ? AND position > ? "
        "ORDER BY position LIMIT 1"
    ),
    "evict_oldest": (
        "DELETE FROM messages WHERE buffer_id = ?1 AND position IN "
        "(SELECT position FROM messages WHERE buffer_id = ?1 ORDER BY position LIMIT ?2)"
    ),
    "first_message": (
        "SELECT id_text(id), role FROM messages WHERE buffer_id = ? ORDER BY position LIMIT 1"
    ),
    "delete_message": "DELETE FROM messages WHERE buffer_id = ? AND id = id_blob(?)",
    "message_for_removal": "SELECT buffer_id, role, metadata FROM messages WHERE id = id_blob(?)",
    "delete_placeholder": (
        "DELETE FROM messages WHERE buffer_id = ? AND tool_call_id = ? AND healed = 1"
    ),
    # A write holds SQLite's lock of the whole file already: nothing more to lock.
    "lock_buffer": "SELECT id FROM buffers WHERE id = ?",
    "last_message": (
        "SELECT id_text(id), role, content, content_parts, metadata FROM messages "
        "WHERE buffer_id = ? ORDER BY position DESC LIMIT 1"
    ),
    # ------------------------------------------------------------------ reads
    "count": _TALLY.format("?"),
    "count_at": _TALLY.format(
        "(SELECT id FROM buffers WHERE scope = ? AND scope_id = ? AND key = ?)"
    ),
    "read_all_at": (
        f"SELECT m.role, m.content, m.content_parts, m.metadata FROM {_AT} ORDER BY m.position"
    ),
    "read_first_at": (
        "SELECT m.role, m.content, m.content_parts, m.metadata "
        f"FROM {_AT} ORDER BY m.position LIMIT ?"
    ),
    "read_last_at": (
        "SELECT m.role, m.content, m.content_parts, m.metadata "
        f"FROM {_AT} ORDER BY m.position DESC LIMIT ?"
    ),
    "read_before": (
        "SELECT role, content, content_parts, metadata FROM messages "
        "WHERE buffer_id = ? AND position < ? ORDER BY position DESC LIMIT ?"
    ),
    "position_of": "SELECT position FROM messages WHERE buffer_id = ? AND id = id_blob(?)",
    "messages_all_at": (
        "SELECT id_text(m.id), m.position, m.role, m.content, m.content_parts, m.metadata, "
        f"m.created_at FROM {_AT} ORDER BY m.position"
    ),
    "messages_last_at": (
        "SELECT id_text(m.id), m.position, m.role, m.content, m.content_parts, m.metadata, "
        f"m.created_at FROM {_AT} ORDER BY m.position DESC LIMIT ?"
    ),
    "messages_before": (
        "SELECT id_text(id), position, role, content, content_parts, metadata, created_at "
        "FROM messages WHERE buffer_id = ? AND position < ? ORDER BY position DESC LIMIT ?"
    ),
    "clear_ledger": "DELETE FROM tool_calls WHERE buffer_id = ?",
    "clear_messages": "DELETE FROM messages WHERE buffer_id = ?",
    "list_buffers": (
        "SELECT scope, scope_id, key, count FROM (SELECT scope, scope_id, key, "
        f"({_TALLY.format('buffers.id')}) AS count FROM buffers) "
        "WHERE count > 0 ORDER BY scope, scope_id, key"
    ),
    # ----------------------------------------------------------------- memory
    "memory_get": "SELECT value FROM memory WHERE scope = ? AND scope_id = ? AND key = ?",
    "memory_set": (
        "INSERT INTO memory (scope, scope_id, key, value) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (scope, scope_id, key) DO UPDATE SET value = excluded.value, "
        # strictly later than the value it replaces, whatever the wall clock did:
        # offline sync finds changed memory by its stamps (sync.registers.kv_shape)
        "updated_at = max(strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), coalesce("
        "strftime('%Y-%m-%dT%H:%M:%fZ', updated_at, '+0.001 seconds'), updated_at))"
    ),
    "memory_delete": "DELETE FROM memory WHERE scope = ? AND scope_id = ? AND key = ?",
    # --------------------------------------------------------------- sessions
    "session_load": f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?",
    # A write holds SQLite's lock of the whole file: the plain read is locked already.
    "session_lock": f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?",
    "session_insert": (
        "INSERT INTO sessions (id, workflow_id, name, owner_id, metadata) VALUES (?, ?, ?, ?, ?)"
    ),
    # Candidates only: every row is still judged by access.decide() before it is listed.
    "session_list_all": (
        f"SELECT {_SESSION_COLUMNS} FROM sessions "
        "WHERE ?1 IS NULL OR workflow_id = ?1 ORDER BY created_at, id"
    ),
    "session_list_for": (
        f"SELECT {_SESSION_COLUMNS} FROM sessions "
        "WHERE (owner_id = ?1 "
        "OR id IN (SELECT session_id FROM session_viewers WHERE user_id = ?1)) "
        "AND (?2 IS NULL OR workflow_id = ?2) ORDER BY created_at, id"
    ),
    # Sessions._change() passes the session id last.
    "session_set_status": "UPDATE sessions SET status = ? WHERE id = ?",
    "session_reset": "UPDATE sessions SET conversation = conversation + 1 WHERE id = ?",
    # updated_at follows the session's row and its sharing, not its turns.
    "session_touch": (
        "UPDATE sessions SET updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?"
    ),
    "session_grant": "INSERT OR IGNORE INTO session_viewers (user_id, session_id) VALUES (?, ?)",
    "session_revoke": "DELETE FROM session_viewers WHERE user_id = ? AND session_id = ?",
    "session_viewers": "SELECT user_id FROM session_viewers WHERE session_id = ? ORDER BY user_id",
    "message_home": (
        "SELECT b.scope, b.scope_id FROM messages AS m JOIN buffers AS b ON b.id = m.buffer_id "
        "WHERE m.id = id_blob(?)"
    ),
    "message_by_id": (
        "SELECT id_text(id), position, role, content, content_parts, metadata, created_at "
        "FROM messages WHERE id = id_blob(?)"
    ),
    "update_message": "UPDATE messages SET content = ?, content_parts = ? WHERE id = id_blob(?)",
    "is_placeholder": "SELECT healed FROM messages WHERE id = id_blob(?)",
    # ----------------------------------------------------------- export, import
    "export_all": (
        "SELECT b.scope, b.scope_id, b.key, id_text(m.id), m.position, m.role, m.content, "
        "m.content_parts, m.metadata, m.created_at "
        "FROM buffers AS b JOIN messages AS m ON m.buffer_id = b.id "
        "ORDER BY b.scope, b.scope_id, b.key, m.position"
    ),
    # ------------------------------------------------- export format 2: the rest
    "export_session": (
        "SELECT id, workflow_id, name, owner_id, status, conversation, metadata, created_at, "
        "updated_at FROM sessions ORDER BY id"
    ),
    "export_viewer": (
        "SELECT session_id, user_id, granted_at FROM session_viewers ORDER BY session_id, user_id"
    ),
    "export_memory": (
        "SELECT scope, scope_id, key, value, created_at, updated_at FROM memory "
        "ORDER BY scope, scope_id, key"
    ),
    "export_conversation": (
        "SELECT scope, scope_id, key, title, metadata, created_at FROM buffers "
        "WHERE title <> '' OR metadata <> '{}' ORDER BY scope, scope_id, key"
    ),
    "import_conversation": (
        "UPDATE buffers SET title = ?, metadata = ?, created_at = coalesce(?, created_at) "
        "WHERE id = ?"
    ),
    "session_present": "SELECT 1 FROM sessions WHERE id = ?",
    "session_remove": "DELETE FROM sessions WHERE id = ?",
    "import_session": (
        "INSERT INTO sessions (id, workflow_id, name, owner_id, status, conversation, metadata, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    ),
    "viewer_present": "SELECT 1 FROM session_viewers WHERE session_id = ? AND user_id = ?",
    "viewer_remove": "DELETE FROM session_viewers WHERE session_id = ? AND user_id = ?",
    "import_viewer": (
        "INSERT INTO session_viewers (session_id, user_id, granted_at) VALUES (?, ?, ?)"
    ),
    "memory_present": "SELECT 1 FROM memory WHERE scope = ? AND scope_id = ? AND key = ?",
    "memory_remove": "DELETE FROM memory WHERE scope = ? AND scope_id = ? AND key = ?",
    "import_memory": (
        "INSERT INTO memory (scope, scope_id, key, value, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?)"
    ),
    "used_ids": (
        "SELECT id_text(m.id), m.buffer_id, b.scope, b.scope_id, b.key FROM messages AS m "
        "JOIN buffers AS b ON b.id = m.buffer_id "
        "WHERE m.id IN (SELECT id_blob(value) FROM json_each(?))"
    ),
    "export_one": (
        "SELECT b.scope, b.scope_id, b.key, id_text(m.id), m.position, m.role, m.content, "
        "m.content_parts, m.metadata, m.created_at "
        "FROM buffers AS b JOIN messages AS m ON m.buffer_id = b.id "
        "WHERE b.scope = ? AND b.scope_id = ? AND b.key = ? ORDER BY m.position"
    ),
    # ------------------------------------------------ conversations
    "buffer_info": (
        "SELECT b.title, b.metadata, b.created_at, b.updated_at, "
        f"coalesce(({_TALLY.format('b.id')}), 0) FROM buffers AS b "
        "WHERE b.scope = ? AND b.scope_id = ? AND b.key = ?"
    ),
    "buffer_metadata": "SELECT metadata FROM buffers WHERE id = ?",
    "set_title": "UPDATE buffers SET title = ? WHERE id = ?",
    "set_metadata": "UPDATE buffers SET metadata = ? WHERE id = ?",
    "delete_buffer": "DELETE FROM buffers WHERE id = ?",
    # Most recently updated first, a page after the cursor (updated_at, id): a range
    # of buffers_recent, so a page costs the same however many buffers there are.
    # A scope filter skips the other scopes' rows it walks past.
    "conversations_recent": (
        f"SELECT {_INFO} FROM buffers AS b INDEXED BY buffers_recent "
        "WHERE (b.updated_at, b.id) < (?1, ?2) "
        "AND (?3 IS NULL OR b.scope = ?3) AND (?4 IS NULL OR b.scope_id = ?4) "
        "ORDER BY b.updated_at DESC, b.id DESC LIMIT ?5"
    ),
    # One owner's conversations (scope and scope_id given): the address index
    # yields them, then they are sorted (a cost of the owner's buffers only).
    # INDEXED BY the address index (UNIQUE (scope, scope_id, key)): with statistics
    # the planner would walk buffers_recent, every buffer newer than the owner's.
    "conversations_of": (
        f"SELECT {_INFO} FROM buffers AS b INDEXED BY sqlite_autoindex_buffers_1 "
        "WHERE b.scope = ?3 AND b.scope_id = ?4 AND (b.updated_at, b.id) < (?1, ?2) "
        "ORDER BY b.updated_at DESC, b.id DESC LIMIT ?5"
    ),
    # A fork copies a run of rows at a time inside the database: positions and
    # content as they are, new ids (flowdrop_new_id), the tally counted afresh.
    "fork_messages": (
        "INSERT INTO messages "
        "(buffer_id, position, id, role, content, content_parts, metadata, created_at, tally) "
        "SELECT ?1, position, flowdrop_new_id(), role, content, content_parts, metadata, "
        "created_at, ?4 + row_number() OVER (ORDER BY position) FROM messages "
        "WHERE buffer_id = ?2 AND position > ?3 AND position <= ?5 ORDER BY position LIMIT ?6"
    ),
    "count_through": "SELECT count(*) FROM messages WHERE buffer_id = ? AND position <= ?",
    # The ledger of the copied rows, mapped by position (a fork keeps positions);
    # a call answered after the cut is unanswered in the fork.
    # Driven by the copied rows (od, the source's prefix), not the source's whole
    # ledger: a fork near the start of a long buffer reads only what it copies.
    "fork_ledger": (
        "INSERT INTO tool_calls (buffer_id, call_id, declared_by, ordinal, answered_by) "
        "SELECT ?1, t.call_id, nd.id, t.ordinal, na.id FROM messages AS od "
        "CROSS JOIN tool_calls AS t INDEXED BY tool_calls_declared_by ON t.declared_by = od.id "
        "JOIN messages AS nd ON nd.buffer_id = ?1 AND nd.position = od.position "
        "LEFT JOIN messages AS oa ON oa.id = t.answered_by "
        "LEFT JOIN messages AS na ON na.buffer_id = ?1 AND na.position = oa.position "
        "WHERE od.buffer_id = ?2 AND od.position <= ?3"
    ),
    # --------------------------------------------------------- search
    "search_enabled": (
        "SELECT count(*) FROM sqlite_master WHERE name = 'message_search_text' AND type = 'table'"
    ),
    "search": (
        "SELECT b.scope, b.scope_id, b.key, id_text(m.id), m.role, "
        "snippet(message_search, 0, '[', ']', '...', 16), -bm25(message_search) "
        "FROM message_search AS f JOIN message_search_text AS t ON t.id = f.rowid "
        "JOIN messages AS m ON m.id = t.message_id JOIN buffers AS b ON b.id = m.buffer_id "
        "WHERE message_search MATCH ?1 AND (?2 IS NULL OR b.scope = ?2) "
        "AND (?3 IS NULL OR b.scope_id = ?3) AND (?4 IS NULL OR b.key = ?4) "
        "ORDER BY bm25(message_search) LIMIT ?5"
    ),
    "search_count_messages": "SELECT count(*) FROM messages",
    # enable_search indexes the messages a run at a time, in (buffer_id, position)
    # order: the last key of the next run, then the run.
    "search_run_end": (
        "SELECT buffer_id, position FROM messages WHERE (buffer_id, position) > (?1, ?2) "
        "ORDER BY buffer_id, position LIMIT 1 OFFSET ?3"
    ),
    "search_index_run": (
        "INSERT INTO message_search_text (message_id, body) "
        f"SELECT id, body FROM (SELECT id, buffer_id, position, {_TEXT} AS body FROM messages "
        "WHERE (buffer_id, position) > (?1, ?2) "
        "AND (?3 IS NULL OR (buffer_id, position) <= (?3, ?4)) "
        "ORDER BY buffer_id, position) WHERE body <> ''"
    ),
    # FTS5 builds its index from the text table in one pass once every run is in.
    "search_finish": "INSERT INTO message_search (message_search) VALUES ('rebuild')",
}
SQL.update(sync_statements.for_sqlite())  # offline sync's, in this dialect
_EXPORT_CHUNK = 500  # rows an export fetches at a time


def _writable(path: str) -> bool:
    """Whether this process may write the file and create its -wal/-shm beside it."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.access(path, os.W_OK) and os.access(folder, os.W_OK)


def _checkpointers() -> list[_Checkpointer]:
    return [b._checkpointer for b in list(_LIVE) if b._checkpointer is not None]


def _pause_checkpoints_before_fork() -> None:
    """No checkpoint is under way while the process forks: the child would inherit
    SQLite's locks as the checkpoint thread held them, and never get them."""
    for checkpointer in _checkpointers():
        checkpointer.running.acquire()


def _resume_checkpoints_after_fork() -> None:
    for checkpointer in _checkpointers():
        checkpointer.running.release()


def _forget_connections_after_fork() -> None:
    for checkpointer in _checkpointers():
        checkpointer.forget_after_fork()
    for backend in list(_LIVE):
        backend._forked = True


os.register_at_fork(
    before=_pause_checkpoints_before_fork,
    after_in_parent=_resume_checkpoints_after_fork,
    after_in_child=_forget_connections_after_fork,
)


class _SqliteTx(Tx):
    """A transaction on the backend's connection (the backend's lock is held)."""

    __slots__ = ("_addresses", "_backend", "_remembered", "conn")

    def __init__(self, backend: SqliteBackend, conn: sqlite3.Connection) -> None:
        self._backend = backend
        self.conn = conn
        self._remembered: list[tuple[tuple[str, str, str], BufferState]] = []
        self._addresses: dict[int, tuple[str, str, str]] = {}

    def one(self, statement: str, params: Any = ()) -> Any:
        return self.conn.execute(SQL[statement], _bound(params)).fetchone()

    def all(self, statement: str, params: Any = ()) -> list[Any]:
        return self.conn.execute(SQL[statement], _bound(params)).fetchall()

    def run(self, statement: str, params: Any = ()) -> int:
        return self.conn.execute(SQL[statement], _bound(params)).rowcount

    def write(self, statement: str, params: Any = ()) -> None:
        if statement == "insert_message":  # the hot path: no SQL function call for the id
            params = (id_blob(params[0]), *params[1:])
        else:
            params = _bound(params)
        self.conn.execute(SQL[statement], params)

    def many(self, statement: str, rows: Any) -> None:
        if statement == "insert_message":
            # One timestamp for the batch (the time of the append), made once here
            # instead of by strftime() per row: a large import spends less per row.
            now = _utc_now()
            rows = [
                (id_blob(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7] or now, r[8]) for r in rows
            ]
        self.conn.executemany(SQL[statement], rows)

    def open_buffer(self, scope: str, scope_id: str, key: str, known_id: int | None) -> BufferState:
        # The cache is keyed by address and a miss looks the address up: a buffer
        # can be deleted (Buffer.delete) and SQLite may give its row id to the next
        # new buffer, so an id a handle remembers (known_id) is not trusted on its own.
        address = (scope, scope_id, key)
        cached = self._backend._tails.get(address)
        if cached is not None:
            self._addresses[cached.id] = address
            return cached
        conn = self.conn
        row = conn.execute(SQL["find_buffer"], address).fetchone()
        if row is None:
            conn.execute(SQL["create_buffer"], address)
            row = conn.execute(SQL["find_buffer"], address).fetchone()
        buffer_id = row[0]
        self._addresses[buffer_id] = address
        count, tail, dangling, updated, clock = conn.execute(
            SQL["buffer_state"], (buffer_id,)
        ).fetchone()
        return BufferState(buffer_id, count or 0, tail, bool(dangling), updated, clock)

    def remember(self, state: BufferState) -> None:
        self._remembered.append((self._addresses[state.id], state))

    def script(self, sql: str) -> None:
        self._backend._armed_at = None  # DDL: look at the schema again at the next write
        self.conn.execute(sql)


class _Write:
    """One write transaction (:meth:`SqliteBackend.write`): the backend's lock, then
    ``BEGIN IMMEDIATE``; ``COMMIT`` when the block ends, ``ROLLBACK`` on any exception
    (``KeyboardInterrupt`` included). A class, not a generator: it runs per append."""

    __slots__ = ("_backend", "_conn", "_keep_tails", "_tx")

    def __init__(self, backend: SqliteBackend, keep_tails: bool) -> None:
        self._backend = backend
        self._keep_tails = keep_tails

    def __enter__(self) -> _SqliteTx:
        backend = self._backend
        backend._lock.acquire()
        try:
            conn = backend.connection()
            backend._begin_immediate(conn)
        except BaseException:
            backend._lock.release()
            raise
        if not self._keep_tails:
            backend._tails.clear()
        self._conn = conn
        self._tx = _SqliteTx(backend, conn)
        return self._tx

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        backend, conn = self._backend, self._conn
        try:
            if error is None:
                try:
                    conn.execute("COMMIT")
                except BaseException as failure:
                    backend._abort(conn)
                    raise backend._translated(failure) from None
                backend.committed(conn)
                if self._keep_tails:
                    backend._changes = conn.total_changes
                    for address, state in self._tx._remembered:
                        backend._tails[address] = state
                return
            backend._abort(conn)
            translated = backend._translated(error)
            if translated is not error:
                raise translated from None
            # Otherwise the block's exception goes on as it is.
        finally:
            backend._lock.release()


def _utc_now() -> str:
    """The time as SQLite's strftime('%Y-%m-%dT%H:%M:%fZ', 'now') writes it."""
    now = datetime.datetime.now(datetime.UTC)
    return f"{now:%Y-%m-%dT%H:%M:%S}.{now.microsecond // 1000:03d}Z"


def _bound(params: Any) -> Any:
    """The parameters as SQLite binds them: a list as a JSON array, which the statement
    reads with ``json_each`` (SQLite binds no lists); the rest as they are."""
    if isinstance(params, dict):
        return params
    for value in params:
        if type(value) is list:
            return tuple(json.dumps(v) if type(v) is list else v for v in params)
    return params


def register_functions(conn: sqlite3.Connection) -> None:
    """The SQL functions the statements of :data:`SQL` call (ids as text at the boundary)."""
    conn.create_function("id_blob", 1, id_blob, deterministic=True)
    conn.create_function("id_text", 1, id_text, deterministic=True)
    conn.create_function("content_md5", 3, content_md5, deterministic=True)  # sync's digests
    # A fork's new message ids, made inside its INSERT ... SELECT (not deterministic).
    conn.create_function("flowdrop_new_id", 0, new_message_id_bytes)


# The WAL is checkpointed off the appends' commits. SQLite's automatic checkpoint runs
# inside the commit that takes the log past 1,000 pages: 4-6 ms, every one of the
# slowest appends (python -m benchmarks.append_tail). A store's own thread runs it
# instead, on a connection of its own, after this many commits or changed rows.
CHECKPOINT_AFTER_COMMITS = 250
CHECKPOINT_AFTER_CHANGES = 1000
# A log starts again from its beginning only once a checkpoint copied all of it,
# which a thread racing a writer that never pauses may not do: past this many pages
# the writer copies what is left itself, after its commit, as SQLite would (most of
# it is copied already), so the log stays bounded under any load.
CHECKPOINT_BY_THE_WRITER_PAGES = 4000
CHECKPOINT_BY_THE_WRITER_COMMITS = 1000  # ... or after this many commits, or changed
CHECKPOINT_BY_THE_WRITER_CHANGES = 4000  # rows, since the thread last finished one


class _Checkpointer:
    """PASSIVE checkpoints of one file, on a thread and a connection of their own, when
    asked. PASSIVE never waits for a lock and never blocks a writer: what it cannot
    copy now it copies at the next request, and the writer's next transaction starts
    the log again once it is copied whole."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.log_pages = 0  # the log's length at the thread's last checkpoint
        self.done = 0  # checkpoints the thread finished (a writer sees it fall behind)
        self.running = threading.Lock()  # held for each checkpoint (and across a fork)

    def request(self) -> bool:
        """Wake the thread (starting it the first time); False when it is not there
        to do it (stopped, or its connection failed): the caller checkpoints then."""
        with self._lock:
            if self._stopped:
                return False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="flowdrop-checkpoint", daemon=True
                )
                self._thread.start()
            elif not self._thread.is_alive():
                return False
        self._wake.set()
        return True

    def _run(self) -> None:
        # Opening and closing hold SQLite's mutexes as a checkpoint does: under
        # ``running`` too, or a fork at the first request (the thread starting)
        # leaves a child that hangs at its first open.
        with self.running:
            try:
                conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as error:  # the store's own connection checkpoints at close
                log.debug("no checkpoint connection to %s: %s", self._path, error)
                return
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopped:
                    return
                with self.running:
                    if self._stopped:
                        return
                    try:
                        row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                        self.log_pages = int(row[1])
                        self.done += 1
                    except sqlite3.Error as error:
                        log.debug("checkpoint of %s: %s", self._path, error)
        finally:
            with self.running:
                conn.close()

    def forget_after_fork(self) -> None:
        """In a forked child: the thread is the parent's, and no write runs here."""
        self.running.release()
        self._stopped = True
        self._thread = None

    def stop(self) -> None:
        """Stop the thread and close its connection (before the store closes its own,
        so that the last connection to close checkpoints the log, as SQLite does)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=30)


class SqliteBackend(Backend):
    """A flowdrop_local SQLite file (or ``":memory:"``); see the module docstring.

    Raises:
        NotADatabase, NotAFlowdropDatabase, SchemaTooNew: the file is not one this
            library can open; it is left untouched.
    """

    kind = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        durability: Durability = "normal",
        lock_warning_after: float = 5.0,
        lock_timeout: float | None = None,
        read_only: bool = False,
        create: bool = True,
    ) -> None:
        if not isinstance(durability, str) or durability not in _SYNCHRONOUS:
            raise InvalidArgument(f"durability must be 'normal' or 'full', got {shown(durability)}")
        self.path = path
        self.where = path
        if path != ":memory:":
            _files.refuse_link(path)  # read-only opens too: never through a link
        # A file (or folder) this process cannot write is opened read-only: reads
        # work, and every write raises ReadOnlyStore before touching the file.
        self.read_only = read_only or (
            path != ":memory:" and os.path.exists(path) and not _writable(path)
        )
        self.durability = durability
        self.lock_warning_after = lock_warning_after
        self.lock_timeout = lock_timeout
        # How long SQLite's busy handler waits before BEGIN IMMEDIATE reports the lock
        # held: until the warning, or the timeout if that comes first (_wait_longer).
        self._busy_seconds = min(lock_warning_after, lock_timeout or lock_warning_after)
        self._lock = threading.RLock()
        self._tails: dict[tuple[str, str, str], BufferState] = {}
        self._data_version = -1
        self._changes = -1  # conn.total_changes when the tails were last right
        # The file's schema version when this connection last made sure it records
        # deletions if the store syncs (_arm_sync); None: check at the next write.
        self._armed_at: int | None = None
        self._forked = False
        self._closed = True
        self._checkpointer: _Checkpointer | None = None  # a writable WAL file's
        self._commits_since_checkpoint = 0
        self._changes_at_checkpoint = 0
        self._done_seen = 0  # the thread's count of finished checkpoints, last seen
        self._commits_since_done = 0
        self._changes_at_done = 0
        # Whether this backend created the file (a caller whose work then fails may
        # remove it: _files.remove_database).
        self.created = False
        made = None  # the file as created here, exclusively (as backup creates its target)
        if path != ":memory:" and not self.read_only:
            made = _files.open_or_create(path, create)
            self.created = made is not None
        try:
            conn = self._connect()
            if made is not None:
                try:
                    _files.opened_as_created(made, path)
                except BaseException:
                    conn.close()
                    raise
        except BaseException:
            if made is not None:
                _files.remove_database(path, made)
            raise
        finally:
            if made is not None:
                os.close(made)
        try:
            journal_mode = prepare(conn, path, create=create)
            self._configure(conn, journal_mode)
        except BaseException as error:
            conn.close()
            if self.created:  # a failed open leaves no file behind that it made
                _files.remove_database(path)
            if not isinstance(error, sqlite3.OperationalError):
                raise
            if "readonly" in str(error):
                raise ReadOnlyStore(
                    f"{path} is read-only and needs its schema created or upgraded"
                ) from None
            raise NotADatabase(f"cannot open {path}: {error}") from None
        self._conn = conn
        self._closed = False
        _LIVE.add(self)

    def _connect(self) -> sqlite3.Connection:
        def connect(target: str, uri: bool = False) -> sqlite3.Connection:
            conn = sqlite3.connect(
                target,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_seconds,
                uri=uri,
            )
            _files.set_defensive(conn)
            register_functions(conn)
            return conn

        if not self.read_only:
            try:
                return connect(self.path)
            except sqlite3.Error as error:
                raise NotADatabase(f"cannot open {self.path}: {error}") from None
        if not os.path.exists(self.path):
            raise ReadOnlyStore(f"{self.path} does not exist; a read-only store cannot create it")
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.path))
        try:
            return connect(uri + "?mode=ro", uri=True)
        except sqlite3.OperationalError:
            pass
        try:
            # A WAL file in a read-only folder: no -shm can be made. Read it as a
            # snapshot that no one is writing.
            return connect(uri + "?immutable=1", uri=True)
        except sqlite3.Error as error:  # a folder, say
            raise NotADatabase(f"cannot open {self.path}: {error}") from None

    def _configure(self, conn: sqlite3.Connection, journal_mode: str) -> None:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.durability]}")
        # WAL is kept in the file: a file found in WAL mode needs no statement for it.
        if self.path != ":memory:" and not self.read_only and journal_mode != "wal":
            try:
                journal_mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as error:
                # A read-only file keeps its journal mode; reads still work.
                log.debug("journal_mode=WAL not set on %s: %s", self.path, error)
        if self.path != ":memory:" and not self.read_only and journal_mode == "wal":
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # _Checkpointer does it
            self._checkpointer = _Checkpointer(self.path)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if not self._forked:
                    if self._checkpointer is not None:
                        self._checkpointer.stop()
                    self._conn.close()

    def committed(self, conn: sqlite3.Connection) -> None:
        """After a write's COMMIT: ask for a checkpoint once enough was written; copy
        the rest of a log the thread could not finish (CHECKPOINT_BY_THE_WRITER_PAGES)."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            return
        # The thread's last word on the log's length is stale while it is starved of
        # the CPU: past this many commits or changed rows without one finished, the
        # writer copies the log itself too.
        changes = conn.total_changes
        if checkpointer.done != self._done_seen:
            self._done_seen = checkpointer.done
            self._commits_since_done, self._changes_at_done = 0, changes
        else:
            self._commits_since_done += 1
        behind = (
            self._commits_since_done >= CHECKPOINT_BY_THE_WRITER_COMMITS
            or changes - self._changes_at_done >= CHECKPOINT_BY_THE_WRITER_CHANGES
        )
        if checkpointer.log_pages >= CHECKPOINT_BY_THE_WRITER_PAGES or behind:
            # Until the log is copied whole (then the next write starts it again),
            # every commit tries: one that finds the thread mid-checkpoint (busy)
            # or copies part of the log must not wait for the thread's next word.
            whole = False
            try:
                busy, pages, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                whole = not busy and copied >= pages
            except sqlite3.Error as error:  # the next commit tries again
                log.debug("checkpoint of %s: %s", self.path, error)
            if whole:
                checkpointer.log_pages = 0
                self._commits_since_done, self._changes_at_done = 0, changes
            else:
                checkpointer.log_pages = max(checkpointer.log_pages, CHECKPOINT_BY_THE_WRITER_PAGES)
        self._commits_since_checkpoint += 1
        if (
            self._commits_since_checkpoint >= CHECKPOINT_AFTER_COMMITS
            or changes - self._changes_at_checkpoint >= CHECKPOINT_AFTER_CHANGES
        ):
            self._commits_since_checkpoint = 0
            self._changes_at_checkpoint = changes
            if not checkpointer.request():
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as error:
                    log.debug("checkpoint of %s: %s", self.path, error)

    @property
    def closed(self) -> bool:
        return self._closed

    def ensure_open(self) -> None:
        self.connection()

    def connection(self) -> sqlite3.Connection:
        """The open connection (raw access for ``Store.db`` and maintenance)."""
        if self._closed:
            raise StoreClosed(f"the store {self.path!r} is closed")
        if self._forked:
            raise StoreClosed(
                "this Store was opened in the parent process before os.fork(); "
                "open a new Store in the child"
            )
        return self._conn

    def forget_tails(self) -> None:
        """Drop the cached buffer tails (a write outside the append path may follow)."""
        self._tails.clear()

    # ------------------------------------------------------------- transactions

    def write(self, *, keep_tails: bool = False) -> AbstractContextManager[Tx]:
        return _Write(self, keep_tails)

    @contextmanager
    def read(self, *, snapshot: bool = True) -> Iterator[Tx]:
        with self._lock:
            conn = self.connection()
            own = snapshot and not conn.in_transaction
            try:
                if own:
                    conn.execute("BEGIN")  # one snapshot for every statement of the block
                yield _SqliteTx(self, conn)
            except (sqlite3.DatabaseError, UnicodeEncodeError) as error:
                raise self._translated(error) from None
            finally:
                if own and conn.in_transaction:
                    conn.execute("ROLLBACK")

    def _translated(self, error: BaseException) -> BaseException:
        """The library's error for a damaged or read-only file; any other error as it is."""
        if type(error) is sqlite3.DatabaseError:  # not its Integrity/Operational subclasses
            return NotADatabase(f"{self.path} is corrupt: {error}")
        if isinstance(error, sqlite3.OperationalError) and "readonly" in str(error):
            return ReadOnlyStore(f"{self.path} is read-only: {error}")
        if isinstance(error, UnicodeEncodeError):  # a parameter SQLite cannot take as UTF-8
            return InvalidArgument(
                "text holding a lone surrogate (a byte that is not UTF-8) cannot be stored "
                "or looked up; nothing was written"
            )
        if isinstance(error, sqlite3.DataError):  # SQLITE_TOOBIG: past SQLITE_LIMIT_LENGTH
            return TooLarge(
                f"a value is longer than {self.path} takes ({error}); nothing was written"
            )
        if isinstance(error, sqlite3.OperationalError) and str(error).startswith(
            "Could not decode"
        ):
            # Python's sqlite3 met TEXT that is not UTF-8 (a damaged file); its message
            # quotes the bytes, which are left out.
            column = _DECODE_COLUMN.search(str(error))
            return CorruptRow(
                f"{self.path} is damaged: a stored row holds text that is not UTF-8"
                f"{f' (column {column.group(1)})' if column else ''}; "
                "run 'flowdrop-local check'"
            )
        if isinstance(error, sqlite3.OperationalError) and "malformed JSON" in str(error):
            # A JSON function of ours met a stored row that is not JSON (a damaged file).
            return CorruptRow(
                f"{self.path} is damaged: a stored row does not hold valid JSON ({error}); "
                "run 'flowdrop-local check'"
            )
        return error

    def _abort(self, conn: sqlite3.Connection) -> None:
        """Roll back the open transaction (if SQLite has not already) and forget the tails."""
        self._tails.clear()
        self._armed_at = None  # TEMP triggers made in the transaction go with it
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    def _arm_sync(self, conn: sqlite3.Connection) -> None:
        """Inside a write: once the store syncs (its sync tables exist, made by any
        connection, this one's open included), this connection's TEMP triggers
        record every deletion and rename it makes (sync.schema.sqlite_delete_triggers),
        saying each tombstone's kind once the store took sync's step 4.
        Checked again when another connection committed, or this one ran DDL or
        rolled back: appends in a row by one writer read no pragma for it."""
        schema = conn.execute("PRAGMA main.schema_version").fetchone()[0]
        if schema == self._armed_at:
            return
        if conn.execute(SQL["sync_tables"]).fetchone()[0]:
            kinds = bool(conn.execute(SQL["sync_tombstone_kinds"]).fetchone()[0])
            for ddl in sqlite_delete_triggers(kinds):
                conn.execute(ddl)
        self._armed_at = schema

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """Take the write lock, waiting as long as it takes (MEM-12).

        Then drop the cached tails if another connection committed meanwhile.
        """
        if self.read_only:
            raise ReadOnlyStore(f"{self.path} is open read-only")
        started = time.monotonic()
        warned = retimed = False
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                message = str(error)
                if "readonly" in message or "read-only" in message:
                    raise ReadOnlyStore(f"{self.path} is read-only: {message}") from None
                if "locked" not in message and "busy" not in message:
                    raise FlowdropError(f"cannot start a write on {self.path}: {message}") from None
                warned = self._wait_longer(conn, started, warned)
                retimed = True
                continue
            if retimed:  # the next write waits as the connection was opened to
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_seconds * 1000)}")
            try:
                # Another connection committed, or this one wrote outside the append
                # path (store.db): what the tails cache says may be stale.
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if version != self._data_version or conn.total_changes != self._changes:
                    self._tails.clear()
                    self._data_version = version
                    self._arm_sync(conn)
                elif self._armed_at is None:
                    # Nobody else committed and this connection ran no DDL since it
                    # last looked (script() and a rollback forget it): the schema is
                    # the one it armed for, and the append is one pragma shorter.
                    self._arm_sync(conn)
            except BaseException:
                # The version is taken: the next write must arm even if nobody commits.
                self._abort(conn)
                raise
            return

    def _wait_longer(self, conn: sqlite3.Connection, started: float, warned: bool) -> bool:
        """After ``BEGIN IMMEDIATE`` found the write lock held: past ``lock_timeout``,
        raise LockTimeout (nothing was begun, so nothing is written); past
        ``lock_warning_after``, log the one warning. Then let the busy handler wait
        until whichever comes next. Returns whether the warning has been logged."""
        waited = time.monotonic() - started
        limit = self.lock_timeout
        if limit is not None and waited >= limit - 0.005:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_seconds * 1000)}")
            raise LockTimeout(
                f"gave up on a write to {self.path} after {waited:.1f} s: another writer "
                f"holds its write lock (lock_timeout={limit:g} s); nothing was written",
                limit,
            )
        if not warned and waited >= self.lock_warning_after - 0.005:
            warned = True
            log.warning(
                "flowdrop_local: waited %.1f s for the write lock on %s; still waiting%s",
                waited,
                self.path,
                "" if limit is None else f" (up to lock_timeout={limit:g} s)",
            )
        wait = self.lock_warning_after if limit is None else limit - waited
        if not warned:
            wait = min(wait, self.lock_warning_after - waited)
        conn.execute(f"PRAGMA busy_timeout = {max(1, int(wait * 1000))}")
        return warned

    def snapshot_rows(self, reads: list[tuple[str, Any]]) -> Iterator[tuple[int, Any]]:
        """See :meth:`Backend.snapshot_rows`: a read-only connection of the export's own.

        Outside WAL a reader holding its snapshot would block every commit, and a
        ``":memory:"`` database cannot be opened twice: there the rows are read
        whole first, then yielded.
        """
        if self.path == ":memory:":
            with self.read() as tx:
                everything = [(i, row) for i, (s, p) in enumerate(reads) for row in tx.all(s, p)]
            for item in everything:
                self.connection()  # a store closed meanwhile: StoreClosed, as every read
                yield item
            return
        self.connection()  # StoreClosed, as every other read
        conn = self._reader()
        try:
            try:
                conn.execute("BEGIN")
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # fixes the snapshot
            except sqlite3.OperationalError:
                if not self.read_only:
                    raise
                # A WAL file in a read-only folder (no -shm can be made): read it as
                # the store does, as a snapshot no one is writing.
                conn.close()
                conn = self._reader(immutable=True)
            else:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    everything = [
                        (i, row)
                        for i, (s, p) in enumerate(reads)
                        for row in conn.execute(SQL[s], _bound(p)).fetchall()
                    ]
                    conn.close()
                    for item in everything:
                        self.connection()
                        yield item
                    return
            for i, (statement, params) in enumerate(reads):
                cursor = conn.execute(SQL[statement], _bound(params))
                while rows := cursor.fetchmany(_EXPORT_CHUNK):
                    for row in rows:
                        self.connection()  # a store closed meanwhile: StoreClosed
                        yield i, row
        except sqlite3.Error as error:
            translated = self._translated(error)
            if not isinstance(translated, FlowdropError):
                translated = FlowdropError(f"cannot export {self.path}: {error}")
            raise translated from None
        finally:
            conn.close()  # also when the caller closes the generator or drops it

    def _reader(self, *, immutable: bool = False) -> sqlite3.Connection:
        """A read-only connection to the file, for an export's snapshot."""
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.path))
        try:
            conn = sqlite3.connect(
                uri + ("?immutable=1" if immutable else "?mode=ro"),
                uri=True,
                isolation_level=None,
                check_same_thread=False,  # a dropped generator may be finalised on any thread
                timeout=self.lock_warning_after,
            )
        except sqlite3.Error as error:
            raise NotADatabase(f"cannot open {self.path}: {error}") from None
        _files.set_defensive(conn)
        register_functions(conn)
        return conn

    # ------------------------------------------------------------- maintenance

    def check(self) -> list[Violation]:
        with self.read() as tx:
            assert isinstance(tx, _SqliteTx)
            return check_database(tx.conn)

    def vacuum(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"{self.path} is open read-only")
        with self._lock:
            conn = self.connection()
            self._tails.clear()
            try:
                conn.execute("VACUUM")  # in WAL mode the compacted pages go to the WAL ...
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # ... then into the file
            except sqlite3.DatabaseError as error:
                raise self._translated(error) from None

    def backup(self, path: str) -> None:
        """The target is created exclusively, mode 0600, without following a link:
        nothing already at ``path`` is written through or overwritten, and a failed
        backup removes what it created."""
        target_path = _files.checked_path(path, "the backup target")
        _files.require_folder(target_path)
        try:
            fd = _files.create_private(target_path)
        except FileExistsError:
            raise BackupTargetExists(f"{target_path} exists; not overwriting it") from None
        except OSError as error:
            raise FlowdropError(f"cannot back up to {target_path}: {error.strerror}") from None
        try:
            target = sqlite3.connect(target_path)
            try:
                with self._lock:
                    source = self.connection()
                    source.backup(target)
                    adopt_copy(source, target, register=not self.read_only)
            finally:
                target.close()
            # SQLite opened the path again: it must still be the file created above.
            if not _files.same_file(fd, target_path):
                raise FlowdropError(f"{target_path} was replaced while the backup was written")
        except BaseException as error:
            _files.remove_database(target_path, fd)
            if isinstance(error, sqlite3.DatabaseError):
                raise FlowdropError(f"cannot back up to {target_path}: {error}") from None
            raise
        finally:
            os.close(fd)

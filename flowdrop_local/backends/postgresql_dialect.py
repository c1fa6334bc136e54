"""PostgreSQL's dialect: its statements, the errors it raises and how they read, its
schema steps and the checks of a schema it opens. No I/O: the blocking backend
(``postgresql.py``) and the async one (``postgresql_async.py``) both speak it, so
each statement and each decision is written once.
"""

from __future__ import annotations

import functools
import logging
import re
import urllib.parse
from importlib import resources
from typing import Any, TypeVar

try:
    import psycopg
    import psycopg_pool
    from psycopg import errors as pg_errors
except ImportError as missing:  # pragma: no cover - depends on the install
    raise ImportError(
        "the PostgreSQL backend needs psycopg 3 and psycopg_pool: "
        "pip install 'flowdrop-local[postgresql]'"
    ) from missing

from ..check import Violation, check_rows
from ..errors import (
    FlowdropError,
    InvalidArgument,
    InvalidValue,
    LockTimeout,
    NotADatabase,
    NotAFlowdropDatabase,
    ReadOnlyStore,
    SchemaTooNew,
    ServerUnreachable,
    SharedSchemaRefused,
    TooLarge,
    UnsupportedOperation,
)
from ..plans import BufferState
from ..sync import statements as sync_statements
from ..sync.schema import (
    NEWEST_STAMP,
    PG_STORE_CLOCK,
    pg_delete_triggers,
)
from .postgresql_trust import (
    Verdict,
)

log = logging.getLogger("flowdrop_local")


APPLICATION_ID = "1178881107"
SCHEMA_VERSION = 3
RETRIES = 8
# Conflicts PostgreSQL resolves by aborting one transaction: running it again succeeds.
RETRIED_ERRORS = (pg_errors.DeadlockDetected, pg_errors.SerializationFailure)
T = TypeVar("T")

_SESSION_COLUMNS = (
    "id, workflow_id, name, owner_id, status, conversation, metadata, created_at, updated_at, "
    # pg_catalog's: a json_agg(text) elsewhere would match text better (issue 21 A).
    "(SELECT coalesce(pg_catalog.json_agg(user_id), '[]')::text FROM session_viewers "
    "WHERE session_id = sessions.id)"
)
# The messages of the buffer at an address (scope, scope_id, key), in one statement.
# A sub-select, not a join: the planner then walks (buffer_id, position) backwards
# for a LIMIT instead of sorting the whole buffer.
_AT = (
    "messages AS m WHERE m.buffer_id = "
    "(SELECT id FROM buffers WHERE scope = %s AND scope_id = %s AND key = %s)"
)
# export_one names the address in its rows: a join.
_JOINED_AT = (
    "buffers AS b JOIN messages AS m ON m.buffer_id = b.id "
    "WHERE b.scope = %s AND b.scope_id = %s AND b.key = %s"
)
_NOW = "flowdrop_now()"
STORE_CLOCK = PG_STORE_CLOCK  # every buffer stamp (sync/schema.py says why)
# A stamp as the library writes it: anything else (a row damaged by hand) is read as
# no time, never cast (the cast would fail every write to the conversation).
_STAMP = "'^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?Z$'"


def _epoch(stamp: str) -> str:
    """Seconds since the epoch of a stamp (an expression), 0 when it is not one."""
    return (
        f"CASE WHEN ({stamp}) ~ {_STAMP} "
        f"THEN floor(extract(epoch FROM ({stamp})::timestamptz))::bigint ELSE 0 END"
    )


_EDITED = (
    f"updated_at = greatest({STORE_CLOCK}, CASE WHEN updated_at ~ {_STAMP} THEN "
    "to_char((updated_at::timestamptz + interval '1 millisecond') AT TIME ZONE 'UTC', "
    ' \'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\') END)'
)
# A buffer's count: the tally of its last row (postgresql.sql), NULL when it is empty.
_TALLY = "SELECT tally FROM messages WHERE buffer_id = {} ORDER BY position DESC LIMIT 1"
# What an append needs to know of a buffer (plans.BufferState), after its id.
_STATE = (
    "SELECT b.id, last.tally, last.position, "
    "EXISTS (SELECT 1 FROM tool_calls WHERE buffer_id = b.id AND answered_by IS NULL), "
    f"{_epoch('b.updated_at')}, {_epoch(NEWEST_STAMP.format(t='buffers'))} "
    "FROM buffers AS b LEFT JOIN LATERAL (SELECT tally, position FROM messages "
    "WHERE buffer_id = b.id ORDER BY position DESC LIMIT 1) AS last ON true "
)

# A conversation (model.BufferInfo), then the row id (the listing's cursor).
_INFO = (
    "b.scope, b.scope_id, b.key, b.title, b.metadata, b.created_at, b.updated_at, "
    f"coalesce(({_TALLY.format('b.id')}), 0), b.id"
)
# A new message id made in SQL, per row (volatile calls, no sub-select PostgreSQL
# would run once): a UUIDv7, the time in milliseconds, then the random bits and
# variant of a gen_random_uuid(), as engine.new_message_id makes them in Python.
_MILLIS = "lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')"
_NEW_ID = (
    f"(substr({_MILLIS}, 1, 8) || '-' || substr({_MILLIS}, 9, 4) || '-7' "
    "|| substr(gen_random_uuid()::text, 16))"  # a v4's random bits, its variant kept
)

# The named statements, in PostgreSQL's dialect (the same names as backends/sqlite.py).

SQL: dict[str, str] = {
    # ----------------------------------------------------------- the append engine
    "find_buffer": "SELECT id FROM buffers WHERE scope = %s AND scope_id = %s AND key = %s",
    "create_buffer": (
        "INSERT INTO buffers (scope, scope_id, key, updated_at) "
        f"VALUES (%s, %s, %s, {STORE_CLOCK}) ON CONFLICT DO NOTHING"
    ),
    # By id, under the row lock (PgTx.open_buffer): the id too, as _STATE_AT gives it.
    "buffer_state": f"{_STATE}WHERE b.id = %s",
    "insert_message": (
        "INSERT INTO messages "
        "(id, buffer_id, position, role, content, content_parts, metadata, created_at, tally) "
        f"VALUES (%s, %s, %s, %s, %s, %s, %s, coalesce(%s, {_NOW}), %s)"
    ),
    "pairing_state": (
        "SELECT 1, tool_call_id, id, healed FROM messages "
        "WHERE buffer_id = %(1)s AND tool_call_id = ANY(%(2)s) "
        "UNION ALL SELECT DISTINCT 0, call_id, NULL::text, NULL::integer FROM tool_calls "
        "WHERE buffer_id = %(1)s AND call_id = ANY(%(3)s)"
    ),
    "declare_call": (
        "INSERT INTO tool_calls (buffer_id, call_id, declared_by, ordinal, answered_by) "
        "VALUES (%(1)s, %(2)s, %(3)s, %(4)s, "
        "(SELECT id FROM messages WHERE buffer_id = %(1)s AND tool_call_id = %(2)s)) "
        "ON CONFLICT DO NOTHING"
    ),
    "mark_answered": (
        "UPDATE tool_calls SET answered_by = %s WHERE buffer_id = %s AND call_id = %s"
    ),
    "replace_placeholder": (
        "UPDATE messages SET content = %s, content_parts = %s, metadata = %s "
        "WHERE buffer_id = %s AND id = %s"
    ),
    "set_tally": "UPDATE messages SET tally = %s WHERE buffer_id = %s AND position = %s",
    "touch_buffer": f"UPDATE buffers SET updated_at = {STORE_CLOCK} WHERE id = %s",
    "touch_edited": f"UPDATE buffers SET {_EDITED} WHERE id = %s",
    "unanswered_calls": (
        "SELECT m.position, t.call_id, (SELECT min(n.position) FROM messages AS n "
        "WHERE n.buffer_id = t.buffer_id AND n.position > m.position) "
        "FROM tool_calls AS t "
        "JOIN messages AS m ON m.buffer_id = t.buffer_id AND m.id = t.declared_by "
        "WHERE t.buffer_id = %s AND t.answered_by IS NULL ORDER BY m.position, t.ordinal"
    ),
    "declaring_turn": (
        "SELECT m.position FROM tool_calls AS t "
        "JOIN messages AS m ON m.buffer_id = t.buffer_id AND m.id = t.declared_by "
        "WHERE t.buffer_id = %s AND t.call_id = %s ORDER BY m.position LIMIT 1"
    ),
    "declaring_message": (
        "SELECT t.declared_by FROM tool_calls AS t "
        "JOIN messages AS m ON m.buffer_id = t.buffer_id AND m.id = t.declared_by "
        "WHERE t.buffer_id = %s AND t.call_id = %s ORDER BY m.position LIMIT 1"
    ),
    "non_tool_after": (
        "SELECT 1 FROM messages WHERE buffer_id = %s AND position > %s AND role <> 'tool' LIMIT 1"
    ),
    "last_user_after": (
        "SELECT position FROM messages WHERE buffer_id = %s AND position > %s "
        "AND role = 'user' ORDER BY position DESC LIMIT 1"
    ),
    "tail": "SELECT max(position) FROM messages WHERE buffer_id = %s",
    "successor": (
        "SELECT position FROM messages WHERE buffer_id = %s AND position > %s "
        "ORDER BY position LIMIT 1"
    ),
    "evict_oldest": (
        "DELETE FROM messages WHERE buffer_id = %(1)s AND id IN "
        "(SELECT id FROM messages WHERE buffer_id = %(1)s ORDER BY position LIMIT %(2)s)"
    ),
    "first_message": (
        "SELECT id, role FROM messages WHERE buffer_id = %s ORDER BY position LIMIT 1"
    ),
    "delete_message": "DELETE FROM messages WHERE buffer_id = %s AND id = %s",
    "message_for_removal": "SELECT buffer_id, role, metadata FROM messages WHERE id = %s",
    "delete_placeholder": (
        "DELETE FROM messages WHERE buffer_id = %s AND tool_call_id = %s AND healed = 1"
    ),
    # pop, clear and an admin's delete wait for an append in progress on the buffer.
    # On a store that syncs they first take the change numbers' lock (as their
    # deletion triggers will): always that lock before the buffer's, as a sync
    # takes them, so a delete and a sync never wait for each other in a cycle.
    "lock_buffer": (
        # The key PG_SEQ_LOCK takes, qualified: name || unknown is an overload's to win.
        "WITH numbers AS (SELECT CASE WHEN pg_catalog.to_regclass('flowdrop_sync_replica') "
        "IS NOT NULL THEN pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext("
        "pg_catalog.concat(pg_catalog.current_schema(), '.flowdrop_sync_seq'))) END) "
        "SELECT b.id FROM buffers AS b, numbers WHERE b.id = %s FOR UPDATE OF b"
    ),
    "last_message": (
        "SELECT id, role, content, content_parts, metadata FROM messages "
        "WHERE buffer_id = %s ORDER BY position DESC LIMIT 1"
    ),
    # ------------------------------------------------------------------ reads
    "count": _TALLY.format("%s"),
    "count_at": _TALLY.format(
        "(SELECT id FROM buffers WHERE scope = %s AND scope_id = %s AND key = %s)"
    ),
    "read_all_at": (
        f"SELECT m.role, m.content, m.content_parts, m.metadata FROM {_AT} ORDER BY m.position"
    ),
    "read_first_at": (
        "SELECT m.role, m.content, m.content_parts, m.metadata "
        f"FROM {_AT} ORDER BY m.position LIMIT %s"
    ),
    "read_last_at": (
        "SELECT m.role, m.content, m.content_parts, m.metadata "
        f"FROM {_AT} ORDER BY m.position DESC LIMIT %s"
    ),
    "read_before": (
        "SELECT role, content, content_parts, metadata FROM messages "
        "WHERE buffer_id = %s AND position < %s ORDER BY position DESC LIMIT %s"
    ),
    "position_of": "SELECT position FROM messages WHERE buffer_id = %s AND id = %s",
    "messages_all_at": (
        "SELECT m.id, m.position, m.role, m.content, m.content_parts, m.metadata, m.created_at "
        f"FROM {_AT} ORDER BY m.position"
    ),
    "messages_last_at": (
        "SELECT m.id, m.position, m.role, m.content, m.content_parts, m.metadata, m.created_at "
        f"FROM {_AT} ORDER BY m.position DESC LIMIT %s"
    ),
    "messages_before": (
        "SELECT id, position, role, content, content_parts, metadata, created_at FROM messages "
        "WHERE buffer_id = %s AND position < %s ORDER BY position DESC LIMIT %s"
    ),
    "clear_ledger": "DELETE FROM tool_calls WHERE buffer_id = %s",
    "clear_messages": "DELETE FROM messages WHERE buffer_id = %s",
    "list_buffers": (
        "SELECT b.scope, b.scope_id, b.key, last.tally FROM buffers AS b "
        f"JOIN LATERAL ({_TALLY.format('b.id')}) AS last ON true "
        'ORDER BY b.scope COLLATE "C", b.scope_id COLLATE "C", b.key COLLATE "C"'
    ),
    # ----------------------------------------------------------------- memory
    "memory_get": "SELECT value FROM memory WHERE scope = %s AND scope_id = %s AND key = %s",
    "memory_set": (
        "INSERT INTO memory (scope, scope_id, key, value) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (scope, scope_id, key) DO UPDATE SET value = excluded.value, "
        f"updated_at = greatest({_NOW}, CASE WHEN memory.updated_at ~ {_STAMP} THEN "
        "to_char((memory.updated_at::timestamptz + interval '1 millisecond') AT TIME ZONE "
        "'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') END)"
    ),
    "memory_delete": "DELETE FROM memory WHERE scope = %s AND scope_id = %s AND key = %s",
    # --------------------------------------------------------------- sessions
    "session_load": f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = %s",
    # Loaded FOR UPDATE in a write: a revoke cannot commit between a decision
    # and the write that acts on it.
    "session_lock": f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = %s FOR UPDATE",
    "session_insert": (
        "INSERT INTO sessions (id, workflow_id, name, owner_id, metadata) "
        "VALUES (%s, %s, %s, %s, %s)"
    ),
    "session_list_all": (
        f"SELECT {_SESSION_COLUMNS} FROM sessions "
        "WHERE %(1)s::text IS NULL OR workflow_id = %(1)s ORDER BY created_at, id"
    ),
    "session_list_for": (
        f"SELECT {_SESSION_COLUMNS} FROM sessions "
        "WHERE (owner_id = %(1)s "
        "OR id IN (SELECT session_id FROM session_viewers WHERE user_id = %(1)s)) "
        "AND (%(2)s::text IS NULL OR workflow_id = %(2)s) ORDER BY created_at, id"
    ),
    "session_set_status": "UPDATE sessions SET status = %s WHERE id = %s",
    "session_reset": "UPDATE sessions SET conversation = conversation + 1 WHERE id = %s",
    "session_touch": f"UPDATE sessions SET updated_at = {_NOW} WHERE id = %s",
    "session_grant": (
        "INSERT INTO session_viewers (user_id, session_id) VALUES (%s, %s) ON CONFLICT DO NOTHING"
    ),
    "session_revoke": "DELETE FROM session_viewers WHERE user_id = %s AND session_id = %s",
    "session_viewers": (
        'SELECT user_id FROM session_viewers WHERE session_id = %s ORDER BY user_id COLLATE "C"'
    ),
    "message_home": (
        "SELECT b.scope, b.scope_id FROM messages AS m JOIN buffers AS b ON b.id = m.buffer_id "
        "WHERE m.id = %s"
    ),
    "message_by_id": (
        "SELECT id, position, role, content, content_parts, metadata, created_at "
        "FROM messages WHERE id = %s"
    ),
    "update_message": "UPDATE messages SET content = %s, content_parts = %s WHERE id = %s",
    "is_placeholder": "SELECT healed FROM messages WHERE id = %s",
    # ----------------------------------------------------------- export, import
    "export_all": (
        "SELECT b.scope, b.scope_id, b.key, m.id, m.position, m.role, m.content, "
        "m.content_parts, m.metadata, m.created_at "
        "FROM buffers AS b JOIN messages AS m ON m.buffer_id = b.id "
        'ORDER BY b.scope COLLATE "C", b.scope_id COLLATE "C", b.key COLLATE "C", m.position'
    ),
    # ------------------------------------------------- export format 2: the rest
    "export_session": (
        "SELECT id, workflow_id, name, owner_id, status, conversation, metadata, created_at, "
        'updated_at FROM sessions ORDER BY id COLLATE "C"'
    ),
    "export_viewer": (
        "SELECT session_id, user_id, granted_at FROM session_viewers "
        'ORDER BY session_id COLLATE "C", user_id COLLATE "C"'
    ),
    "export_memory": (
        "SELECT scope, scope_id, key, value, created_at, updated_at FROM memory "
        'ORDER BY scope COLLATE "C", scope_id COLLATE "C", key COLLATE "C"'
    ),
    "export_conversation": (
        "SELECT scope, scope_id, key, title, metadata, created_at FROM buffers "
        "WHERE title <> '' OR metadata <> '{}' ORDER BY scope, scope_id, key"
    ),
    "import_conversation": (
        "UPDATE buffers SET title = %s, metadata = %s, created_at = coalesce(%s, created_at) "
        "WHERE id = %s"
    ),
    "session_present": "SELECT 1 FROM sessions WHERE id = %s",
    "session_remove": "DELETE FROM sessions WHERE id = %s",
    "import_session": (
        "INSERT INTO sessions (id, workflow_id, name, owner_id, status, conversation, metadata, "
        "created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    ),
    "viewer_present": "SELECT 1 FROM session_viewers WHERE session_id = %s AND user_id = %s",
    "viewer_remove": "DELETE FROM session_viewers WHERE session_id = %s AND user_id = %s",
    "import_viewer": (
        "INSERT INTO session_viewers (session_id, user_id, granted_at) VALUES (%s, %s, %s)"
    ),
    "memory_present": "SELECT 1 FROM memory WHERE scope = %s AND scope_id = %s AND key = %s",
    "memory_remove": "DELETE FROM memory WHERE scope = %s AND scope_id = %s AND key = %s",
    "import_memory": (
        "INSERT INTO memory (scope, scope_id, key, value, created_at, updated_at) "
        "VALUES (%s, %s, %s, %s, %s, %s)"
    ),
    "used_ids": (
        "SELECT m.id, m.buffer_id, b.scope, b.scope_id, b.key FROM messages AS m "
        "JOIN buffers AS b ON b.id = m.buffer_id WHERE m.id = ANY(%s)"
    ),
    "export_one": (
        "SELECT b.scope, b.scope_id, b.key, m.id, m.position, m.role, m.content, "
        "m.content_parts, m.metadata, m.created_at "
        f"FROM {_JOINED_AT} ORDER BY m.position"
    ),
    # ------------------------------------------------ conversations
    "buffer_info": (
        "SELECT b.title, b.metadata, b.created_at, b.updated_at, "
        f"coalesce(({_TALLY.format('b.id')}), 0) FROM buffers AS b "
        "WHERE b.scope = %s AND b.scope_id = %s AND b.key = %s"
    ),
    "buffer_metadata": "SELECT metadata FROM buffers WHERE id = %s",
    "set_title": "UPDATE buffers SET title = %s WHERE id = %s",
    "set_metadata": "UPDATE buffers SET metadata = %s WHERE id = %s",
    "delete_buffer": "DELETE FROM buffers WHERE id = %s",
    "conversations_recent": (
        f"SELECT {_INFO} FROM buffers AS b "
        "WHERE (b.updated_at, b.id) < (%(1)s, %(2)s) "
        "AND (%(3)s::text IS NULL OR b.scope = %(3)s) "
        "AND (%(4)s::text IS NULL OR b.scope_id = %(4)s) "
        "ORDER BY b.updated_at DESC, b.id DESC LIMIT %(5)s"
    ),
    "conversations_of": (
        f"SELECT {_INFO} FROM buffers AS b "
        "WHERE b.scope = %(3)s AND b.scope_id = %(4)s AND (b.updated_at, b.id) < (%(1)s, %(2)s) "
        "ORDER BY b.updated_at DESC, b.id DESC LIMIT %(5)s"
    ),
    "fork_messages": (
        "INSERT INTO messages "
        "(buffer_id, position, id, role, content, content_parts, metadata, created_at, tally) "
        f"SELECT %(1)s, position, {_NEW_ID}, role, content, content_parts, metadata, "
        "created_at, %(4)s + row_number() OVER (ORDER BY position) FROM messages "
        "WHERE buffer_id = %(2)s AND position > %(3)s AND position <= %(5)s "
        "ORDER BY position LIMIT %(6)s"
    ),
    "count_through": "SELECT count(*) FROM messages WHERE buffer_id = %s AND position <= %s",
    # Driven by the copied rows (od): the LATERAL subquery (OFFSET 0 keeps the planner
    # from flattening it back into a join) is a keyed look-up per copied row, where a
    # join, without statistics, hashed the source's whole ledger.
    "fork_ledger": (
        "INSERT INTO tool_calls (buffer_id, call_id, declared_by, ordinal, answered_by) "
        "SELECT %(1)s, t.call_id, nd.id, t.ordinal, na.id FROM messages AS od "
        "CROSS JOIN LATERAL (SELECT l.buffer_id, l.call_id, l.ordinal, l.answered_by "
        "FROM tool_calls AS l WHERE l.buffer_id = od.buffer_id AND l.declared_by = od.id "
        "OFFSET 0) AS t "
        "JOIN messages AS nd ON nd.buffer_id = %(1)s AND nd.position = od.position "
        "LEFT JOIN messages AS oa ON oa.buffer_id = t.buffer_id AND oa.id = t.answered_by "
        "LEFT JOIN messages AS na ON na.buffer_id = %(1)s AND na.position = oa.position "
        "WHERE od.buffer_id = %(2)s AND od.position <= %(3)s"
    ),
    # --------------------------------------------------------- search
    "search_enabled": "SELECT count(*) FROM pg_catalog.pg_tables "
    "WHERE schemaname = pg_catalog.current_schema() AND tablename = 'message_search'",
    # The text search functions are pg_catalog's: 'simple' is an untyped literal, which
    # a (text, text) overload would match better than regconfig (issue 21 A).
    "search": (
        "SELECT b.scope, b.scope_id, b.key, m.id, m.role, "
        "pg_catalog.ts_headline('pg_catalog.simple', "
        "flowdrop_message_text(m.content, m.content_parts), hit.q, "
        "'StartSel=[, StopSel=], MaxWords=24, MinWords=8'), hit.score "
        "FROM (SELECT s.message_id, q, pg_catalog.ts_rank(s.document, q) AS score "
        "FROM pg_catalog.plainto_tsquery('pg_catalog.simple', %(1)s) AS q, message_search AS s "
        "JOIN buffers AS f ON f.id = s.buffer_id "
        "WHERE s.document @@ q AND (%(2)s::text IS NULL OR f.scope = %(2)s) "
        "AND (%(3)s::text IS NULL OR f.scope_id = %(3)s) "
        "AND (%(4)s::text IS NULL OR f.key = %(4)s) "
        "ORDER BY score DESC, s.message_id LIMIT %(5)s) AS hit "
        "JOIN messages AS m ON m.id = hit.message_id JOIN buffers AS b ON b.id = m.buffer_id "
        "ORDER BY hit.score DESC, hit.message_id"
    ),
    "search_count_messages": "SELECT count(*) FROM messages",
    "search_run_end": (
        "SELECT buffer_id, position FROM messages WHERE (buffer_id, position) > (%s, %s) "
        "ORDER BY buffer_id, position LIMIT 1 OFFSET %s"
    ),
    "search_index_run": (
        "INSERT INTO message_search (message_id, buffer_id, document) "
        "SELECT id, buffer_id, pg_catalog.to_tsvector('pg_catalog.simple', body) "
        "FROM (SELECT id, buffer_id, "
        "flowdrop_message_text(content, content_parts) AS body FROM messages "
        "WHERE (buffer_id, position) > (%(1)s, %(2)s) "
        "AND (%(3)s::bigint IS NULL OR (buffer_id, position) <= (%(3)s, %(4)s))) AS t "
        "WHERE body <> ''"
    ),
    # The planner's statistics for the new table (the GIN index is kept as rows go in).
    "search_finish": "ANALYZE message_search",
}
SQL.update(sync_statements.for_postgresql())  # offline sync's, in this dialect

# Statements that use a parameter twice number them, ``%(1)s`` as SQLite's ``?1``:
# their positional parameters are bound by number (the order is the statement's).
NUMBERED_PARAMS: frozenset[str] = frozenset(
    name for name, text in SQL.items() if re.search(r"%\(\d+\)s", text)
)
# Steps whose parameters name a message by id alone but PostgreSQL keys it by buffer.
LOCK_AT = "SELECT id FROM buffers WHERE scope = %s AND scope_id = %s AND key = %s FOR UPDATE"
_LOCK_ID = "SELECT id FROM buffers WHERE id = %s FOR UPDATE"
_STATE_AT = f"{_STATE}WHERE b.scope = %s AND b.scope_id = %s AND b.key = %s"
READ_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"
# What check reads of each buffer (check_rows judges it).
CHECK_BUFFERS_SQL = "SELECT id, scope, scope_id, key FROM buffers"
CHECK_MESSAGES_SQL = (
    "SELECT id, position, role, metadata, content, tally FROM messages "
    "WHERE buffer_id = %s ORDER BY position"
)
CHECK_LEDGER_SQL = (
    "SELECT call_id, declared_by, ordinal, answered_by FROM tool_calls WHERE buffer_id = %s"
)
# user:password@ : the password runs to the last "@" before the path, so one holding
# a raw "@" (which libpq splits at the first) is masked whole.
# A URL's authority as a message may quote it: from "://" to the end of its token.
# A password may hold any character ("/", "?", "#", "@" raw, as generated passwords
# do): the userinfo ends at the token's last "@", whatever comes before it, and its
# password is what follows the first ":" (over-masking an "@" of the query is safe).
_AUTHORITY = re.compile(r"(://)(\S*)@")
# A query parameter (or a keyword=value pair in libpq's text): its name, then its value.
_PARAMETER = re.compile(r"(?<![\w%])((?:[\w]|%[0-9A-Fa-f]{2})+)(\s*=\s*)('[^']*'|[^&\s]*)")
# libpq's parameters whose value is a secret.
_SECRETS = frozenset({"password", "sslpassword", "oauth_client_secret"})


def redact(url: str) -> str:
    """The text (a URL, or a message quoting one) without a secret: the password of
    ``user:password@``, and the value of every secret libpq parameter (``password``,
    ``sslpassword``, ``oauth_client_secret``; its name percent-encoded or not), for
    messages and ``repr``."""

    def parameter(match: re.Match[str]) -> str:
        name = urllib.parse.unquote(match[1]).lower()
        return f"{match[1]}{match[2]}***" if name in _SECRETS else match[0]

    return _PARAMETER.sub(parameter, _AUTHORITY.sub(_masked_userinfo, url))


def _masked_userinfo(match: re.Match[str]) -> str:
    user, colon, _password = match[2].partition(":")
    return f"{match[1]}{user}:***@" if colon else match[0]


def _password_of(url: str) -> str | None:
    """The password of the URL's userinfo (as :func:`redact` finds it), if any."""
    match = _AUTHORITY.search(url)
    if match is None or ":" not in match[2]:
        return None
    return match[2].partition(":")[2]


def secrets_of(url: str) -> list[str]:
    """The secret values in a URL as libpq may quote them back (a host name that took
    the part of a password after its first raw "@", a decoded parameter), longest
    first, for :func:`redact_error`."""
    found: list[str] = []
    password = _password_of(url)
    if password:
        pieces = password.split("@")
        found += [password, urllib.parse.unquote(password)]
        found += ["@".join(pieces[i:]) + "@" for i in range(1, len(pieces))]
        # libpq ends the userinfo at the first "/" or "@": the pieces on either side
        # become a host, a port or a database name that its messages quote.
        for i, character in enumerate(password):
            if character in "@/":
                found += [p for p in (password[:i], password[i + 1 :]) if len(p) >= 3]
    for match in _PARAMETER.finditer(url.partition("?")[2]):
        if urllib.parse.unquote(match[1]).lower() in _SECRETS and match[3]:
            found += [match[3], urllib.parse.unquote(match[3])]
    return sorted({piece for piece in found if piece.strip("@")}, key=len, reverse=True)


def redact_error(error: BaseException, url: str) -> str:
    """:func:`redacted` of an error raised while connecting to ``url``: every secret of
    the URL is masked wherever libpq's message quotes it."""
    text = redacted(error)
    for secret in secrets_of(url):
        text = text.replace(secret, "***@" if secret.endswith("@") else "***")
    return text


# libpq's words for a server it never got an answer from (another failure to connect,
# such as a refused password or a missing database, came from the server itself).
_UNREACHABLE = re.compile(
    r"refused|timeout|timed out|resolve|translate host|unknown host|Name or service|"
    r"No such file|No route|unreachable|Network is",
    re.IGNORECASE,
)


def connect_error(error: BaseException, url: str) -> ServerUnreachable:
    """The error for a first connection that failed: :class:`ServerUnreachable`, saying
    whether the server was not reached or turned the connection away; no secret."""
    reason = redact_error(error, url)
    what = (
        "the server is unreachable"
        if _UNREACHABLE.search(reason)
        else "the server refused the connection"
    )
    return ServerUnreachable(f"cannot connect to {redact(url)}: {what}: {reason}")


def opening_error(error: BaseException, where: str) -> BaseException:
    """The library's error for what failed while a backend opened its schema (sync or
    async): a role that may not create it, a server or pool that failed; else ``error``."""
    if isinstance(error, pg_errors.InsufficientPrivilege):
        return ReadOnlyStore(
            f"{where}: this role may not create flowdrop_local's schema here: {redacted(error)}"
        )
    if isinstance(error, psycopg.Error | psycopg_pool.PoolTimeout):
        return NotADatabase(f"cannot open {where}: {redacted(error)}")
    return error


def checked_buffer(name: str, messages: list[Any], ledger: list[Any]) -> list[Violation]:
    """One buffer's invariants from its rows (CHECK_MESSAGES_SQL, CHECK_LEDGER_SQL): its
    count is the last row's tally."""
    count = messages[-1][5] if messages else 0
    return check_rows(name, count, [row[:5] for row in messages], ledger)


def buffer_state(row: Any) -> BufferState:
    """The engine's BufferState from a row of the state statement (_STATE)."""
    buffer_id, count, tail, dangling, updated, clock = row
    return BufferState(buffer_id, count or 0, tail, bool(dangling), updated, clock)


def lock_statement(known_id: int | None, address: tuple[str, str, str]) -> tuple[str, Any]:
    """The statement (and parameters) that locks a buffer's row, by id once it is known."""
    return (LOCK_AT, address) if known_id is None else (_LOCK_ID, (known_id,))


def state_statement(known_id: int | None, address: tuple[str, str, str]) -> tuple[str, Any]:
    """The statement (and parameters) that reads a buffer's state after its lock."""
    return (_STATE_AT, address) if known_id is None else (SQL["buffer_state"], (known_id,))


def lock_timeout(warn_after: float) -> str:
    """``SET LOCAL lock_timeout``: how long the row lock waits before the warning."""
    return f"SET LOCAL lock_timeout = {max(1, int(warn_after * 1000))}"


def lock_waits(warn_after: float, limit: float | None) -> tuple[str, str, str | None]:
    """The ``SET LOCAL lock_timeout`` statements of a buffer's row lock, as
    :meth:`.postgresql_io_async.AsyncPgTx._locked_state` runs them: before the lock (until
    the warning, or the store's ``lock_timeout`` if that comes first), after it (every
    later statement: the store's ``lock_timeout``, or none), and before the lock is
    asked again past the warning (None: past ``lock_timeout`` already, give up)."""
    after = "SET LOCAL lock_timeout TO DEFAULT" if limit is None else lock_timeout(limit)
    if limit is None:
        return lock_timeout(warn_after), after, after
    if limit <= warn_after:
        return lock_timeout(limit), after, None
    return lock_timeout(warn_after), after, lock_timeout(limit - warn_after)


def write_begin(limit: float | None) -> list[tuple[str, Any, bool]]:
    """The queued statements a write transaction starts with: ``BEGIN``, then the
    store's ``lock_timeout`` for every lock the write waits for (a memory key's row,
    a session's), when it has one."""
    begin: list[tuple[str, Any, bool]] = [("BEGIN", None, False)]
    return begin if limit is None else [*begin, (lock_timeout(limit), None, False)]


def warn_lock_wait(warn_after: float, address: tuple[str, str, str], where: str) -> None:
    """The one warning an append logs when it waited ``lock_warning_after`` for its buffer."""
    log.warning(
        "flowdrop_local: waited %.1f s for buffer %s/%s/%s on %s; still waiting",
        warn_after,
        *address,
        where,
    )


def statement_params(statement: str, params: Any) -> Any:
    """The parameters as psycopg binds them: by number where the statement numbers them."""
    if statement not in NUMBERED_PARAMS:
        return params
    return {str(number): value for number, value in enumerate(params, 1)}


def after_begin(queued: list[tuple[str, Any, bool]]) -> int:
    """Where the path's pin goes in a transaction's first statements: after its BEGIN
    and the ``SET LOCAL`` settings that follow it (a pin before BEGIN would not last)."""
    at = 0
    while at < len(queued) and queued[at][0].startswith(("BEGIN", "SET LOCAL")):
        at += 1
    return at


@functools.cache
def schema_sql() -> str:
    """The text of postgresql.sql, shipped inside the package."""
    return resources.files(__package__).joinpath("postgresql.sql").read_text(encoding="utf-8")


def refuse_sqlite_settings(durability: str, read_only: bool) -> None:
    """UnsupportedOperation for a SQLite-only setting given for PostgreSQL."""
    if durability != "normal":
        raise UnsupportedOperation(
            "durability= is a SQLite setting; on PostgreSQL set synchronous_commit "
            "on the server (a committed transaction is durable by default)"
        )
    if read_only:
        raise UnsupportedOperation(
            "read_only= is a SQLite setting; on PostgreSQL connect as a role that "
            "only has SELECT privileges"
        )


def translated(
    error: BaseException, where: str, lock_timeout: float | None = None
) -> BaseException:
    """The library's error for a database error (any other error as it is); no password."""
    if isinstance(error, pg_errors.ReadOnlySqlTransaction | pg_errors.InsufficientPrivilege):
        return ReadOnlyStore(f"{where}: {error}")
    if isinstance(
        error, pg_errors.UntranslatableCharacter | pg_errors.CharacterNotInRepertoire
    ) or (isinstance(error, psycopg.DataError) and "NUL" in str(error)):
        # Text and jsonb cannot hold NUL (\x00, or \u0000 in JSON) on PostgreSQL.
        return InvalidValue(f"PostgreSQL cannot store a NUL character: {redacted(error)}")
    if isinstance(error, UnicodeEncodeError):  # a parameter that cannot be sent as UTF-8
        return InvalidArgument(
            "text holding a lone surrogate (a byte that is not UTF-8) cannot be stored "
            "or looked up; nothing was written"
        )
    if isinstance(error, pg_errors.LockNotAvailable):  # lock_timeout ran out
        return LockTimeout(
            f"gave up on a write to {where}: another transaction holds a lock it needs "
            f"({redacted(error)}; lock_timeout={lock_timeout or 0:g} s); nothing was written",
            lock_timeout or 0.0,
        )
    if isinstance(error, pg_errors.ProgramLimitExceeded):
        return TooLarge(f"a value is longer than {where} takes: {redacted(error)}")
    if isinstance(error, psycopg.OperationalError):
        return FlowdropError(f"{where}: {redacted(error)}")
    return error


def no_connection(where: str, error: BaseException) -> FlowdropError:
    """The error for a pool that handed out no connection (timed out, or closed)."""
    return FlowdropError(
        f"no connection to {where} came free: {redacted(error)} "
        "(are exports still being read, or is the pool too small?)"
    )


def redacted(error: BaseException) -> str:
    """The error's text on one line, without a password."""
    return redact(" ".join(str(error).split()))


TABLES_SQL = (
    "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = pg_catalog.current_schema()"
)
META_SQL = "SELECT name, value FROM flowdrop_meta"
# Serialises the creation of the schema between processes (a transaction-level lock).
CREATE_LOCK_SQL = "SELECT pg_catalog.pg_advisory_xact_lock(4604935500)"


def version_of(tables: set[str], meta: dict[str, str], where: str) -> int | None:
    """The schema version the tables and ``flowdrop_meta`` rows say, or the error they call for."""
    if "flowdrop_meta" not in tables:
        ours = {"buffers", "messages", "tool_calls", "memory", "sessions", "session_viewers"}
        if tables & ours:
            raise NotAFlowdropDatabase(
                f"{where} has tables named like ours ({', '.join(sorted(tables & ours))}) "
                "but is not a flowdrop_local database"
            )
        return None
    if meta.get("application_id") != APPLICATION_ID:
        raise NotAFlowdropDatabase(f"{where} is not a flowdrop_local database")
    version = int(meta.get("schema_version", "0"))
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{where} has schema version {version}; this flowdrop_local reads up to "
            f"{SCHEMA_VERSION}: upgrade flowdrop_local"
        )
    if version < SCHEMA_VERSION and version not in _UPGRADES:
        raise NotAFlowdropDatabase(f"{where} has unknown flowdrop_local schema version {version}")
    return version


def schema_scripts(version: int | None, create: bool, where: str) -> list[bytes]:
    """What brings a database of ``version`` (None: no schema yet) to SCHEMA_VERSION."""
    if version is None:
        if not create:
            raise NotAFlowdropDatabase(f"{where} holds no flowdrop_local schema")
        return [schema_sql().encode()]
    return [_UPGRADES[v].encode() for v in range(version, SCHEMA_VERSION)]


# _UPGRADES[n] brings a version-n database to version n + 1, in the transaction
# _prepare opens. Append-only: a released step is never edited.
_UPGRADES: dict[int, str] = {
    # 2 -> 3: the count moves from the buffer's row to the tally of its last message
    # (no buffer row written per append); conversation title, metadata, recency.
    2: """
ALTER TABLE buffers
    ADD COLUMN title text NOT NULL DEFAULT '',
    ADD COLUMN metadata text NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata::jsonb) = 'object'),
    ADD COLUMN updated_at text NOT NULL DEFAULT flowdrop_now();
UPDATE buffers AS b SET updated_at = coalesce(
    (SELECT max(created_at) FROM messages WHERE buffer_id = b.id), b.created_at);
CREATE INDEX buffers_recent ON buffers (updated_at, id);
ALTER TABLE messages ADD COLUMN tally bigint NOT NULL DEFAULT 0;
UPDATE messages AS m SET tally = b.message_count FROM buffers AS b
    WHERE b.id = m.buffer_id
    AND m.position = (SELECT max(position) FROM messages WHERE buffer_id = b.id);
DROP TRIGGER messages_count_delete ON messages;
DROP FUNCTION flowdrop_count_deleted();
CREATE FUNCTION flowdrop_tally_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE messages AS m
    SET tally = CASE WHEN gone.last_position > m.position THEN gone.last_tally ELSE m.tally END
                - gone.n
    FROM (SELECT buffer_id, count(*) AS n, max(position) AS last_position,
                 (array_agg(tally ORDER BY position DESC))[1] AS last_tally
          FROM deleted GROUP BY buffer_id) AS gone
    WHERE m.buffer_id = gone.buffer_id
      AND m.position = (SELECT max(position) FROM messages WHERE buffer_id = gone.buffer_id);
    RETURN NULL;
END $$;
CREATE TRIGGER messages_tally_delete AFTER DELETE ON messages
    REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT
    EXECUTE FUNCTION flowdrop_tally_deleted();
ALTER TABLE buffers DROP COLUMN message_count;
CREATE OR REPLACE FUNCTION flowdrop_place_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a message keeps its buffer, position, id and role'
        USING ERRCODE = 'integrity_constraint_violation';
END $$;
DROP TRIGGER messages_place_is_fixed ON messages;
CREATE TRIGGER messages_place_is_fixed BEFORE UPDATE OF buffer_id, position, id, role ON messages
    FOR EACH ROW EXECUTE FUNCTION flowdrop_place_is_fixed();
UPDATE flowdrop_meta SET value = '3' WHERE name = 'schema_version';
""",
}


def schema_findings(found: Verdict) -> list[Violation]:
    """What the open refuses: what could run inside our statements (postgresql_trust.py),
    then our triggers and indexes by name."""
    return [*found.refused, *schema_violations_of(found.trigger_names, found.index_names)]


def stale_findings(found: Verdict) -> list[Violation]:
    """check()'s finding for each function of ours that differs from its definition."""
    return [
        Violation(
            "schema",
            f"function {name} is not the one flowdrop_local makes (its body or its "
            "search_path differ): opening the store again updates it",
        )
        for name in found.stale
    ]


def refuse(problems: list[Violation], where: str) -> None:
    """NotAFlowdropDatabase naming the problems (the first three, and how many more)."""
    if problems:
        shown = "; ".join(v.detail for v in problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise NotAFlowdropDatabase(
            f"{where} has a schema flowdrop_local did not make: {shown}{more}"
        )


def refuse_shared(found: Verdict, where: str, *, accepted: bool) -> None:
    """SharedSchemaRefused when roles other than ours may create objects in the store's
    schema, unless the caller ``accepted`` it (``shared_schema=True``: then a warning)."""
    if found.shared and not accepted:
        raise SharedSchemaRefused(
            f"{where}: refused: {found.shared[0].detail}; to open it anyway, accepting that "
            "risk, pass shared_schema=True (the CLI: FLOWDROP_PG_SHARED_SCHEMA=1)"
        )


def warn(found: Verdict, where: str) -> None:
    """One warning per finding the open lets through (check() reports them too)."""
    for violation in [*found.shared, *found.warned]:
        log.warning("flowdrop_local: %s: %s", where, violation.detail)


@functools.cache
def _declared(kind: str) -> frozenset[str]:
    """The names of the triggers or indexes postgresql.sql declares."""
    pattern = r"CREATE TRIGGER (\w+)" if kind == "trigger" else r"CREATE (?:UNIQUE )?INDEX (\w+)"
    return frozenset(re.findall(pattern, schema_sql()))


def schema_violations_of(triggers: set[str], indexes: set[str]) -> list[Violation]:
    """The schema check's findings for the triggers and indexes present on our tables."""
    found: list[Violation] = []
    # The optional search index's triggers (postgresql_search.sql) are ours too,
    # all of them once any is there.
    search = frozenset(re.findall(r"CREATE TRIGGER (\w+)", _search_sql()))
    if triggers & search:
        for name in sorted(search - triggers):
            found.append(Violation("schema", f"trigger {name} of the search index is missing"))
    # Offline sync's, which record deletions, once a sync made them (sync/schema.py).
    texts = " ".join(pg_delete_triggers(kinds=True))
    synced = frozenset(re.findall(r"OR REPLACE TRIGGER (\w+)", texts))
    if triggers & synced:
        for name in sorted(synced - triggers):
            found.append(Violation("schema", f"trigger {name} of offline sync is missing"))
    for kind, present in (("trigger", triggers - search - synced), ("index", indexes)):
        for name in sorted(_declared(kind) - present):
            found.append(Violation("schema", f"{kind} {name} is missing"))
        for name in sorted(present - _declared(kind)):
            found.append(Violation("schema", f"{kind} {name} on our tables is not ours"))
    return found


@functools.cache
def _search_sql() -> str:
    """The text of postgresql_search.sql (the optional search index)."""
    folder = resources.files(__package__)
    return folder.joinpath("postgresql_search.sql").read_text(encoding="utf-8")

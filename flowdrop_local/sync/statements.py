"""Sync's named statements in each backend's dialect. Each backend takes them into
its statement table when it loads (:func:`for_sqlite`, :func:`for_postgresql`) and
runs them by name like its own, holding none of sync's SQL. The SQL both dialects
read alike is :data:`.schema.SYNC_COMMON` (``?`` for PostgreSQL's ``%s``). A leaf,
as :mod:`.schema` is: the PostgreSQL backend is optional (``psycopg``), so nothing
here imports a backend.
"""

from __future__ import annotations

from .schema import PG_SEQ_LOCK, PG_STORE_CLOCK, SQLITE_STORE_CLOCK, SYNC_COMMON

# A buffer's sync summary: its row id, updated_at, and its last row's position, tally
# and id. Every library write changes one of them (sync.side trusts that).
_SQLITE_SUMMARY = (
    "SELECT b.scope, b.scope_id, b.key, b.id, b.updated_at, t.position, t.tally, "
    "id_text(t.id) FROM buffers AS b LEFT JOIN messages AS t ON t.buffer_id = b.id "
    "AND t.position = (SELECT max(position) FROM messages WHERE buffer_id = b.id)"
)

SQLITE: dict[str, str] = {
    # Sync's own tables, made on first use (they name none of ours, so the schema
    # check lets them be); see sync/schema.py for what each holds.
    "sync_tables": (
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'flowdrop_sync_replica'"
    ),
    "sync_scan": (
        "SELECT b.scope, b.scope_id, b.key, id_text(m.id), m.position, "
        "content_md5(m.content, m.metadata, m.content_parts) "
        "FROM buffers AS b JOIN messages AS m ON m.buffer_id = b.id ORDER BY b.id, m.position"
    ),
    "sync_now": f"SELECT {SQLITE_STORE_CLOCK}",
    # Each buffer changed at or after a time (every buffer for ''), with its summary:
    # buffers_recent is the index, the tail its primary key.
    "sync_candidates": f"{_SQLITE_SUMMARY} WHERE b.updated_at >= ?",
    "sync_summary_one": f"{_SQLITE_SUMMARY} WHERE b.scope = ? AND b.scope_id = ? AND b.key = ?",
    "sync_where": (
        "SELECT id_text(m.id), b.scope, b.scope_id, b.key, m.role, m.metadata FROM messages AS m "
        "JOIN buffers AS b ON b.id = m.buffer_id "
        "WHERE m.id IN (SELECT id_blob(value) FROM json_each(?))"
    ),
    "sync_light": (
        "SELECT id_text(id), position, role, metadata, "
        "content_md5(content, metadata, content_parts), created_at "
        "FROM messages WHERE buffer_id = ? ORDER BY position"
    ),
    "sync_tombstones_held": (
        "SELECT id, kind FROM flowdrop_sync_tombstones WHERE id IN (SELECT value FROM json_each(?))"
    ),
    "sync_row_at": "SELECT id_text(id) FROM messages WHERE buffer_id = ? AND position = ?",
    "sync_versions_of": (
        "SELECT id, fingerprint, generation FROM flowdrop_sync_versions "
        "WHERE id IN (SELECT value FROM json_each(?))"
    ),
    # Links (sync.order): ids as 16 bytes, the root's parent NULL ('' in Python); a
    # parent that is neither (a damaged file) reads as 'malformed', and is refused.
    "sync_links_of": (
        "SELECT id_text(id), CASE WHEN parent IS NULL THEN '' "
        "ELSE coalesce(id_text(parent), 'malformed') END, rank FROM flowdrop_sync_links "
        "WHERE id IN (SELECT id_blob(value) FROM json_each(?))"
    ),
    "sync_link_ranks": (
        "SELECT id_text(parent), max(rank) FROM flowdrop_sync_links "
        "WHERE parent IN (SELECT id_blob(value) FROM json_each(?)) GROUP BY parent"
    ),
    "sync_link_put": (
        "INSERT INTO flowdrop_sync_links (id, parent, rank) VALUES (id_blob(?), id_blob(?), ?) "
        "ON CONFLICT (id) DO UPDATE SET parent = excluded.parent, rank = excluded.rank"
    ),
    "sync_light_from": (
        "SELECT id_text(id), position, role, metadata, "
        "content_md5(content, metadata, content_parts), created_at "
        "FROM messages WHERE buffer_id = ? AND position >= ? ORDER BY position"
    ),
    "sync_contents": (
        "SELECT id_text(id), content, content_parts FROM messages "
        "WHERE id IN (SELECT id_blob(value) FROM json_each(?))"
    ),
    # Whether this connection is ready for sync: its tables (the newest one), and
    # the TEMP triggers that record deletions (sync.schema.sqlite_delete_triggers),
    # and whether its tombstones have a kind (step 4).
    "sync_schema_table": (
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'flowdrop_sync_schema'"
    ),
    "sync_tombstone_kinds": (
        "SELECT count(*) FROM pragma_table_info('flowdrop_sync_tombstones') WHERE name = 'kind'"
    ),
    "sync_lock_registers": "SELECT 1",
    "sync_lock_timeout": "SELECT 1",
    "sync_quiet": "INSERT INTO flowdrop_sync_quiet (on_) VALUES (1)",
    "sync_loud": "DELETE FROM flowdrop_sync_quiet",
    # SQLite takes one writer at a time: change numbers are taken in commit order.
    "sync_seq_lock": "SELECT 1",
    "sync_untombstone": (
        "DELETE FROM flowdrop_sync_tombstones WHERE id IN (SELECT value FROM json_each(?))"
    ),
    # INDEXED BY, as for unanswered_calls: the buffer's unanswered calls, not its ledger.
    "sync_drop_unanswered": (
        "DELETE FROM tool_calls INDEXED BY tool_calls_unanswered "
        "WHERE buffer_id = ? AND answered_by IS NULL"
    ),
    "sync_answered_refresh": (
        "UPDATE tool_calls INDEXED BY tool_calls_unanswered SET answered_by = "
        "(SELECT m.id FROM messages AS m "
        "WHERE m.buffer_id = tool_calls.buffer_id AND m.tool_call_id = tool_calls.call_id) "
        "WHERE buffer_id = ? AND answered_by IS NULL"
    ),
}

# A buffer's summary on PostgreSQL, as on SQLite.
_PG_SUMMARY = (
    "SELECT b.scope, b.scope_id, b.key, b.id, b.updated_at, t.position, t.tally, t.id "
    "FROM buffers AS b LEFT JOIN LATERAL (SELECT position, tally, id FROM messages "
    "WHERE buffer_id = b.id ORDER BY position DESC LIMIT 1) AS t ON true"
)

# A message's fingerprint for sync, byte for byte what content_md5 computes on SQLite.
_PG_CONTENT_MD5 = "md5(m.content || chr(31) || m.metadata || chr(31) || m.content_parts::text)"

POSTGRESQL: dict[str, str] = {
    "sync_tables": (
        "SELECT count(*) FROM pg_catalog.pg_tables "
        "WHERE schemaname = pg_catalog.current_schema() AND tablename = 'flowdrop_sync_replica'"
    ),
    "sync_scan": (
        "SELECT b.scope, b.scope_id, b.key, m.id, m.position, "
        f"{_PG_CONTENT_MD5} "
        "FROM buffers AS b JOIN messages AS m ON m.buffer_id = b.id ORDER BY b.id, m.position"
    ),
    "sync_now": f"SELECT {PG_STORE_CLOCK}",
    "sync_candidates": f"{_PG_SUMMARY} WHERE b.updated_at >= %s",
    "sync_summary_one": f"{_PG_SUMMARY} WHERE b.scope = %s AND b.scope_id = %s AND b.key = %s",
    "sync_where": (
        "SELECT m.id, b.scope, b.scope_id, b.key, m.role, m.metadata FROM messages AS m "
        "JOIN buffers AS b ON b.id = m.buffer_id WHERE m.id = ANY(%s)"
    ),
    "sync_light": (
        f"SELECT id, position, role, metadata, {_PG_CONTENT_MD5}, created_at "
        "FROM messages AS m WHERE buffer_id = %s ORDER BY position"
    ),
    "sync_tombstones_held": "SELECT id, kind FROM flowdrop_sync_tombstones WHERE id = ANY(%s)",
    "sync_row_at": "SELECT id FROM messages WHERE buffer_id = %s AND position = %s",
    "sync_versions_of": (
        "SELECT id, fingerprint, generation FROM flowdrop_sync_versions WHERE id = ANY(%s)"
    ),
    "sync_links_of": (
        "SELECT id::text, coalesce(parent::text, ''), rank FROM flowdrop_sync_links "
        "WHERE id = ANY(%s::uuid[])"
    ),
    "sync_link_ranks": (
        "SELECT parent::text, max(rank) FROM flowdrop_sync_links "
        "WHERE parent = ANY(%s::uuid[]) GROUP BY parent"
    ),
    "sync_link_put": (
        "INSERT INTO flowdrop_sync_links (id, parent, rank) "
        "VALUES (%s::uuid, nullif(%s, '')::uuid, %s) "
        "ON CONFLICT (id) DO UPDATE SET parent = excluded.parent, rank = excluded.rank"
    ),
    "sync_light_from": (
        f"SELECT id, position, role, metadata, {_PG_CONTENT_MD5}, created_at "
        "FROM messages AS m WHERE buffer_id = %s AND position >= %s ORDER BY position"
    ),
    "sync_contents": "SELECT id, content, content_parts FROM messages WHERE id = ANY(%s)",
    "sync_schema_table": (
        "SELECT count(*) FROM pg_catalog.pg_tables "
        "WHERE schemaname = pg_catalog.current_schema() AND tablename = 'flowdrop_sync_schema'"
    ),
    "sync_tombstone_kinds": (
        "SELECT count(*) FROM information_schema.columns "
        "WHERE table_schema = pg_catalog.current_schema() "
        "AND table_name = 'flowdrop_sync_tombstones' AND column_name = 'kind'"
    ),
    "sync_lock_registers": (
        "LOCK TABLE memory, sessions, session_viewers IN SHARE ROW EXCLUSIVE MODE"
    ),
    "sync_lock_timeout": "SET LOCAL lock_timeout = '200ms'",
    "sync_quiet": "SELECT set_config('flowdrop.sync_quiet', 'on', true)",
    "sync_loud": "SELECT set_config('flowdrop.sync_quiet', '', true)",
    "sync_seq_lock": PG_SEQ_LOCK,
    "sync_untombstone": "DELETE FROM flowdrop_sync_tombstones WHERE id = ANY(%s)",
}


def for_sqlite() -> dict[str, str]:
    """Sync's statements in SQLite's dialect (a dialect's own override the shared one
    of the same name)."""
    return {**SYNC_COMMON, **SQLITE}


def for_postgresql() -> dict[str, str]:
    """Sync's statements in PostgreSQL's dialect."""
    return {**{name: sql.replace("?", "%s") for name, sql in SYNC_COMMON.items()}, **POSTGRESQL}

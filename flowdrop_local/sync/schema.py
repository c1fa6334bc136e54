"""Offline sync's schema: its tables and triggers as numbered steps
(:func:`schema_steps`), the store's clock every buffer stamp comes from, and the
SQL both dialects read alike (:data:`SYNC_COMMON`, which the backends take in
through :mod:`.statements`). A leaf module: the backends import it for the clock, the
triggers and the schema check, and nothing here imports the rest of the library.

The tables are made at a store's first sync (or ``enable``), not by schema.sql: a
store that never syncs has none. They reference none of the library's tables (no
foreign key), so the schema check accepts them beside ours; the library's own
writes reach them only through the triggers below and the engine's notices
(:mod:`.notices`).

* ``flowdrop_sync_replica``: one row, this store's replica id (a UUID).
* ``flowdrop_sync_state``: per buffer address, the message ids (with a prefix of
  each fingerprint), the digest and the summary it had when the store last synced
  (with any peer): a message that was there then and is gone now was deleted here,
  and becomes a tombstone at the next sync; a summary still the same means nothing
  changed (blanked by ``engine.edited`` on any change but an append at the end).
* ``flowdrop_sync_tombstones``: deleted message ids, numbered by a per-store
  sequence ``seq`` (the change sequence peers keep a high-water mark of), and
  what each deleted (``kind``, step 4): :data:`DELETED_MESSAGE`,
  :data:`REMOVED_ROW` or :data:`DELETED_PLACEHOLDER`.
* ``flowdrop_sync_peers``: per peer replica, the highest ``seq`` of its tombstones
  this store has received.
* ``flowdrop_sync_acks``: per peer, the highest ``seq`` of this store's tombstones
  that peer has received (its mark of this store, learnt at a full sync):
  tombstones every known peer has received are compacted.
* ``flowdrop_sync_marks``: per peer and scope set, this store's clock when their
  last sync began and that sync's id (the same on both): buffers not written since
  on either side are the same on both; and ``kv``, per kind of keyed value, the
  last sync that wrote it here and how many there were.
* ``flowdrop_sync_kv_clock``: per kind of keyed value (memory, viewer), the last
  sync that read and wrote it here.
* ``flowdrop_sync_retired``: peers :func:`~flowdrop_local.syncing.forget_peer`
  retired here (never passed on): compaction no longer waits for them, and this
  store never learns them as peers again.
* ``flowdrop_sync_conversations``: per buffer address, when its title or metadata
  last changed here, or (``deleted``) when the buffer was deleted: a conversation's
  name and existence sync by last writer wins (recorded by the triggers below).
* ``flowdrop_sync_hlc``: per kind of keyed value, the latest stamp a sync wrote
  here: a deletion a later sync finds is stamped after it (a hybrid logical clock),
  so a value synced with a stamp ahead of the clock cannot outlive its deletion.
* ``flowdrop_sync_links``: each message's link (``rules.order``): the message
  it was written after (``parent``, '' for none) and its rank, made the first time
  a sync saw it and never changed; kept after the message is deleted, so the
  messages after it keep their place on every replica (step 3; it replaced
  ``flowdrop_sync_moves``, the count of times syncs re-keyed a message).
* ``flowdrop_sync_versions``: for a message edited in place, the generation of the
  version this store holds (1 for the first edit a sync found, and so on): of two
  versions the later generation wins; equal generations are a conflict.
* ``flowdrop_sync_conflicts``: what a merge dropped that was not a duplicate
  (MEM-1: a second real result; MEM-2: a turn whose calls the other side declared;
  ``edit``: one message changed two ways), with the whole message, for the user;
  keyed by the dropped id and its version (the fingerprint).
* ``flowdrop_sync_kv_state``: the memory keys (``kind`` 'memory': scope, scope_id,
  key) and viewer grants ('viewer': session id, user id, '') present at the last
  sync: one there then and gone now was deleted (revoked) here; and ('session':
  id, the row as JSON, '') each session row as of the last sync, the base of a
  field-by-field merge.
* ``flowdrop_sync_kv_tombstones``: those deletions, with the time the sync found
  them (last writer wins against values by that time).
"""

from __future__ import annotations

import datetime
import hashlib
import uuid
from typing import Any

# What a tombstone deleted (its ``kind``); of two for one id the lower holds.
DELETED_MESSAGE = 0
"""A message the user or the application deleted: its row goes on every replica,
and so does every row a merge made to hold its content elsewhere (an answer in its
call's tool run, ``rules.merge.answered_in_place_id``). Tombstones made before
step 4 are of this kind."""
REMOVED_ROW = 1
"""A row a merge removed by the buffer rules (a duplicate, a result it answered in
the tool run, a turn re-declaring calls): the row goes, its content stays where the
merge kept it."""
DELETED_PLACEHOLDER = 2
"""A placeholder deleted (by the user, or by a merge): the row goes only while it
is a placeholder. A real result that replaced it in place meanwhile (MEM-10, on a
replica that had not seen the deletion) stays: a real result beats a placeholder."""

SYNC_TABLES: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_replica "
    "(id TEXT PRIMARY KEY, created_at TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_state (scope TEXT NOT NULL, "
    "scope_id TEXT NOT NULL, key TEXT NOT NULL, digest TEXT NOT NULL, ids TEXT NOT NULL, "
    "summary TEXT NOT NULL DEFAULT '', PRIMARY KEY (scope, scope_id, key))",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_tombstones (id TEXT PRIMARY KEY, "
    "scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL, seq BIGINT NOT NULL, "
    "deleted_at TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS flowdrop_sync_tombstones_seq ON flowdrop_sync_tombstones (seq)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_peers "
    "(peer TEXT PRIMARY KEY, received BIGINT NOT NULL, synced_at TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_conflicts (dropped_id TEXT NOT NULL, "
    "version TEXT NOT NULL, "
    "rule TEXT NOT NULL, scope TEXT NOT NULL, scope_id TEXT NOT NULL, key TEXT NOT NULL, "
    "call_id TEXT, kept_id TEXT, message TEXT NOT NULL, recorded_at TEXT NOT NULL, "
    "PRIMARY KEY (dropped_id, version))",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_kv_state (kind TEXT NOT NULL, "
    "k1 TEXT NOT NULL, k2 TEXT NOT NULL, k3 TEXT NOT NULL, PRIMARY KEY (kind, k1, k2, k3))",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_kv_tombstones (kind TEXT NOT NULL, "
    "k1 TEXT NOT NULL, k2 TEXT NOT NULL, k3 TEXT NOT NULL, deleted_at TEXT NOT NULL, "
    "PRIMARY KEY (kind, k1, k2, k3))",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_acks (peer TEXT PRIMARY KEY, acked BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_marks (peer TEXT NOT NULL, "
    "scopes TEXT NOT NULL, since TEXT NOT NULL, sync_id TEXT NOT NULL, "
    "kv TEXT NOT NULL DEFAULT '', PRIMARY KEY (peer, scopes))",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_kv_clock (kind TEXT PRIMARY KEY, "
    "sync_id TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_versions (id TEXT PRIMARY KEY, "
    "fingerprint TEXT NOT NULL, generation BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_retired (peer TEXT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_moves (id TEXT PRIMARY KEY, "
    "position TEXT NOT NULL, generation BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_hlc (kind TEXT PRIMARY KEY, stamp TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_conversations (scope TEXT NOT NULL, "
    "scope_id TEXT NOT NULL, key TEXT NOT NULL, stamp TEXT NOT NULL, "
    "deleted INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (scope, scope_id, key))",
)

# The step a store's sync schema is at (one row; no row or no table: none taken).
SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS flowdrop_sync_schema "
    "(one INTEGER PRIMARY KEY CHECK (one = 1), step INTEGER NOT NULL)"
)


def schema_steps(postgresql: bool) -> tuple[tuple[str, ...], ...]:
    """Sync's schema as numbered steps, the same on both backends: a sync takes the
    steps its store has not taken (flowdrop_sync_schema) in its own transaction, and
    runs no DDL once the store is current. A later change to sync's tables or
    triggers is a new step at the end, never an edit of one taken. Step 1 is sync
    v2's tables, made with IF NOT EXISTS, so a store synced before there were steps
    takes it too; step 2 PostgreSQL's triggers (CREATE OR REPLACE)."""
    return (
        (*SYNC_TABLES, SCHEMA_TABLE),
        # 2: PostgreSQL's triggers, their functions pinned to the search path the
        # library's connection sets (a function in a schema others can create in
        # could otherwise run inside them: issue 21); on SQLite they are TEMP
        # triggers each connection makes (SQLITE_DELETE_TRIGGERS).
        pg_delete_triggers(kinds=False) if postgresql else (),
        # 3: the order every replica gives a buffer (rules.order): each message's
        # link, made when a sync first sees it; moves counted per message go.
        link_tables(postgresql),
        # 4: what a tombstone deleted (its kind), and the triggers that say it.
        (
            PG_KIND_COLUMN if postgresql else SQLITE_KIND_COLUMN,
            *(pg_delete_triggers(kinds=True) if postgresql else ()),
        ),
        # 5: a conversation made again after its deletion is stamped after it (on
        # SQLite the TEMP trigger says so from now on: SQLITE_RECREATED).
        (_pg_conversation_changed(PG_RECREATED),) if postgresql else (),
    )


# SQLite has no ADD COLUMN IF NOT EXISTS: the step runner skips this one when the
# column is there (a file whose step row was lost takes the steps again).
SQLITE_KIND_COLUMN = (
    "ALTER TABLE flowdrop_sync_tombstones ADD COLUMN kind INTEGER NOT NULL "
    f"DEFAULT {DELETED_MESSAGE}"
)
PG_KIND_COLUMN = (
    "ALTER TABLE flowdrop_sync_tombstones ADD COLUMN IF NOT EXISTS kind integer NOT NULL "
    f"DEFAULT {DELETED_MESSAGE}"
)


def link_tables(postgresql: bool) -> tuple[str, ...]:
    """Step 3. A link outlives its message, so its size is what sync costs for every
    message ever synced: ids as 16 bytes (SQLite, WITHOUT ROWID: kept by id, no
    rowid beside it) or ``uuid`` (PostgreSQL); ``parent`` NULL for the root."""
    table = (
        "CREATE TABLE IF NOT EXISTS flowdrop_sync_links (id uuid PRIMARY KEY, "
        "parent uuid, rank bigint NOT NULL)"
        if postgresql
        else "CREATE TABLE IF NOT EXISTS flowdrop_sync_links (id BLOB PRIMARY KEY, "
        "parent BLOB, rank INTEGER NOT NULL) WITHOUT ROWID"
    )
    return (table, *_LINK_INDEX)


_LINK_INDEX: tuple[str, ...] = (
    # A new child ranks above its parent's children (rules.order.link_new).
    "CREATE INDEX IF NOT EXISTS flowdrop_sync_links_parent ON flowdrop_sync_links (parent, rank)",
    "DROP TABLE IF EXISTS flowdrop_sync_moves",
)


# Deletions are recorded when they happen (issue 20): on a store that syncs, every
# message deleted outside a sync gets its tombstone in the deleting transaction,
# numbered with the store's next change number. SQLite: TEMP triggers each
# connection of a syncing store makes (sqlite_temp_master, so the schema check of
# the file is unaffected; a writer behind the library has none, and the sync's
# comparison with what a buffer held still finds its deletions). A sync's own
# moves and removals are quiet (a row in temp.flowdrop_sync_quiet, rolled back
# with the sync). A buffer's row is gone before its cascade deletes its messages:
# the buffer's trigger records them first.
_NEXT_SEQ = (  # (the derived table is named: PostgreSQL before 16 wants an alias)
    "(SELECT coalesce(max(n), 0) FROM (SELECT max(seq) AS n FROM flowdrop_sync_tombstones "
    "UNION ALL SELECT max(acked) FROM flowdrop_sync_acks) AS known)"
)
# The store's clock: the wall clock, or the newest buffer stamp if that is later
# (one seek of buffers_recent). Every buffer stamp the library writes (a new buffer,
# an append's touch, an edit) and every conversation stamp below is taken from it,
# so stamps never go back when the wall clock does. A sync's mark is the newest
# buffer stamp at its start; what changed since is stamped at or after it, however
# the clock was set in between (sync.scan).
# Only stamps that sort as times count (a damaged 'not a time' sorts after every
# date and would become every later stamp); the bound keeps it one index seek.
NEWEST_STAMP = "SELECT max(updated_at) FROM {t} WHERE updated_at <= '9999-12-31T23:59:59.999Z'"
SQLITE_STORE_CLOCK = (
    "max(strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), "
    f"coalesce(({NEWEST_STAMP.format(t='main.buffers')}), ''))"
)
PG_STORE_CLOCK = f"greatest(flowdrop_now(), ({NEWEST_STAMP.format(t='buffers')}))"
# A conversation made again after its deletion is stamped after that deletion, even
# when the store's clock is behind the deletion's stamp (another device's clock ran
# ahead, or this one deleted and wrote it again in one millisecond): otherwise the
# older deletion, winning a tie or an earlier stamp, deletes what was written after
# it on every replica still holding it (issue 20, campaign four).
SQLITE_RECREATED = (
    f"max({SQLITE_STORE_CLOCK}, "
    "coalesce(strftime('%Y-%m-%dT%H:%M:%fZ', stamp, '+0.001 seconds'), stamp))"
)
PG_RECREATED = (
    f"greatest({PG_STORE_CLOCK}, pg_catalog.to_char((stamp::pg_catalog.timestamptz "
    "+ interval '1 millisecond') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))"
)
_CONVERSATION_PUT = (
    "INSERT INTO flowdrop_sync_conversations (scope, scope_id, key, stamp, deleted) "
    "VALUES ({a}.scope, {a}.scope_id, {a}.key, {now}, {deleted}) "
    "ON CONFLICT (scope, scope_id, key) DO UPDATE SET stamp = excluded.stamp, "
    "deleted = excluded.deleted"
)
# A tombstone's kind from the deleted row ({m}: its name in the trigger): a
# placeholder (rules.pairing.marked_healed: a tool row, ``healed`` JSON true).
_SQLITE_KIND = (
    "CASE WHEN {m}.role = 'tool' AND json_type({m}.metadata, '$.healed') = 'true' "
    f"THEN {DELETED_PLACEHOLDER} ELSE {DELETED_MESSAGE} END"
)
_PG_KIND = (
    "CASE WHEN {m}.role = 'tool' AND ({m}.metadata::jsonb -> 'healed') = 'true'::jsonb "
    f"THEN {DELETED_PLACEHOLDER} ELSE {DELETED_MESSAGE} END"
)
# A deletion of a row a weaker tombstone names (a placeholder's, a merge's) makes
# it the stronger one, numbered again so every peer receives it.
_STRONGER = (
    "ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, seq = excluded.seq, "
    "deleted_at = excluded.deleted_at WHERE excluded.kind < flowdrop_sync_tombstones.kind"
)


def sqlite_delete_triggers(kinds: bool) -> tuple[str, ...]:
    """SQLite's TEMP triggers; ``kinds``: the store took step 4 (its tombstones have
    a kind). Each is dropped first: a connection armed before a sync took step 4
    makes them again with kinds."""
    columns = "id, scope, scope_id, key, seq, deleted_at" + (", kind" if kinds else "")
    insert = (
        f"INSERT INTO flowdrop_sync_tombstones ({columns}) "
        if kinds
        else f"INSERT OR IGNORE INTO flowdrop_sync_tombstones ({columns}) "
    )
    kind_of = {m: (", " + _SQLITE_KIND.format(m=m)) if kinds else "" for m in ("OLD", "m")}
    conflict = f" {_STRONGER}" if kinds else ""
    names = (
        "flowdrop_sync_message_deleted",
        "flowdrop_sync_buffer_deleted",
        "flowdrop_sync_conversation_named",
        "flowdrop_sync_conversation_made",
    )
    return (
        "CREATE TEMP TABLE IF NOT EXISTS flowdrop_sync_quiet (on_ INTEGER)",
        *(f"DROP TRIGGER IF EXISTS temp.{name}" for name in names),
        "CREATE TEMP TRIGGER flowdrop_sync_message_deleted "
        "AFTER DELETE ON main.messages "
        "WHEN NOT EXISTS (SELECT 1 FROM flowdrop_sync_quiet) "
        "AND EXISTS (SELECT 1 FROM flowdrop_sync_replica) BEGIN "
        f"{insert}"
        f"SELECT id_text(OLD.id), b.scope, b.scope_id, b.key, {_NEXT_SEQ} + 1, "
        f"strftime('%Y-%m-%dT%H:%M:%fZ', 'now'){kind_of['OLD']} "
        f"FROM buffers AS b WHERE b.id = OLD.buffer_id{conflict}; END",
        "CREATE TEMP TRIGGER flowdrop_sync_buffer_deleted "
        "BEFORE DELETE ON main.buffers "
        "WHEN NOT EXISTS (SELECT 1 FROM flowdrop_sync_quiet) "
        "AND EXISTS (SELECT 1 FROM flowdrop_sync_replica) BEGIN "
        f"{insert}"
        f"SELECT id_text(m.id), OLD.scope, OLD.scope_id, OLD.key, {_NEXT_SEQ} "
        "+ row_number() OVER (ORDER BY m.position), strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
        f"{kind_of['m']} FROM messages AS m WHERE m.buffer_id = OLD.id{conflict}; "
        f"{_CONVERSATION_PUT.format(a='OLD', now=SQLITE_STORE_CLOCK, deleted=1)}; END",
        "CREATE TEMP TRIGGER flowdrop_sync_conversation_named "
        "AFTER UPDATE OF title, metadata ON main.buffers "
        "WHEN NOT EXISTS (SELECT 1 FROM flowdrop_sync_quiet) "
        "AND EXISTS (SELECT 1 FROM flowdrop_sync_replica) "
        "AND (OLD.title IS NOT NEW.title OR OLD.metadata IS NOT NEW.metadata) BEGIN "
        f"{_CONVERSATION_PUT.format(a='NEW', now=SQLITE_STORE_CLOCK, deleted=0)}; END",
        "CREATE TEMP TRIGGER flowdrop_sync_conversation_made "
        "AFTER INSERT ON main.buffers "
        "WHEN NOT EXISTS (SELECT 1 FROM flowdrop_sync_quiet) BEGIN "
        f"UPDATE flowdrop_sync_conversations SET deleted = 0, stamp = {SQLITE_RECREATED} "
        "WHERE scope = NEW.scope AND scope_id = NEW.scope_id AND key = NEW.key "
        "AND deleted = 1; END",
    )


# PostgreSQL: the same as persistent triggers, made with sync's tables; the quiet
# flag is a transaction-local setting, and the change numbers are taken under a
# transaction-level advisory lock (held to the commit, so numbers commit in
# order: a sync taking the same lock never reads past a number still in flight).
PG_SEQ_LOCK = (
    "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext("
    "pg_catalog.concat(pg_catalog.current_schema(), '.flowdrop_sync_seq')))"
)


def pg_delete_triggers(kinds: bool) -> tuple[str, ...]:
    """PostgreSQL's triggers: step 2 made them (``kinds`` False), step 4 makes them
    again saying each tombstone's kind; the text of step 2 never changes."""
    columns = "id, scope, scope_id, key, seq, deleted_at" + (", kind" if kinds else "")
    kind_of = {m: (", " + _PG_KIND.format(m=m)) if kinds else "" for m in ("OLD", "m")}
    conflict = _STRONGER if kinds else "ON CONFLICT (id) DO NOTHING"
    return (
        "CREATE OR REPLACE FUNCTION flowdrop_sync_message_deleted() RETURNS trigger "
        "LANGUAGE plpgsql SET search_path FROM CURRENT AS $$ BEGIN "
        "IF coalesce(pg_catalog.current_setting('flowdrop.sync_quiet', true), '') = 'on' "
        "THEN RETURN NULL; END IF; "
        "IF NOT EXISTS (SELECT 1 FROM flowdrop_sync_replica) THEN RETURN NULL; END IF; "
        "PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext("
        "pg_catalog.concat(pg_catalog.current_schema(), '.flowdrop_sync_seq'))); "
        f"INSERT INTO flowdrop_sync_tombstones ({columns}) "
        f"SELECT OLD.id, b.scope, b.scope_id, b.key, {_NEXT_SEQ} + 1, flowdrop_now()"
        f"{kind_of['OLD']} FROM buffers AS b WHERE b.id = OLD.buffer_id {conflict}; "
        "RETURN NULL; END $$",
        "CREATE OR REPLACE FUNCTION flowdrop_sync_buffer_deleted() RETURNS trigger "
        "LANGUAGE plpgsql SET search_path FROM CURRENT AS $$ BEGIN "
        "IF coalesce(pg_catalog.current_setting('flowdrop.sync_quiet', true), '') = 'on' "
        "THEN RETURN OLD; END IF; "
        "IF NOT EXISTS (SELECT 1 FROM flowdrop_sync_replica) THEN RETURN OLD; END IF; "
        "PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext("
        "pg_catalog.concat(pg_catalog.current_schema(), '.flowdrop_sync_seq'))); "
        f"INSERT INTO flowdrop_sync_tombstones ({columns}) "
        f"SELECT m.id, OLD.scope, OLD.scope_id, OLD.key, {_NEXT_SEQ} "
        f"+ row_number() OVER (ORDER BY m.position), flowdrop_now(){kind_of['m']} "
        f"FROM messages AS m WHERE m.buffer_id = OLD.id {conflict}; "
        f"{_CONVERSATION_PUT.format(a='OLD', now=PG_STORE_CLOCK, deleted=1)}; "
        "RETURN OLD; END $$",
        _pg_conversation_changed(PG_STORE_CLOCK),
        "CREATE OR REPLACE TRIGGER flowdrop_sync_conversation_changed "
        "AFTER INSERT OR UPDATE OF title, metadata ON buffers "
        "FOR EACH ROW EXECUTE FUNCTION flowdrop_sync_conversation_changed()",
        "CREATE OR REPLACE TRIGGER flowdrop_sync_message_deleted AFTER DELETE ON messages "
        "FOR EACH ROW EXECUTE FUNCTION flowdrop_sync_message_deleted()",
        "CREATE OR REPLACE TRIGGER flowdrop_sync_buffer_deleted BEFORE DELETE ON buffers "
        "FOR EACH ROW EXECUTE FUNCTION flowdrop_sync_buffer_deleted()",
    )


def _pg_conversation_changed(recreated: str) -> str:
    """PostgreSQL's function recording a rename and a re-creation; ``recreated`` is
    the stamp a conversation made again after its deletion gets."""
    return (
        "CREATE OR REPLACE FUNCTION flowdrop_sync_conversation_changed() RETURNS trigger "
        "LANGUAGE plpgsql SET search_path FROM CURRENT AS $$ BEGIN "
        "IF coalesce(pg_catalog.current_setting('flowdrop.sync_quiet', true), '') = 'on' "
        "THEN RETURN NULL; END IF; "
        "IF NOT EXISTS (SELECT 1 FROM flowdrop_sync_replica) THEN RETURN NULL; END IF; "
        "IF TG_OP = 'INSERT' THEN "
        f"UPDATE flowdrop_sync_conversations SET deleted = 0, stamp = {recreated} "
        "WHERE scope = NEW.scope AND scope_id = NEW.scope_id AND key = NEW.key AND deleted = 1; "
        "ELSIF OLD.title IS DISTINCT FROM NEW.title OR OLD.metadata IS DISTINCT FROM NEW.metadata "
        f"THEN {_CONVERSATION_PUT.format(a='NEW', now=PG_STORE_CLOCK, deleted=0)}; "
        "END IF; RETURN NULL; END $$"
    )


SYNC_COMMON: dict[str, str] = {
    # Before a backup (sync.order.link_store): every message with no link gets one,
    # after the message before it, ranked above that message's children (rules.order
    # link_new's rule, in one statement: a row before it with no link gets one in
    # the same statement and has no children, so rank 0). Both backends read
    # what the INSERT reads before it writes (it reads its own table); ids are
    # stored alike on each (16 bytes, uuid), so one text serves both.
    "sync_link_everything": (
        "INSERT INTO flowdrop_sync_links (id, parent, rank) "
        "SELECT o.id, o.prev, coalesce((SELECT max(l.rank) + 1 FROM flowdrop_sync_links AS l "
        "WHERE l.parent = o.prev), 0) FROM (SELECT m.id, lag(m.id) OVER "
        "(PARTITION BY m.buffer_id ORDER BY m.position) AS prev FROM messages AS m) AS o "
        "WHERE NOT EXISTS (SELECT 1 FROM flowdrop_sync_links AS k WHERE k.id = o.id)"
    ),
    "sync_schema_step": "SELECT step FROM flowdrop_sync_schema",
    "sync_schema_put": (
        "INSERT INTO flowdrop_sync_schema (one, step) VALUES (1, ?) "
        "ON CONFLICT (one) DO UPDATE SET step = excluded.step"
    ),
    "sync_replica": "SELECT id FROM flowdrop_sync_replica",
    "sync_replica_put": "INSERT INTO flowdrop_sync_replica (id, created_at) VALUES (?, ?)",
    "sync_replica_drop": "DELETE FROM flowdrop_sync_replica",
    "sync_state_all": "SELECT scope, scope_id, key FROM flowdrop_sync_state",
    # What a sync's scopes leave out, counted per owner (the report says so).
    "sync_buffer_owners": "SELECT scope, scope_id, count(*) FROM buffers GROUP BY scope, scope_id",
    "sync_memory_owners": "SELECT scope, scope_id, count(*) FROM memory GROUP BY scope, scope_id",
    "sync_state_one": (
        "SELECT digest, summary FROM flowdrop_sync_state "
        "WHERE scope = ? AND scope_id = ? AND key = ?"
    ),
    "sync_state_held": (
        "SELECT ids FROM flowdrop_sync_state WHERE scope = ? AND scope_id = ? AND key = ?"
    ),
    "sync_state_put": (
        "INSERT INTO flowdrop_sync_state (scope, scope_id, key, digest, ids, summary) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, scope_id, key) "
        "DO UPDATE SET digest = excluded.digest, ids = excluded.ids, summary = excluded.summary"
    ),
    # Buffers synced once and gone now (deleted whole): a key-only walk of the state.
    # A change that is not an append at the end (engine.edited): the next sync reads
    # the buffer whole instead of trusting what it recorded.
    "sync_forget_summary": (
        "UPDATE flowdrop_sync_state SET summary = '' WHERE (scope, scope_id, key) = "
        "(SELECT scope, scope_id, key FROM buffers WHERE id = ?)"
    ),
    # Where a merge of what two sides appended starts reading: the last user turn at
    # or before the old last row (the calls after it may still be answered later).
    "sync_context_start": (  # backwards along the primary key from that row
        "SELECT position FROM messages WHERE buffer_id = ? AND position <= ? "
        "AND role = 'user' ORDER BY position DESC LIMIT 1"
    ),
    # Before a merge writes the rows after a point: the unanswered calls leave the
    # ledger (as the whole ledger does for a whole merge), so no write meets the
    # MEM-3 backstop halfway; the turns written or read declare them again.
    "sync_drop_unanswered": "DELETE FROM tool_calls WHERE buffer_id = ? AND answered_by IS NULL",
    # After a merge wrote rows: calls a newly written result answers.
    "sync_answered_refresh": (
        "UPDATE tool_calls SET answered_by = (SELECT m.id FROM messages AS m "
        "WHERE m.buffer_id = tool_calls.buffer_id AND m.tool_call_id = tool_calls.call_id) "
        "WHERE buffer_id = ? AND answered_by IS NULL"
    ),
    "sync_state_gone": (
        "SELECT s.scope, s.scope_id, s.key FROM flowdrop_sync_state AS s WHERE NOT EXISTS "
        "(SELECT 1 FROM buffers AS b WHERE b.scope = s.scope AND b.scope_id = s.scope_id "
        "AND b.key = s.key)"
    ),
    # The latest time this store finished a sync with the peer covering these scopes
    # (or everything): both held the same buffers then.
    "sync_marks": (
        "SELECT scopes, since, sync_id, kv FROM flowdrop_sync_marks "
        "WHERE peer = ? AND scopes IN (?, 'all')"
    ),
    "sync_mark_put": (
        "INSERT INTO flowdrop_sync_marks (peer, scopes, since, sync_id, kv) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (peer, scopes) DO UPDATE SET "
        "since = excluded.since, sync_id = excluded.sync_id, kv = excluded.kv"
    ),
    # The last sync that read and wrote a kind of keyed value here (memory, viewer).
    "sync_kv_clock": "SELECT kind, sync_id FROM flowdrop_sync_kv_clock",
    "sync_hlc": "SELECT stamp FROM flowdrop_sync_hlc WHERE kind = ?",
    # Conversations: what changed here (a title, metadata, a deletion), and a buffer's row.
    "sync_conversations": (
        "SELECT scope, scope_id, key, stamp, deleted FROM flowdrop_sync_conversations"
    ),
    "sync_conversation_put": (
        "INSERT INTO flowdrop_sync_conversations (scope, scope_id, key, stamp, deleted) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (scope, scope_id, key) DO UPDATE SET "
        "stamp = excluded.stamp, deleted = excluded.deleted"
    ),
    # With the time of its last message: buffers.updated_at moves at most once a
    # minute on appends, too coarse to order an append against a deletion.
    "sync_conversation_row": (
        "SELECT b.id, b.title, b.metadata, b.created_at, b.updated_at, "
        "(SELECT m.created_at FROM messages AS m WHERE m.buffer_id = b.id "
        "ORDER BY m.position DESC LIMIT 1) FROM buffers AS b "
        "WHERE b.scope = ? AND b.scope_id = ? AND b.key = ?"
    ),
    "sync_hlc_put": (
        "INSERT INTO flowdrop_sync_hlc (kind, stamp) VALUES (?, ?) "
        "ON CONFLICT (kind) DO UPDATE SET stamp = excluded.stamp"
    ),
    "sync_kv_clock_put": (
        "INSERT INTO flowdrop_sync_kv_clock (kind, sync_id) VALUES (?, ?) "
        "ON CONFLICT (kind) DO UPDATE SET sync_id = excluded.sync_id"
    ),
    # How many memory values and grants there are, and the latest local write.
    # Every stamp of a kind (its shape, sync.registers.kv_shape): any set, grant, delete or
    # revoke changes it, whatever the clock did (a memory update stamps strictly later).
    "sync_kv_stamps_memory": "SELECT scope, scope_id, key, updated_at FROM memory",
    "sync_kv_stamps_viewer": "SELECT session_id, user_id, granted_at FROM session_viewers",
    # The newest buffer stamp: a sync's mark (see SQLITE_STORE_CLOCK).
    "sync_mark_clock": f"SELECT coalesce(({NEWEST_STAMP.format(t='buffers')}), '')",
    "sync_peers_all": "SELECT peer FROM flowdrop_sync_peers",
    "sync_peer_forget": "DELETE FROM flowdrop_sync_peers WHERE peer = ?",
    "sync_ack_forget": "DELETE FROM flowdrop_sync_acks WHERE peer = ?",
    "sync_retired_all": "SELECT peer FROM flowdrop_sync_retired",
    "sync_retire": "INSERT INTO flowdrop_sync_retired (peer) VALUES (?) ON CONFLICT DO NOTHING",
    # A peer of a peer: known from now on, having received none of our tombstones
    # (unless retired: forget_peer).
    "sync_peer_adopt": (
        "INSERT INTO flowdrop_sync_peers (peer, received, synced_at) SELECT ?, 0, ? "
        "WHERE NOT EXISTS (SELECT 1 FROM flowdrop_sync_retired WHERE peer = ?) "
        "ON CONFLICT (peer) DO NOTHING"
    ),
    "sync_version_put": (
        "INSERT INTO flowdrop_sync_versions (id, fingerprint, generation) VALUES (?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET fingerprint = excluded.fingerprint, "
        "generation = excluded.generation"
    ),
    "sync_state_drop": (
        "DELETE FROM flowdrop_sync_state WHERE scope = ? AND scope_id = ? AND key = ?"
    ),
    "sync_tombstone_put": (
        "INSERT INTO flowdrop_sync_tombstones (id, scope, scope_id, key, seq, deleted_at, kind) "
        f"VALUES (?, ?, ?, ?, ?, ?, ?) {_STRONGER}"
    ),
    "sync_tombstones_after": (
        "SELECT id, scope, scope_id, key, seq, deleted_at, kind FROM flowdrop_sync_tombstones "
        "WHERE seq > ? ORDER BY seq"
    ),
    "sync_tombstone_ids": "SELECT id FROM flowdrop_sync_tombstones",
    # The sequence never goes back below a mark a peer holds, compacted or not.
    "sync_last_seq": (
        "SELECT coalesce(max(n), 0) FROM (SELECT seq AS n FROM flowdrop_sync_tombstones "
        "UNION ALL SELECT acked AS n FROM flowdrop_sync_acks) AS s"
    ),
    "sync_ack_put": (
        "INSERT INTO flowdrop_sync_acks (peer, acked) VALUES (?, ?) "
        "ON CONFLICT (peer) DO UPDATE SET acked = excluded.acked"
    ),
    "sync_compact_floor": (
        "SELECT min(coalesce(k.acked, 0)) FROM flowdrop_sync_peers AS p "
        "LEFT JOIN flowdrop_sync_acks AS k ON k.peer = p.peer"
    ),
    "sync_compact": "DELETE FROM flowdrop_sync_tombstones WHERE seq <= ?",
    "sync_peer": "SELECT received FROM flowdrop_sync_peers WHERE peer = ?",
    "sync_peer_put": (
        "INSERT INTO flowdrop_sync_peers (peer, received, synced_at) VALUES (?, ?, ?) "
        "ON CONFLICT (peer) DO UPDATE SET received = excluded.received, "
        "synced_at = excluded.synced_at"
    ),
    "sync_conflict_put": (
        "INSERT INTO flowdrop_sync_conflicts (dropped_id, version, rule, scope, scope_id, key, "
        "call_id, kept_id, message, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (dropped_id, version) DO NOTHING"
    ),
    "sync_kv_state": "SELECT k1, k2, k3 FROM flowdrop_sync_kv_state WHERE kind = ?",
    "sync_kv_state_put": (
        "INSERT INTO flowdrop_sync_kv_state (kind, k1, k2, k3) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (kind, k1, k2, k3) DO NOTHING"
    ),
    "sync_kv_state_drop": (
        "DELETE FROM flowdrop_sync_kv_state WHERE kind = ? AND k1 = ? AND k2 = ? AND k3 = ?"
    ),
    "sync_kv_state_forget": "DELETE FROM flowdrop_sync_kv_state WHERE kind = ? AND k1 = ?",
    "sync_kv_tombstones": (
        "SELECT k1, k2, k3, deleted_at FROM flowdrop_sync_kv_tombstones WHERE kind = ?"
    ),
    "sync_kv_tombstone_put": (
        "INSERT INTO flowdrop_sync_kv_tombstones (kind, k1, k2, k3, deleted_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (kind, k1, k2, k3) "
        "DO UPDATE SET deleted_at = excluded.deleted_at"
    ),
    "sync_kv_tombstone_drop": (
        "DELETE FROM flowdrop_sync_kv_tombstones WHERE kind = ? AND k1 = ? AND k2 = ? AND k3 = ?"
    ),
    "sync_session_update": (
        "UPDATE sessions SET workflow_id = ?, name = ?, owner_id = ?, status = ?, "
        "conversation = ?, metadata = ?, created_at = ?, updated_at = ? WHERE id = ?"
    ),
    "sync_conflicts": (
        "SELECT dropped_id, rule, scope, scope_id, key, call_id, kept_id, message, recorded_at "
        "FROM flowdrop_sync_conflicts ORDER BY recorded_at, dropped_id"
    ),
    # Every record, as sync_conflict_put takes it (conflicts travel to every replica).
    "sync_conflicts_all": (
        "SELECT dropped_id, version, rule, scope, scope_id, key, call_id, kept_id, message, "
        "recorded_at FROM flowdrop_sync_conflicts"
    ),
}


def content_md5(content: str, metadata: str, parts: int) -> str:
    """A message's fingerprint: PostgreSQL's ``md5(content || chr(31) || metadata ||
    chr(31) || content_parts::text)``, so two backends compare alike."""
    text = f"{content}\x1f{metadata}\x1f{parts}"
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def adopt_copy(source: Any, target: Any, *, register: bool) -> None:
    """Make a fresh copy (``backup``) a replica of its own, known to its source.

    The copy gets a new replica id, and each side records the other as a peer: the
    copy has received every tombstone the source had (its mark of the source is the
    source's last number, and the source holds every tombstone the copy holds so far).
    The source records the copy as a peer that has received none of its tombstones,
    so it compacts none until the copy has synced everything with it: a copy left
    unsynced can never bring back a message deleted and compacted here. ``register``
    false (a source open read-only) skips the source's record; the copy stays a peer
    the source learns of at their first sync. The copy's sync state and tombstones
    are the original's, and true of the copy too."""
    found = target.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'flowdrop_sync_replica'"
    ).fetchone()
    if not found:
        return
    row = target.execute("SELECT id FROM flowdrop_sync_replica").fetchone()
    last = target.execute(SYNC_COMMON["sync_last_seq"]).fetchone()[0]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    copy_id = str(uuid.uuid4())
    target.execute("DELETE FROM flowdrop_sync_replica")
    target.execute(SYNC_COMMON["sync_replica_put"], (copy_id, now))
    if row is not None:
        target.execute(SYNC_COMMON["sync_peer_put"], (row[0], last, now))
        target.execute(SYNC_COMMON["sync_ack_put"], (row[0], last))
    target.commit()
    if register and row is not None:
        source.execute("BEGIN IMMEDIATE")
        try:
            source.execute(
                "INSERT INTO flowdrop_sync_peers (peer, received, synced_at) VALUES (?, 0, ?) "
                "ON CONFLICT (peer) DO NOTHING",
                (copy_id, now),
            )
            source.execute("COMMIT")
        except BaseException:
            source.execute("ROLLBACK")
            raise

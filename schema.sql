-- flowdrop_local schema, version 3.
--
-- This file is the only definition of the schema. The library applies it with
-- executescript() when it creates a database, and never restates it in Python;
-- later changes are numbered migration steps (flowdrop_local/_schema.py).
--
-- Storage model
--   buffers     one row per conversation buffer, addressed by (scope, scope_id, key).
--   messages    one row per message, stored clustered on (buffer_id, position): a
--               buffer's messages sit together in position order, so reading the
--               last N touches a few pages, and an append writes one table page
--               and one page of the id index (version 3). Order is the fractional
--               `position` key (rocicorp fractional-indexing format, compared
--               under BINARY), so a row can be placed between two others without
--               renumbering.
--   tool_calls  the ledger of declared tool calls: one row per declaration (a
--               call id a turn declares), written in the same transaction as the
--               message. Healing (MEM-3) reads the unanswered calls from its
--               partial index instead of scanning the history.
--
-- Message ids are UUIDs (version 7 for the ones the library makes), stored as
-- their 16 bytes; the API, export and import use the text form.
--
-- A buffer's message count (MEM-14) is the `tally` of its last message by
-- position: an append writes it on the row it inserts anyway, so counting costs
-- no page of its own; the delete trigger below keeps it on the last row. Only the
-- last row's tally means anything. A writer that inserts behind the library must
-- set it (flowdrop-local check reports a wrong count).
--
-- Search (opt-in, not part of this file): a WITHOUT ROWID table has no integer
-- rowid for an FTS5 external-content index, so a search index keeps its own
-- table of text keyed by an integer, with the message id beside it.

CREATE TABLE buffers (
    id            INTEGER PRIMARY KEY,
    scope         TEXT NOT NULL,
    scope_id      TEXT NOT NULL,
    key           TEXT NOT NULL,
    -- What the application names and keeps on a conversation.
    title         TEXT NOT NULL DEFAULT '',
    metadata      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata) AND json_type(metadata) = 'object'),
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- The time of the last append, coarse: written at most once a minute, so an
    -- append does not write this row (and the recency index) every time.
    updated_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- Backstop for MEM-6/MEM-13: an identity scope never degrades to a shared bucket.
    CHECK (scope NOT IN ('user', 'session') OR trim(scope_id) NOT IN ('', '0')),
    UNIQUE (scope, scope_id, key)
) STRICT;

-- Conversations most recently updated first.
CREATE INDEX buffers_recent ON buffers (updated_at, id);

CREATE TABLE messages (
    buffer_id     INTEGER NOT NULL REFERENCES buffers (id) ON DELETE CASCADE,
    -- STRICT TEXT: a key such as '10' is never turned into a number, and the
    -- GLOBs keep it to the base-62 alphabet with a letter head.
    position      TEXT NOT NULL CHECK (
                      length(position) >= 2
                      AND position GLOB '[a-zA-Z]*'
                      AND position NOT GLOB '*[^0-9A-Za-z]*'),
    id            BLOB NOT NULL UNIQUE CHECK (length(id) = 16),
    role          TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    -- Plain text, or (content_parts = 1) a JSON array of content parts kept as sent.
    content       TEXT NOT NULL,
    -- json_type() refuses malformed JSON by raising, so it checks validity too.
    content_parts INTEGER NOT NULL DEFAULT 0 CHECK (
                      content_parts = 0 OR (content_parts = 1 AND json_type(content) = 'array')),
    -- Tool data lives here: metadata.tool_calls on an assistant turn,
    -- metadata.tool_call_id (and healed) on a tool result.
    metadata      TEXT NOT NULL DEFAULT '{}' CHECK (json_type(metadata) = 'object'),
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- The buffer's message count, exact on its last row (see above).
    tally         INTEGER NOT NULL DEFAULT 0,
    -- The call a tool result answers; indexed below for MEM-1 and MEM-10 look-ups.
    tool_call_id  TEXT GENERATED ALWAYS AS (
                      CASE WHEN role = 'tool' THEN json_extract(metadata, '$.tool_call_id') END) VIRTUAL,
    healed        INTEGER GENERATED ALWAYS AS (
                      coalesce(json_type(metadata, '$.healed') = 'true', 0)) VIRTUAL,
    PRIMARY KEY (buffer_id, position)
) STRICT, WITHOUT ROWID;

-- MEM-1: at most one result per call id in a buffer; also the look-up that finds
-- the result (or healed placeholder) standing for a call.
CREATE UNIQUE INDEX messages_tool_result ON messages (buffer_id, tool_call_id)
    WHERE tool_call_id IS NOT NULL;

CREATE TABLE tool_calls (
    buffer_id   INTEGER NOT NULL REFERENCES buffers (id) ON DELETE CASCADE,
    call_id     TEXT NOT NULL,
    -- A turn declaring the id. When several do (MEM-2 keeps a turn that declares
    -- one new id next to known ones), the first by position owns the pairing: its
    -- placeholder goes after it. One row each, so deleting the first hands the
    -- call to the next instead of forgetting it.
    declared_by BLOB NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    ordinal     INTEGER NOT NULL CHECK (ordinal >= 0),
    -- The tool message answering the call, wherever it stands (the same on every
    -- row of the id); NULL while unanswered.
    answered_by BLOB REFERENCES messages (id) ON DELETE SET NULL,
    PRIMARY KEY (buffer_id, call_id, declared_by)
) STRICT, WITHOUT ROWID;

-- Healing reads a buffer's unanswered calls from this index alone (MEM-3).
CREATE INDEX tool_calls_unanswered ON tool_calls (buffer_id) WHERE answered_by IS NULL;
-- Serve the foreign keys' ON DELETE actions without scanning the ledger.
CREATE INDEX tool_calls_declared_by ON tool_calls (declared_by);
CREATE INDEX tool_calls_answered_by ON tool_calls (answered_by) WHERE answered_by IS NOT NULL;

-- A deletion keeps the count on the last row: the deleted row's tally, less one,
-- when it was the last; else the last row's, less one. So no writer can make the
-- count wrong by deleting (an insert behind the library must set the tally).
CREATE TRIGGER messages_tally_delete AFTER DELETE ON messages
BEGIN
    UPDATE messages SET tally = CASE WHEN OLD.position > position THEN OLD.tally ELSE tally END - 1
    WHERE buffer_id = OLD.buffer_id
      AND position = (SELECT max(position) FROM messages WHERE buffer_id = OLD.buffer_id);
END;

-- Backstop for MEM-3: a writer that bypasses the library but keeps the ledger
-- cannot store a user turn while a call of its buffer is unanswered.
CREATE TRIGGER messages_user_needs_answered_calls BEFORE INSERT ON messages
WHEN NEW.role = 'user'
    -- INDEXED BY: without statistics the planner would walk the primary key, every
    -- declared call of the buffer, on each user insert.
    AND EXISTS (SELECT 1 FROM tool_calls INDEXED BY tool_calls_unanswered
                WHERE buffer_id = NEW.buffer_id AND answered_by IS NULL)
BEGIN
    SELECT RAISE(ABORT, 'MEM-3: a user message cannot follow an unanswered tool call; append it through flowdrop_local, which heals the call first');
END;

-- A row keeps its buffer, position, id and role for life: placing a message
-- between two others never renumbers anything.
CREATE TRIGGER messages_place_is_fixed BEFORE UPDATE OF buffer_id, position, id, role ON messages
BEGIN
    SELECT RAISE(ABORT, 'a message keeps its buffer, position, id and role');
END;

-- Identity scopes and sessions (since version 2; MEM-6 to MEM-9, MEM-13, MEM-15).
--   memory           key-value memory, in the same (scope, scope_id) slots as buffers.
--   sessions         one row per session; its conversation is the buffer
--                    ('session', sessions.id, 'conversation-<n>').
--   session_viewers  the users an owner (or an admin) let read a session.
-- Whether an identity is usable is decided in Python (flowdrop_local/access.py);
-- the CHECKs and the trigger below only stop the two spellings of the shared bucket
-- ('' and '0') from reaching an identity slot through a writer that bypasses it.

CREATE TABLE memory (
    scope       TEXT NOT NULL,
    scope_id    TEXT NOT NULL,
    key         TEXT NOT NULL,
    -- Any JSON value, stored as its text; read back with json.loads.
    value       TEXT NOT NULL CHECK (json_valid(value)),
    created_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- Backstop for MEM-6/MEM-13: an identity scope never degrades to a shared bucket.
    CHECK (scope NOT IN ('user', 'session') OR trim(scope_id) NOT IN ('', '0')),
    PRIMARY KEY (scope, scope_id, key)
) STRICT, WITHOUT ROWID;

CREATE TABLE sessions (
    -- A UUID (version 7, time-ordered), so ids are unguessable and index in order.
    id            TEXT PRIMARY KEY CHECK (length(id) = 36),
    workflow_id   TEXT NOT NULL CHECK (length(trim(workflow_id)) > 0),
    name          TEXT NOT NULL DEFAULT '',
    -- The canonical usable user id; NULL when the session is owned by nobody, which
    -- matches nobody, an absent caller included (MEM-9). Never '' or '0'.
    owner_id      TEXT CHECK (owner_id IS NULL OR trim(owner_id) NOT IN ('', '0')),
    -- 'stopped' accepts no turn until resumed.
    status        TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'stopped')),
    -- Number of resets: the current conversation is buffer key 'conversation-<n>'.
    -- A reset increments it, so older conversations stay stored (MEM-15).
    conversation  INTEGER NOT NULL DEFAULT 0 CHECK (conversation >= 0),
    metadata      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata) AND json_type(metadata) = 'object'),
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;

-- Listing a user's sessions reads their owned rows from here, in creation order.
CREATE INDEX sessions_owner ON sessions (owner_id, created_at) WHERE owner_id IS NOT NULL;

CREATE TABLE session_viewers (
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    user_id     TEXT NOT NULL CHECK (trim(user_id) NOT IN ('', '0')),
    granted_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (session_id, user_id)
) STRICT, WITHOUT ROWID;

-- Listing the sessions shared with a user.
CREATE INDEX session_viewers_user ON session_viewers (user_id);

PRAGMA application_id = 1178881107;  -- 0x46444C53, 'FDLS'
PRAGMA user_version = 3;

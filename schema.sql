-- flowdrop_local schema, version 1.
--
-- This file is the only definition of the schema. The library applies it with
-- executescript() when it creates a database, and never restates it in Python;
-- later changes are numbered migration steps (flowdrop_local/_schema.py).
--
-- Storage model
--   buffers     one row per conversation buffer, addressed by (scope, scope_id, key).
--   messages    one row per message. Order is the fractional `position` key
--               (rocicorp fractional-indexing format, compared under BINARY), so a
--               row can be placed between two others without renumbering.
--   tool_calls  the ledger of declared tool calls: one row per call id per buffer,
--               written in the same transaction as the message that declares it.
--               Healing (MEM-3) reads the unanswered calls from its partial index
--               instead of scanning the history.

CREATE TABLE buffers (
    id            INTEGER PRIMARY KEY,
    scope         TEXT NOT NULL,
    scope_id      TEXT NOT NULL,
    key           TEXT NOT NULL,
    -- Kept by the triggers below, so that an append reports its count (MEM-14)
    -- without counting the buffer.
    message_count INTEGER NOT NULL DEFAULT 0 CHECK (message_count >= 0),
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (scope, scope_id, key)
) STRICT;

CREATE TABLE messages (
    id            TEXT PRIMARY KEY CHECK (length(id) = 36),
    buffer_id     INTEGER NOT NULL REFERENCES buffers (id) ON DELETE CASCADE,
    -- STRICT TEXT: a key such as '10' is never turned into a number, and the
    -- GLOBs keep it to the base-62 alphabet with a letter head.
    position      TEXT NOT NULL CHECK (
                      length(position) >= 2
                      AND position GLOB '[a-zA-Z]*'
                      AND position NOT GLOB '*[^0-9A-Za-z]*'),
    role          TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    -- Plain text, or (content_parts = 1) a JSON array of content parts kept as sent.
    content       TEXT NOT NULL,
    content_parts INTEGER NOT NULL DEFAULT 0 CHECK (
                      content_parts = 0
                      OR (content_parts = 1 AND json_valid(content) AND json_type(content) = 'array')),
    -- Tool data lives here: metadata.tool_calls on an assistant turn,
    -- metadata.tool_call_id (and healed) on a tool result.
    metadata      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata) AND json_type(metadata) = 'object'),
    created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- The call a tool result answers; indexed below for MEM-1 and MEM-10 look-ups.
    tool_call_id  TEXT GENERATED ALWAYS AS (
                      CASE WHEN role = 'tool' THEN json_extract(metadata, '$.tool_call_id') END) VIRTUAL,
    healed        INTEGER GENERATED ALWAYS AS (
                      coalesce(json_type(metadata, '$.healed') = 'true', 0)) VIRTUAL,
    UNIQUE (buffer_id, position)
) STRICT;

-- MEM-1: at most one result per call id in a buffer; also the look-up that finds
-- the result (or healed placeholder) standing for a call.
CREATE UNIQUE INDEX messages_tool_result ON messages (buffer_id, tool_call_id)
    WHERE tool_call_id IS NOT NULL;

CREATE TABLE tool_calls (
    buffer_id   INTEGER NOT NULL REFERENCES buffers (id) ON DELETE CASCADE,
    call_id     TEXT NOT NULL,
    -- The first turn that declared the id owns the pairing (MEM-2, MEM-5).
    declared_by TEXT NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    ordinal     INTEGER NOT NULL CHECK (ordinal >= 0),
    -- The tool message answering the call, wherever it stands; NULL while unanswered.
    answered_by TEXT REFERENCES messages (id) ON DELETE SET NULL,
    PRIMARY KEY (buffer_id, call_id)
) STRICT, WITHOUT ROWID;

-- Healing reads a buffer's unanswered calls from this index alone (MEM-3).
CREATE INDEX tool_calls_unanswered ON tool_calls (buffer_id) WHERE answered_by IS NULL;
-- Serve the foreign keys' ON DELETE actions without scanning the ledger.
CREATE INDEX tool_calls_declared_by ON tool_calls (declared_by);
CREATE INDEX tool_calls_answered_by ON tool_calls (answered_by) WHERE answered_by IS NOT NULL;

CREATE TRIGGER messages_count_insert AFTER INSERT ON messages
BEGIN
    UPDATE buffers SET message_count = message_count + 1 WHERE id = NEW.buffer_id;
END;

CREATE TRIGGER messages_count_delete AFTER DELETE ON messages
BEGIN
    UPDATE buffers SET message_count = message_count - 1 WHERE id = OLD.buffer_id;
END;

-- Backstop for MEM-3: a writer that bypasses the library but keeps the ledger
-- cannot store a user turn while a call of its buffer is unanswered.
CREATE TRIGGER messages_user_needs_answered_calls BEFORE INSERT ON messages
WHEN NEW.role = 'user'
    AND EXISTS (SELECT 1 FROM tool_calls WHERE buffer_id = NEW.buffer_id AND answered_by IS NULL)
BEGIN
    SELECT RAISE(ABORT, 'MEM-3: a user message cannot follow an unanswered tool call; append it through flowdrop_local, which heals the call first');
END;

-- A row keeps its buffer, position and role for life: placing a message between
-- two others never renumbers anything.
CREATE TRIGGER messages_place_is_fixed BEFORE UPDATE OF buffer_id, position, role ON messages
BEGIN
    SELECT RAISE(ABORT, 'a message keeps its buffer, position and role');
END;

PRAGMA application_id = 1178881107;  -- 0x46444C53, 'FDLS'
PRAGMA user_version = 1;

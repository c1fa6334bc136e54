-- flowdrop_local PostgreSQL schema, version 3.
--
-- The only definition of the PostgreSQL schema (schema.sql is SQLite's). It
-- declares the same tables, columns and checks as schema.sql, with these
-- differences (tests/test_postgresql_schema.py holds both against each other):
--   * flowdrop_meta holds what SQLite keeps in PRAGMA application_id/user_version;
--   * messages is keyed by (buffer_id, id) and the ledger references messages
--     through (buffer_id, ...): every key includes the buffer, the distribution
--     column a sharded deployment (Citus) would use; messages.id stays unique
--     through its own index;
--   * positions use COLLATE "C", which orders keys byte by byte as SQLite's
--     BINARY does;
--   * JSON lives in text columns (kept byte-exact, as on SQLite) and is checked
--     with jsonb; generated columns are STORED (PostgreSQL has no VIRTUAL);
--   * triggers are PL/pgSQL functions; the identity-scope backstop of buffers is
--     a CHECK;
--   * every function pins its search_path (pg_catalog, this schema, pg_temp: the
--     DO block at the end) and schema-qualifies the built-ins a user's overload
--     could take over, so it runs the same for every client (issue 21 A).

CREATE TABLE flowdrop_meta (
    name  text PRIMARY KEY,
    value text NOT NULL
);

CREATE FUNCTION flowdrop_now() RETURNS text LANGUAGE sql STABLE AS
$$ SELECT pg_catalog.to_char(pg_catalog.clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') $$;

CREATE TABLE buffers (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope         text NOT NULL,
    scope_id      text NOT NULL,
    key           text NOT NULL,
    title         text NOT NULL DEFAULT '',
    metadata      text NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata::jsonb) = 'object'),
    created_at    text NOT NULL DEFAULT flowdrop_now(),
    -- The last append's time, written at most once a minute (as on SQLite).
    updated_at    text NOT NULL DEFAULT flowdrop_now(),
    -- Backstop for MEM-6/MEM-13: an identity scope never degrades to a shared bucket.
    CHECK (scope NOT IN ('user', 'session') OR btrim(scope_id) NOT IN ('', '0')),
    UNIQUE (scope, scope_id, key)
);

CREATE INDEX buffers_recent ON buffers (updated_at, id);

CREATE TABLE messages (
    buffer_id     bigint NOT NULL REFERENCES buffers (id) ON DELETE CASCADE,
    position      text COLLATE "C" NOT NULL CHECK (
                      length(position) >= 2 AND position ~ '^[a-zA-Z][0-9A-Za-z]*$'),
    id            text NOT NULL CHECK (length(id) = 36),
    role          text NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content       text NOT NULL,
    content_parts integer NOT NULL DEFAULT 0 CHECK (
                      content_parts = 0
                      OR (content_parts = 1 AND jsonb_typeof(content::jsonb) = 'array')),
    metadata      text NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata::jsonb) = 'object'),
    created_at    text NOT NULL DEFAULT flowdrop_now(),
    -- The buffer's message count, exact on its last row by position (as on SQLite):
    -- an append writes it on the row it inserts, not on the buffer's row.
    tally         bigint NOT NULL DEFAULT 0,
    tool_call_id  text GENERATED ALWAYS AS (
                      CASE WHEN role = 'tool' THEN metadata::jsonb ->> 'tool_call_id' END) STORED,
    healed        integer GENERATED ALWAYS AS (
                      CASE WHEN metadata::jsonb -> 'healed' = 'true'::jsonb THEN 1 ELSE 0 END) STORED,
    PRIMARY KEY (buffer_id, id),
    UNIQUE (buffer_id, position)
);

-- A message id names one message in the whole database (admin look-ups by id).
CREATE UNIQUE INDEX messages_id ON messages (id);
-- MEM-1: at most one result per call id in a buffer.
CREATE UNIQUE INDEX messages_tool_result ON messages (buffer_id, tool_call_id)
    WHERE tool_call_id IS NOT NULL;

CREATE TABLE tool_calls (
    buffer_id   bigint NOT NULL REFERENCES buffers (id) ON DELETE CASCADE,
    call_id     text NOT NULL,
    declared_by text NOT NULL,
    ordinal     integer NOT NULL CHECK (ordinal >= 0),
    answered_by text,
    PRIMARY KEY (buffer_id, call_id, declared_by),
    FOREIGN KEY (buffer_id, declared_by) REFERENCES messages (buffer_id, id) ON DELETE CASCADE,
    FOREIGN KEY (buffer_id, answered_by) REFERENCES messages (buffer_id, id)
        ON DELETE SET NULL (answered_by)
);

-- Healing reads a buffer's unanswered calls from this index alone (MEM-3).
CREATE INDEX tool_calls_unanswered ON tool_calls (buffer_id) WHERE answered_by IS NULL;
-- Serve the foreign keys' ON DELETE actions without scanning the ledger.
CREATE INDEX tool_calls_declared_by ON tool_calls (buffer_id, declared_by);
CREATE INDEX tool_calls_answered_by ON tool_calls (buffer_id, answered_by)
    WHERE answered_by IS NOT NULL;

-- A deletion keeps the count on the last row (as schema.sql's trigger does): for
-- each buffer, the old count (the tally of the old last row, deleted or not) less
-- the rows deleted.
CREATE FUNCTION flowdrop_tally_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE messages AS m
    SET tally = CASE WHEN gone.last_position > m.position THEN gone.last_tally ELSE m.tally END
                - gone.n
    FROM (SELECT buffer_id, pg_catalog.count(*) AS n, pg_catalog.max(position) AS last_position,
                 (pg_catalog.array_agg(tally ORDER BY position DESC))[1] AS last_tally
          FROM deleted GROUP BY buffer_id) AS gone
    WHERE m.buffer_id = gone.buffer_id
      AND m.position = (SELECT pg_catalog.max(position) FROM messages
                        WHERE buffer_id = gone.buffer_id);
    RETURN NULL;
END $$;

CREATE TRIGGER messages_tally_delete AFTER DELETE ON messages
    REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT
    EXECUTE FUNCTION flowdrop_tally_deleted();

-- Backstop for MEM-3: a writer that bypasses the library but keeps the ledger
-- cannot store a user turn while a call of its buffer is unanswered.
CREATE FUNCTION flowdrop_user_needs_answered_calls() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM tool_calls
               WHERE buffer_id = NEW.buffer_id AND answered_by IS NULL) THEN
        RAISE EXCEPTION 'MEM-3: a user message cannot follow an unanswered tool call; append it through flowdrop_local, which heals the call first'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER messages_user_needs_answered_calls BEFORE INSERT ON messages
    FOR EACH ROW WHEN (NEW.role = 'user')
    EXECUTE FUNCTION flowdrop_user_needs_answered_calls();

-- A row keeps its buffer, position, id and role for life.
CREATE FUNCTION flowdrop_place_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a message keeps its buffer, position, id and role'
        USING ERRCODE = 'integrity_constraint_violation';
END $$;

CREATE TRIGGER messages_place_is_fixed BEFORE UPDATE OF buffer_id, position, id, role ON messages
    FOR EACH ROW EXECUTE FUNCTION flowdrop_place_is_fixed();

CREATE TABLE memory (
    scope       text NOT NULL,
    scope_id    text NOT NULL,
    key         text NOT NULL,
    value       text NOT NULL CHECK (value::jsonb IS NOT NULL),
    created_at  text NOT NULL DEFAULT flowdrop_now(),
    updated_at  text NOT NULL DEFAULT flowdrop_now(),
    CHECK (scope NOT IN ('user', 'session') OR btrim(scope_id) NOT IN ('', '0')),
    PRIMARY KEY (scope, scope_id, key)
);

CREATE TABLE sessions (
    id            text PRIMARY KEY CHECK (length(id) = 36),
    workflow_id   text NOT NULL CHECK (length(btrim(workflow_id)) > 0),
    name          text NOT NULL DEFAULT '',
    owner_id      text CHECK (owner_id IS NULL OR btrim(owner_id) NOT IN ('', '0')),
    status        text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'stopped')),
    conversation  integer NOT NULL DEFAULT 0 CHECK (conversation >= 0),
    metadata      text NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata::jsonb) = 'object'),
    created_at    text NOT NULL DEFAULT flowdrop_now(),
    updated_at    text NOT NULL DEFAULT flowdrop_now()
);

CREATE INDEX sessions_owner ON sessions (owner_id, created_at) WHERE owner_id IS NOT NULL;

CREATE TABLE session_viewers (
    session_id  text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    user_id     text NOT NULL CHECK (btrim(user_id) NOT IN ('', '0')),
    granted_at  text NOT NULL DEFAULT flowdrop_now(),
    PRIMARY KEY (session_id, user_id)
);

CREATE INDEX session_viewers_user ON session_viewers (user_id);

INSERT INTO flowdrop_meta (name, value) VALUES
    ('application_id', '1178881107'),  -- 0x46444C53, 'FDLS', as in schema.sql
    ('schema_version', '3');

-- Each function resolves names in pg_catalog first, then this schema, whichever
-- client's statement fires it (postgresql_trust.py; refresh_statements does the
-- same for a store made before this).
DO $$
DECLARE
    path text := 'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp';
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['flowdrop_now()', 'flowdrop_tally_deleted()',
                             'flowdrop_user_needs_answered_calls()', 'flowdrop_place_is_fixed()'] LOOP
        EXECUTE 'ALTER FUNCTION ' || f || ' SET search_path = ' || path;
    END LOOP;
END $$;

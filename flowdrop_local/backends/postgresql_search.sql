-- flowdrop_local search index (PostgreSQL), opt-in: Store.enable_search() creates it.
--
-- One row per message with text: its tsvector ('simple' configuration: words as
-- written, lower-cased, no stemming, any language), under a GIN index. The
-- triggers keep it in the same transaction as the write to messages; the foreign
-- key removes a deleted message's row. Only text is indexed: a string content, or
-- the "text" of the parts typed text, input_text or output_text.
-- The schema check accepts exactly these objects (backends/postgresql.py); every
-- function pins its search_path and qualifies its built-ins (issue 21 A).

CREATE FUNCTION flowdrop_message_text(content text, content_parts integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN content_parts = 0 THEN content ELSE coalesce(
        (SELECT pg_catalog.string_agg(part ->> 'text', ' ')
         FROM pg_catalog.jsonb_array_elements(content::jsonb) AS part
         WHERE pg_catalog.jsonb_typeof(part) = 'object'
           AND part ->> 'type' IN ('text', 'input_text', 'output_text')
           AND pg_catalog.jsonb_typeof(part -> 'text') = 'string'), '') END
$$;

CREATE TABLE message_search (
    message_id  text PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    buffer_id   bigint NOT NULL,
    document    tsvector NOT NULL
);

CREATE INDEX message_search_document ON message_search USING gin (document);

CREATE FUNCTION flowdrop_search_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO message_search (message_id, buffer_id, document)
    SELECT id, buffer_id, pg_catalog.to_tsvector('pg_catalog.simple', body)
    FROM (SELECT id, buffer_id, flowdrop_message_text(content, content_parts) AS body
          FROM added) AS t
    WHERE body <> '';
    RETURN NULL;
END $$;

CREATE TRIGGER messages_search_insert AFTER INSERT ON messages
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT
    EXECUTE FUNCTION flowdrop_search_added();

-- A placeholder replaced by its real result (MEM-10), or an admin's edit.
CREATE FUNCTION flowdrop_search_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM message_search WHERE message_id = OLD.id;
    INSERT INTO message_search (message_id, buffer_id, document)
    SELECT NEW.id, NEW.buffer_id, pg_catalog.to_tsvector('pg_catalog.simple', body)
    FROM (SELECT flowdrop_message_text(NEW.content, NEW.content_parts) AS body) AS t
    WHERE body <> '';
    RETURN NULL;
END $$;

CREATE TRIGGER messages_search_update AFTER UPDATE OF content, content_parts ON messages
    FOR EACH ROW EXECUTE FUNCTION flowdrop_search_changed();

-- As postgresql.sql's functions: pg_catalog first, then this schema.
DO $$
DECLARE
    path text := 'pg_catalog, ' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp';
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['flowdrop_message_text(text, integer)', 'flowdrop_search_added()',
                             'flowdrop_search_changed()'] LOOP
        EXECUTE 'ALTER FUNCTION ' || f || ' SET search_path = ' || path;
    END LOOP;
END $$;

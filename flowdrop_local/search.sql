-- flowdrop_local search index (SQLite), opt-in: Store.enable_search() creates it.
--
-- messages is WITHOUT ROWID, and an FTS5 table needs an integer rowid: the text of
-- each message is kept in message_search_text under an integer id, beside the
-- message's id, and message_search indexes it (external content). The triggers
-- keep both in the same transaction as the write to messages, so a committed
-- message is always findable and a rolled-back one never. Only text is indexed:
-- a string content, or the "text" of the parts typed text, input_text or
-- output_text; JSON keys and other parts are not. A message without text has no row.
-- The schema check accepts exactly these objects (flowdrop_local/_schema.py).

CREATE TABLE message_search_text (
    id          INTEGER PRIMARY KEY,
    message_id  BLOB NOT NULL UNIQUE,
    body        TEXT NOT NULL
) STRICT;

CREATE VIRTUAL TABLE message_search USING fts5 (
    body, content = 'message_search_text', content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);

CREATE TRIGGER messages_search_insert AFTER INSERT ON messages
BEGIN
    INSERT INTO message_search_text (message_id, body)
    SELECT NEW.id, body FROM (SELECT CASE WHEN NEW.content_parts = 0 THEN NEW.content ELSE
        coalesce((SELECT group_concat(json_extract(value, '$.text'), ' ') FROM json_each(NEW.content)
                  WHERE json_type(value) = 'object'
                    AND json_extract(value, '$.type') IN ('text', 'input_text', 'output_text')
                    AND json_type(value, '$.text') = 'text'), '') END AS body)
    WHERE body <> '';
    INSERT INTO message_search (rowid, body)
    SELECT id, body FROM message_search_text WHERE message_id = NEW.id;
END;

CREATE TRIGGER messages_search_delete AFTER DELETE ON messages
BEGIN
    INSERT INTO message_search (message_search, rowid, body)
    SELECT 'delete', id, body FROM message_search_text WHERE message_id = OLD.id;
    DELETE FROM message_search_text WHERE message_id = OLD.id;
END;

-- A placeholder replaced by its real result (MEM-10), or an admin's edit.
CREATE TRIGGER messages_search_update AFTER UPDATE OF content, content_parts ON messages
BEGIN
    INSERT INTO message_search (message_search, rowid, body)
    SELECT 'delete', id, body FROM message_search_text WHERE message_id = OLD.id;
    DELETE FROM message_search_text WHERE message_id = OLD.id;
    INSERT INTO message_search_text (message_id, body)
    SELECT NEW.id, body FROM (SELECT CASE WHEN NEW.content_parts = 0 THEN NEW.content ELSE
        coalesce((SELECT group_concat(json_extract(value, '$.text'), ' ') FROM json_each(NEW.content)
                  WHERE json_type(value) = 'object'
                    AND json_extract(value, '$.type') IN ('text', 'input_text', 'output_text')
                    AND json_type(value, '$.text') = 'text'), '') END AS body)
    WHERE body <> '';
    INSERT INTO message_search (rowid, body)
    SELECT id, body FROM message_search_text WHERE message_id = NEW.id;
END;

"""Creating, recognising and upgrading a flowdrop_local database file.

``schema.sql`` (top level of the repository, shipped inside the wheel as
``flowdrop_local/schema.sql``) is the only definition of the schema. A fresh file
gets it whole; an older file is brought forward by the numbered steps in
``MIGRATIONS``, all in one transaction. The version lives in ``PRAGMA
user_version`` and the file is marked with ``PRAGMA application_id``.

Every open also compares the file's ``sqlite_master`` with the schema schema.sql
makes (``verify_schema``), before any statement of the library runs: a file is
untrusted input, and a trigger or index someone added (or one of ours they
changed) would otherwise run its SQL inside the library's own transactions. The
user's own views are allowed (``schema_problems`` says why).
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from functools import cache
from importlib import resources
from pathlib import Path

from ._ids import id_blob
from .errors import NotADatabase, NotAFlowdropDatabase, SchemaTooNew
from .rules.pairing import declared_call_ids

APPLICATION_ID = 0x46444C53  # 'FDLS'
SCHEMA_VERSION = 3

log = logging.getLogger("flowdrop_local")


def create_missing_objects(conn: sqlite3.Connection, script: str | None = None) -> None:
    """Migration step for additive changes: create what a schema declares and the file lacks.

    Tables, indexes and triggers are matched by name, so the statements come from
    schema.sql itself (or, for a step to an older version, that version's frozen
    copy in ``migrations/``) and the schema is still written down once.
    """
    present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    for statement in statements(schema_sql() if script is None else script):
        name = _created_name(statement)
        if name is not None and name not in present:
            conn.execute(statement)


def _created_name(statement: str) -> str | None:
    words = statement.replace("(", " ( ").split()
    upper = [w.upper() for w in words]
    if not upper or upper[0] != "CREATE":
        return None
    for kind in ("TABLE", "INDEX", "TRIGGER", "VIEW"):
        if kind in upper[:4]:
            i = upper.index(kind) + 1
            if upper[i : i + 3] == ["IF", "NOT", "EXISTS"]:
                i += 3
            return words[i].strip('"')
    return None


def rebuild_ledger(conn: sqlite3.Connection) -> None:
    """Write the ledger of declared calls afresh from the messages.

    The ledger is derived data: one row per (call id, declaring turn), ordinal
    from the turn's first declaration of the id, answered by the buffer's tool
    message for the id. Reads every message once; ids are copied as stored (text
    in version 2, bytes from version 3).
    """
    conn.execute("DELETE FROM tool_calls")
    rows = conn.execute(
        "SELECT buffer_id, id, role, metadata FROM messages "
        "WHERE role IN ('assistant', 'tool') ORDER BY buffer_id, position"
    )
    declarations: dict[tuple[int, str, str], int] = {}
    results: dict[tuple[int, str], str] = {}
    for buffer_id, message_id, role, metadata_json in rows:
        metadata = json.loads(metadata_json)
        if role == "assistant":
            for ordinal, call_id in enumerate(declared_call_ids(metadata)):
                declarations.setdefault((buffer_id, call_id, message_id), ordinal)
        elif isinstance(metadata.get("tool_call_id"), str):
            results.setdefault((buffer_id, metadata["tool_call_id"]), message_id)
    conn.executemany(
        "INSERT INTO tool_calls (buffer_id, call_id, declared_by, ordinal, answered_by) "
        "VALUES (?, ?, ?, ?, ?)",
        [
            (buffer_id, call_id, declared_by, ordinal, results.get((buffer_id, call_id)))
            for (buffer_id, call_id, declared_by), ordinal in declarations.items()
        ],
    )


def _upgrade_1_to_2(conn: sqlite3.Connection) -> None:
    """1 -> 2: memory, sessions and session_viewers (issue 5); a ledger row per declaration.

    The version-1 ledger had one row per call id, lost when its first declaring
    turn was deleted though a later turn declared the id too; it is rebuilt. The
    per-row insert trigger on the message count goes (the append sets it once).
    Created by name from the frozen copy of the version-2 schema.
    """
    conn.execute("DROP TABLE tool_calls")
    # Recreated: it now reads the ledger's unanswered-calls index.
    conn.execute("DROP TRIGGER messages_user_needs_answered_calls")
    # The count is now set once per append by the library (not once per row).
    conn.execute("DROP TRIGGER messages_count_insert")
    create_missing_objects(conn, _frozen_schema(2))
    rebuild_ledger(conn)


_ID_NAMESPACE = uuid.UUID("5f1d0c2e-8a4b-4c3e-9f60-7d2a1b3c4e5f")


def _stored_id(text: str) -> bytes:
    """A version-2 id as version 3 stores it: its 16 bytes; a text that is not a UUID
    (version 2 checked only its length) maps to a name-based UUID of itself.

    "A UUID" is what the API takes as one (``id_blob``: 8-4-4-4-12 hex digits, any
    case), so an old id still finds its message, and the count the upgrade warns
    about is the count mapped by name.
    """
    stored = id_blob(text)
    return uuid.uuid5(_ID_NAMESPACE, str(text)).bytes if stored is None else stored


# A message id as the API takes it, lower-cased: 8-4-4-4-12 hex digits.
_UUID_GLOB = "-".join("[0-9a-f]" * n for n in (8, 4, 4, 4, 12))


def _upgrade_2_to_3(conn: sqlite3.Connection) -> None:
    """2 -> 3: messages clustered on (buffer_id, position), 16-byte ids, the count on the
    last row, conversation title, metadata and recency on buffers.

    The tables are rebuilt under their names (renamed aside, created from schema.sql,
    copied, dropped); the ledger is derived, so it is rebuilt from the messages.
    """
    _refuse_foreign_objects(conn, ("buffers", "messages", "tool_calls"), _frozen_schema(2))
    for trigger in (
        "messages_count_delete",
        "messages_user_needs_answered_calls",
        "messages_place_is_fixed",
        "buffers_identity_scope_needs_identity",
    ):
        conn.execute(f"DROP TRIGGER {trigger}")
    conn.execute("DROP TABLE tool_calls")  # its indexes go with it
    conn.execute("DROP INDEX messages_tool_result")
    conn.execute("ALTER TABLE messages RENAME TO messages_v2")
    conn.execute("ALTER TABLE buffers RENAME TO buffers_v2")
    create_missing_objects(conn)
    odd, cased = conn.execute(
        "SELECT total(lower(id) NOT GLOB ?1), total(id <> lower(id) AND lower(id) GLOB ?1) "
        "FROM messages_v2",
        (_UUID_GLOB,),
    ).fetchone()
    # Version 2 kept ids differing only in letter case apart; the 16 bytes do not. The
    # lower-case spelling keeps the UUID, any other spelling of it is mapped by name.
    respelled = set()
    if cased:
        respelled = {
            text
            for (text,) in conn.execute(
                "SELECT id FROM messages_v2 WHERE id <> lower(id) AND lower(id) IN "
                "(SELECT lower(id) FROM messages_v2 WHERE lower(id) GLOB ? "
                "GROUP BY lower(id) HAVING count(*) > 1)",
                (_UUID_GLOB,),
            )
        }
    if odd or respelled:
        log.warning(
            "flowdrop_local: %d message id(s) were not UUIDs; version 3 stores each as "
            "the name-based UUID (uuid5) of its old text",
            int(odd) + len(respelled),
        )
    conn.execute(
        "INSERT INTO buffers (id, scope, scope_id, key, created_at, updated_at) "
        "SELECT b.id, b.scope, b.scope_id, b.key, b.created_at, "
        "coalesce((SELECT max(created_at) FROM messages_v2 WHERE buffer_id = b.id), b.created_at) "
        "FROM buffers_v2 AS b"
    )
    stored_id = _stored_id
    if respelled:

        def stored_id(text: str) -> bytes:
            return uuid.uuid5(_ID_NAMESPACE, text).bytes if text in respelled else _stored_id(text)

    conn.create_function("flowdrop_stored_id", 1, stored_id, deterministic=True)
    conn.execute(
        "INSERT INTO messages (buffer_id, position, id, role, content, content_parts, "
        "metadata, created_at, tally) "
        "SELECT buffer_id, position, flowdrop_stored_id(id), role, content, content_parts, "
        "metadata, created_at, row_number() OVER (PARTITION BY buffer_id ORDER BY position) "
        "FROM messages_v2 ORDER BY buffer_id, position"
    )
    conn.execute("DROP TABLE messages_v2")
    conn.execute("DROP TABLE buffers_v2")
    rebuild_ledger(conn)


def _refuse_foreign_objects(conn: sqlite3.Connection, tables: tuple[str, ...], script: str) -> None:
    """Refuse to rebuild tables that carry an index or trigger the old schema did not make
    (rebuilding would drop it unseen; the upgrade rolls back and the file stays as it was)."""
    made = sqlite3.connect(":memory:")
    try:
        for statement in statements(script):
            made.execute(statement)
        ours = {name for (name,) in made.execute("SELECT name FROM sqlite_master")}
    finally:
        made.close()
    # Also a view, a trigger on another table, or a foreign key naming one of them:
    # renaming the table aside would point it at the old copy, which is then dropped.
    for type_, name, table, sql in conn.execute(_MASTER):
        if name in ours:
            continue
        named = {table.lower()} if type_ in ("index", "trigger") else set()
        if sql is not None:
            tokens = sql_tokens(sql)
            if type_ in ("trigger", "view") or (len(tokens) > 1 and tokens[1].lower() == "virtual"):
                named |= _mentioned_names(sql)
            elif type_ == "table":
                named |= _referenced_tables(sql)
        hits = sorted(named & set(tables))
        if hits:
            raise NotAFlowdropDatabase(
                f"the file has a schema flowdrop_local did not make: {type_} {name} is not "
                f"flowdrop_local's and names its table {hits[0]}"
            )


# MIGRATIONS[n] upgrades a version-n file to version n + 1, inside the one
# transaction prepare() opens. Append-only: a released step is never edited.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _upgrade_1_to_2,
    2: _upgrade_2_to_3,
}


@cache
def _frozen_schema(version: int) -> str:
    """The schema of an older version, as the step that made it created it."""
    frozen = resources.files("flowdrop_local").joinpath(f"migrations/schema_v{version}.sql")
    return frozen.read_text(encoding="utf-8")


@cache
def schema_sql() -> str:
    """The text of schema.sql: from the installed package, else the source checkout."""
    packaged = resources.files("flowdrop_local").joinpath("schema.sql")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parent.parent / "schema.sql").read_text(encoding="utf-8")


def statements(script: str) -> Iterator[str]:
    """Split an SQL script into complete statements (triggers included)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        if not pending.strip() and line.lstrip().startswith("--"):
            continue  # a comment between statements
        pending += line
        if sqlite3.complete_statement(pending):
            if pending.strip():
                yield pending.strip()
            pending = ""
    if pending.strip() and not all(
        not ln.strip() or ln.strip().startswith("--") for ln in pending.splitlines()
    ):
        raise ValueError(f"incomplete SQL statement at the end of the script: {pending!r}")


# A row of sqlite_master: (type, name, tbl_name, sql).
MasterRow = tuple[str, str, str, str | None]
_MASTER = "SELECT type, name, tbl_name, sql FROM sqlite_master"


# The file's application_id, user_version and journal mode beside each schema object,
# in one statement (a cold open pays per statement); one row with NULLs when empty.
_HEADER = (
    "SELECT h.a, h.v, h.j, m.type, m.name, m.tbl_name, m.sql FROM (SELECT "
    "(SELECT application_id FROM pragma_application_id()) AS a, "
    "(SELECT user_version FROM pragma_user_version()) AS v, "
    "(SELECT journal_mode FROM pragma_journal_mode()) AS j) AS h "
    "LEFT JOIN sqlite_master AS m"
)


def _header(conn: sqlite3.Connection, where: str) -> tuple[int, int, str, list[MasterRow]]:
    """(application_id, user_version, journal_mode, the schema objects), reading only."""
    try:
        rows = conn.execute(_HEADER).fetchall()
    except sqlite3.DatabaseError as error:
        raise NotADatabase(
            f"{where} is not an SQLite database, or a corrupt one: {error}"
        ) from None
    application_id, version, journal_mode = rows[0][:3]
    objects = [row[3:] for row in rows if row[3] is not None]
    return application_id, version, str(journal_mode), objects


def prepare(conn: sqlite3.Connection, where: str, *, create: bool = True) -> str:
    """Check what the file is; create or upgrade its schema when it needs it.

    Nothing is written unless the file is a fresh (empty) database (and ``create``
    is true) or an older flowdrop_local file, and then in one ``BEGIN IMMEDIATE``
    transaction. The schema objects are verified before any statement that could
    fire a trigger; an upgrade is verified before it commits.

    Returns the file's journal mode as it was found.

    Raises:
        NotADatabase: also when a row breaks a rule of the version an upgrade goes to.
        NotAFlowdropDatabase, SchemaTooNew
    """
    application_id, version, journal_mode, objects = _header(conn, where)
    if application_id == APPLICATION_ID and version == SCHEMA_VERSION:
        verify_schema(objects, where)
        return journal_mode
    _check_recognised(application_id, version, len(objects), where, create)
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Another process may have created or upgraded the file meanwhile.
        application_id, version, journal_mode, objects = _header(conn, where)
        _check_recognised(application_id, version, len(objects), where, create)
        if not objects:
            for statement in statements(schema_sql()):
                conn.execute(statement)
        else:
            # A step's statements touch only objects it recreates (MIGRATIONS), so
            # an object someone added is refused here, before the upgrade commits.
            while version < SCHEMA_VERSION:
                try:
                    MIGRATIONS[version](conn)
                except sqlite3.IntegrityError as error:
                    # A row an older version let in (a version-1 buffer in the shared
                    # bucket of an identity scope, say) breaks a rule of the newer one.
                    raise NotADatabase(
                        f"cannot upgrade {where} from schema version {version}: a row breaks "
                        f"a rule of version {version + 1} ({error}); the file is unchanged"
                    ) from None
                version += 1
                conn.execute(f"PRAGMA user_version = {version:d}")
            verify_schema(conn.execute(_MASTER).fetchall(), where)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return journal_mode


def _check_recognised(
    application_id: int, version: int, objects: int, where: str, create: bool
) -> None:
    if application_id == 0 and version == 0 and objects == 0:
        if not create:
            raise NotAFlowdropDatabase(
                f"{where} is an empty database, not a flowdrop_local one yet "
                "(create=False: not creating its schema)"
            )
        return  # an empty database: ours to create
    if application_id != APPLICATION_ID:
        raise NotAFlowdropDatabase(
            f"{where} is an SQLite database, but not a flowdrop_local one "
            f"(application_id {application_id:#x})"
        )
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{where} has schema version {version}; this flowdrop_local reads up to "
            f"{SCHEMA_VERSION}: upgrade flowdrop_local"
        )
    if version < 1 or any(v not in MIGRATIONS for v in range(version, SCHEMA_VERSION)):
        raise NotAFlowdropDatabase(f"{where} has unknown flowdrop_local schema version {version}")


# ------------------------------------------------------------ schema verification
# The expected objects are what schema.sql makes in a private in-memory database,
# computed once per process. SQLite keeps each CREATE statement's text as written,
# so a sound file matches it byte for byte (an upgraded file too: schema.sql keeps
# the version-1 text of what the upgrade does not recreate); whitespace and
# comments are ignored only when the bytes differ.

# One SQL token: whitespace or a comment, a string, a quoted identifier, a word, or
# any other character.
_TOKEN = re.compile(
    r"""(?P<space>\s+|--[^\n]*|/\*.*?(?:\*/|\Z))
    |(?P<string>'(?:[^']|'')*')
    |(?P<quoted>"(?:[^"]|"")*"|`(?:[^`]|``)*`|\[[^\]]*\])
    |(?P<word>[\w$\x80-\U0010ffff]+)
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


def sql_tokens(sql: str) -> tuple[str, ...]:
    """The tokens of ``sql`` without whitespace and comments: equal for equal statements."""
    return tuple(m.group() for m in _TOKEN.finditer(sql) if m.lastgroup != "space")


def _mentioned_names(sql: str) -> set[str]:
    """Every name ``sql`` could mean, lower-cased: words, quoted identifiers and strings.

    Strings count because SQLite takes a string where it expects a table name
    (``FROM 'messages'``).
    """
    names = set()
    for m in _TOKEN.finditer(sql):
        token = m.group()
        if m.lastgroup == "word":
            names.add(token.lower())
        elif m.lastgroup in ("string", "quoted"):
            quote = token[0]
            names.add(token[1:-1].replace(quote * 2, quote).lower())
    return names


def _referenced_tables(sql: str) -> set[str]:
    """The tables a CREATE TABLE's foreign keys name (``REFERENCES t``), lower-cased."""
    tokens = [m for m in _TOKEN.finditer(sql) if m.lastgroup != "space"]
    found = set()
    for i, m in enumerate(tokens[:-1]):
        if m.group().lower() == "references":
            target = tokens[i + 1]
            quoted = target.lastgroup in ("string", "quoted")
            found.add((target.group()[1:-1] if quoted else target.group()).lower())
    return found


@cache
def _expected() -> dict[tuple[str, str], tuple[str, str | None, tuple[str, ...] | None]]:
    """(type, lower-case name) -> (lower-case table, SQL, its tokens), from schema.sql."""
    return {
        (type_, name.lower()): (table.lower(), sql, None if sql is None else sql_tokens(sql))
        for type_, name, table, sql in sorted(_expected_rows(), key=lambda row: row[1])
    }


@cache
def _expected_rows() -> frozenset[MasterRow]:
    """The sqlite_master rows schema.sql makes, exactly."""
    conn = sqlite3.connect(":memory:")
    try:
        for statement in statements(schema_sql()):
            conn.execute(statement)
        return frozenset(conn.execute(_MASTER).fetchall())
    finally:
        conn.close()


@cache
def search_sql() -> str:
    """The text of search.sql: the optional search index (flowdrop_local/search.py)."""
    return resources.files("flowdrop_local").joinpath("search.sql").read_text(encoding="utf-8")


@cache
def _expected_search() -> dict[tuple[str, str], tuple[str, str | None, tuple[str, ...] | None]]:
    """The objects search.sql adds (FTS5's own tables included), as :func:`_expected` gives ours.

    They are accepted on a file only all together and exactly as search.sql makes them.
    """
    conn = sqlite3.connect(":memory:")
    try:
        for statement in statements(schema_sql()):
            conn.execute(statement)
        for statement in statements(search_sql()):
            conn.execute(statement)
        rows = frozenset(conn.execute(_MASTER).fetchall()) - _expected_rows()
    finally:
        conn.close()
    return {
        (type_, name.lower()): (table.lower(), sql, None if sql is None else sql_tokens(sql))
        for type_, name, table, sql in sorted(rows, key=lambda row: row[1])
    }


@cache
def _our_tables() -> frozenset[str]:
    return frozenset(name for type_, name in _expected() if type_ == "table")


def _names_ours(type_: str, name: str, table: str, sql: str | None) -> set[str]:
    """Which of our tables an object that is not ours names (empty: it cannot run inside ours).

    An index or trigger is attached to its table; a trigger's or view's body, or a
    virtual table's arguments, may name any table; an ordinary table can name
    another only through a foreign key, whose actions run inside our deletes.
    """
    ours = _our_tables()
    named = {name.lower(), table.lower()} & ours
    if sql is None:
        return named
    tokens = sql_tokens(sql)
    virtual = len(tokens) > 1 and tokens[1].lower() == "virtual"
    if type_ in ("trigger", "view") or virtual:
        return named | (_mentioned_names(sql) & ours)
    if type_ == "table":
        return named | (_referenced_tables(sql) & ours)
    return named


def _takes_our_name(name: str) -> bool:
    """Whether ``name`` is one the library makes or reads: schema.sql's, the search
    index's (made by ``enable_search``), and every ``flowdrop_`` one (sync's tables,
    made when a store first syncs, and later ones)."""
    lowered = name.lower()
    return (
        lowered.startswith("flowdrop_")
        or any(n == lowered for _, n in _expected())
        or any(n == lowered for _, n in _expected_search())
    )


def schema_problems(objects: list[MasterRow]) -> list[tuple[str, str]]:
    """(object, problem) for each schema object that is missing, changed, or not ours on ours.

    Allowed beside ours: anything that names none of our tables (SQLite's
    ``sqlite_stat*`` tables, the user's own tables, and their indexes and
    triggers), and the user's views, on our tables too: a view runs only in a
    statement that reads it, and none of ours reads a view, so it cannot run
    inside ours, unless it takes a name the library makes or reads (then our
    statements would read its rows). A trigger does run inside the statement that
    fires it: one naming our tables stays refused (on the user's view too).
    """
    if len(objects) == len(_expected_rows()) and frozenset(objects) == _expected_rows():
        return []  # byte for byte what schema.sql makes: the common case, kept cheap
    expected = _expected()
    search = _expected_search()
    problems: list[tuple[str, str]] = []
    seen = set()
    search_seen = set()
    for type_, name, table, sql in objects:
        key = (type_, name.lower())
        want = expected.get(key)
        if want is None and key in search:
            want = search[key]
            search_seen.add(key)
        label = f"{type_} {name}"
        if want is not None:
            if key not in search_seen:
                seen.add(key)
            want_table, want_sql, want_tokens = want
            changed = sql != want_sql and (
                sql is None or want_sql is None or sql_tokens(sql) != want_tokens
            )
            if table.lower() != want_table or changed:
                problems.append((label, f"{label} is not the one flowdrop_local makes"))
            continue
        if type_ == "view":
            if _takes_our_name(name):
                problems.append(
                    (label, f"{label} is not flowdrop_local's and takes a name flowdrop_local uses")
                )
            continue
        named = _names_ours(type_, name, table, sql)
        if named:
            tables = ("table " if len(named) == 1 else "tables ") + ", ".join(sorted(named))
            problems.append((label, f"{label} is not flowdrop_local's and names its {tables}"))
    missing = [key for key in expected if key not in seen]
    if len(missing) == len(expected):
        return [("schema", "none of flowdrop_local's tables, indexes and triggers are there")]
    problems += [(f"{t} {n}", f"{t} {n} is missing") for t, n in missing]
    if search_seen:  # the search index is there: all of it
        problems += [
            (f"{t} {n}", f"{t} {n} of the search index is missing")
            for t, n in search
            if (t, n) not in search_seen
        ]
    return problems


def verify_schema(objects: list[MasterRow], where: str) -> None:
    """Refuse a file whose schema objects are not exactly ours (see :func:`schema_problems`).

    Raises:
        NotAFlowdropDatabase: naming the objects (the first three, and how many more).
    """
    problems = schema_problems(objects)
    if problems:
        shown = "; ".join(problem for _, problem in problems[:3])
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise NotAFlowdropDatabase(
            f"{where} has a schema flowdrop_local did not make: {shown}{more}"
        )

"""Creating, recognising and upgrading a flowdrop_local database file.

``schema.sql`` (top level of the repository, shipped inside the wheel as
``flowdrop_local/schema.sql``) is the only definition of the schema. A fresh file
gets it whole; an older file is brought forward by the numbered steps in
``MIGRATIONS``, all in one transaction. The version lives in ``PRAGMA
user_version`` and the file is marked with ``PRAGMA application_id``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from functools import cache
from importlib import resources
from pathlib import Path

from .errors import NotADatabase, NotAFlowdropDatabase, SchemaTooNew
from .rules.pairing import declared_call_ids

APPLICATION_ID = 0x46444C53  # 'FDLS'
SCHEMA_VERSION = 2


def create_missing_objects(conn: sqlite3.Connection) -> None:
    """Migration step for additive changes: create what schema.sql declares and the file lacks.

    Tables, indexes and triggers are matched by name, so the statements come from
    schema.sql itself and the schema is still written down once.
    """
    present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    for statement in statements(schema_sql()):
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
    message for the id. Reads every message once.
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
    Created from schema.sql by name: valid while those objects keep their version-2
    shape (a later change to them comes with its own step after this one).
    """
    conn.execute("DROP TABLE tool_calls")
    # Recreated from schema.sql: it now reads the ledger's unanswered-calls index.
    conn.execute("DROP TRIGGER messages_user_needs_answered_calls")
    # The count is now set once per append by the library (not once per row).
    conn.execute("DROP TRIGGER messages_count_insert")
    create_missing_objects(conn)
    rebuild_ledger(conn)


# MIGRATIONS[n] upgrades a version-n file to version n + 1, inside the one
# transaction prepare() opens. Append-only: a released step is never edited.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _upgrade_1_to_2}


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


def _header(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """(application_id, user_version, number of schema objects), reading only."""
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as error:
        raise NotADatabase(f"not an SQLite database, or a corrupt one: {error}") from None
    return application_id, version, objects


def prepare(conn: sqlite3.Connection, where: str) -> None:
    """Check what the file is; create or upgrade its schema when it needs it.

    Nothing is written unless the file is a fresh (empty) database or an older
    flowdrop_local file, and then in one ``BEGIN IMMEDIATE`` transaction.

    Raises:
        NotADatabase, NotAFlowdropDatabase, SchemaTooNew
    """
    application_id, version, objects = _header(conn)
    if application_id == APPLICATION_ID and version == SCHEMA_VERSION:
        return
    _check_recognised(application_id, version, objects, where)
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Another process may have created or upgraded the file meanwhile.
        application_id, version, objects = _header(conn)
        _check_recognised(application_id, version, objects, where)
        if objects == 0:
            for statement in statements(schema_sql()):
                conn.execute(statement)
        else:
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](conn)
                version += 1
                conn.execute(f"PRAGMA user_version = {version:d}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _check_recognised(application_id: int, version: int, objects: int, where: str) -> None:
    if application_id == 0 and version == 0 and objects == 0:
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

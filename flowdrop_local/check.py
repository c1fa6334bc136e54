"""The invariant checker: what ``Store.check()`` and ``flowdrop-local check`` report.

It re-derives everything the append path maintains from the messages themselves,
so a file changed by another writer (or damaged) is caught: SQLite's own
integrity and foreign-key checks, then per buffer the ledger of declared calls,
the MEM-3 healing invariants, positions and the placeholder shape. It reads the
whole file; it is a maintenance command, not part of any append.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import attrs

from ._ids import id_text
from ._schema import schema_problems
from .positions import is_valid_key
from .rules.pairing import (
    PLACEHOLDER_CONTENT,
    declared_call_ids,
    marked_healed,
    placeholder_metadata,
)


@attrs.frozen
class Violation:
    """One broken invariant: which check, where, and what was found.

    ``buffer`` is ``scope/scope_id/key`` (``#id (missing)`` for a row whose
    buffer is gone), ``call_id`` the tool call a ledger finding is about.
    """

    check: str
    detail: str
    buffer: str | None = None  # "scope/scope_id/key"
    message_id: str | None = None
    call_id: str | None = None

    def __str__(self) -> str:
        where = " ".join(part for part in (self.buffer, self.message_id) if part)
        return f"{self.check}: {self.detail}" + (f" ({where})" if where else "")


_MESSAGES = (
    "SELECT id, position, role, metadata, content, tally FROM messages "
    "WHERE buffer_id = ? ORDER BY position"
)
_LEDGER = "SELECT call_id, declared_by, ordinal, answered_by FROM tool_calls WHERE buffer_id = ?"
# The columns that say which row a foreign-key finding is about, per table.
_ROW_NAMES = {
    "messages": ("id", "buffer_id"),
    "tool_calls": ("buffer_id", "call_id", "declared_by", "answered_by"),
    "session_viewers": ("session_id", "user_id"),
}


# Each buffer, and whether its updated_at is a time as the library writes it
# (text that strftime reads; a damaged file may hold anything there).
_BUFFERS = (
    "SELECT id, scope, scope_id, key, "
    "typeof(updated_at) = 'text' AND strftime('%s', updated_at) IS NOT NULL FROM buffers"
)


def check_database(conn: sqlite3.Connection) -> list[Violation]:
    """Every violation found in the file; an empty list means it is sound.

    Each stage runs whatever the earlier ones found, so one run reports every
    kind of damage; a stage the file is too damaged to complete reports that
    as an ``integrity_check`` finding and the rest still run.
    """
    violations: list[Violation] = []
    schema = _check_schema(conn)
    if schema:
        return schema  # reading on could run the foreign objects' SQL
    try:
        for (row,) in conn.execute("PRAGMA integrity_check"):
            if row != "ok":
                violations += [
                    Violation("integrity_check", line)
                    for line in str(row).splitlines()
                    if line and not line.startswith("*** in database")
                ]
    except sqlite3.DatabaseError as error:  # too damaged to even walk
        violations.append(Violation("integrity_check", str(error)))
    try:
        violations += _foreign_keys(conn)
    except sqlite3.DatabaseError as error:
        violations.append(Violation("integrity_check", f"cannot check foreign keys: {error}"))
    try:
        buffers = conn.execute(_BUFFERS).fetchall()
    except sqlite3.DatabaseError as error:
        return [*violations, Violation("integrity_check", f"cannot list the buffers: {error}")]
    for buffer_id, scope, scope_id, key, stamped in buffers:
        name = f"{scope}/{scope_id}/{key}"
        if not stamped:
            violations.append(
                Violation(
                    "timestamp",
                    "updated_at is not a timestamp as the library writes it",
                    name,
                )
            )
        try:
            violations += _check_buffer(conn, buffer_id, name)
        except sqlite3.DatabaseError as error:
            violations.append(
                Violation("integrity_check", f"cannot read the buffer: {error}", name)
            )
    return violations


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _foreign_keys(conn: sqlite3.Connection) -> list[Violation]:
    """Each row whose reference is dangling, named by its own columns and its buffer."""
    broken = {(table, fkid) for table, _, _, fkid in conn.execute("PRAGMA foreign_key_check")}
    found: list[Violation] = []
    for table, fkid in sorted(broken):
        links = [
            (parent, child_col, parent_col)
            for id_, _, parent, child_col, parent_col, *_ in conn.execute(
                f"PRAGMA foreign_key_list({_quote(table)})"
            )
            if id_ == fkid
        ]
        parent = links[0][0]
        names = _ROW_NAMES.get(table, ("rowid",))
        columns = [child for _, child, _ in links]
        match = " AND ".join(
            f"p.{_quote(parent_col or 'rowid')} = c.{_quote(child)}"
            for _, child, parent_col in links
        )
        present = " AND ".join(f"c.{_quote(child)} IS NOT NULL" for child in columns)
        rows = conn.execute(
            f"SELECT {', '.join('c.' + _quote(n) for n in names)}, "
            f"{', '.join('c.' + _quote(c) for c in columns)} FROM {_quote(table)} AS c "
            f"WHERE {present} AND NOT EXISTS "
            f"(SELECT 1 FROM {_quote(parent)} AS p WHERE {match})"
        ).fetchall()
        for row in rows:
            row = tuple(_shown_id(value) for value in row)
            named = dict(zip(names, row, strict=False))
            dangling = ", ".join(
                f"{column} {value!r}"
                for column, value in zip(columns, row[len(names) :], strict=True)
            )
            found.append(_fk_violation(conn, table, parent, named, dangling))
    return found


def _fk_violation(
    conn: sqlite3.Connection, table: str, parent: str, row: dict[str, Any], dangling: str
) -> Violation:
    buffer = _buffer_name(conn, row["buffer_id"]) if "buffer_id" in row else None
    missing = f"{dangling} names a missing row of {parent}"
    if table == "tool_calls":
        return Violation(
            "foreign_key_check",
            f"ledger entry of call {row['call_id']!r}: {missing}",
            buffer,
            row["declared_by"],
            row["call_id"],
        )
    if table == "messages":
        return Violation("foreign_key_check", f"message: {missing}", buffer, row["id"])
    if table == "session_viewers":
        return Violation("foreign_key_check", f"viewer {row['user_id']!r} of a session: {missing}")
    return Violation("foreign_key_check", f"row {row.get('rowid')} of {table}: {missing}", buffer)


def _buffer_name(conn: sqlite3.Connection, buffer_id: object) -> str:
    found = conn.execute(
        "SELECT scope, scope_id, key FROM buffers WHERE id = ?", (buffer_id,)
    ).fetchone()
    return f"#{buffer_id} (missing)" if found is None else "/".join(found)
def _check_schema(conn: sqlite3.Connection) -> list[Violation]:
    """Schema objects that are not exactly ours (``_schema.schema_problems``), checked first.

    Opening refuses such a file; this catches what was added later (``store.db``).
    """
    try:
        objects = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError:
        return []  # unreadable: integrity_check reports it
    return [Violation("schema", problem) for _, problem in schema_problems(objects)]


def _shown_id(value: object) -> object:
    """A stored id (16 bytes) as its text; any other value as it is."""
    return id_text(value) or value


def _check_buffer(conn: sqlite3.Connection, buffer_id: int, name: str) -> list[Violation]:
    """One buffer's invariants; its count is the last row's tally (schema.sql)."""
    rows = conn.execute(_MESSAGES, (buffer_id,)).fetchall()
    messages = [(_shown_id(id_), *rest) for id_, *rest in (row[:5] for row in rows)]
    ledger = [
        (call_id, _shown_id(declared_by), ordinal, _shown_id(answered_by))
        for call_id, declared_by, ordinal, answered_by in conn.execute(_LEDGER, (buffer_id,))
    ]
    stored_count = rows[-1][5] if rows else 0
    return check_rows(name, stored_count, messages, ledger)  # type: ignore[arg-type]


def check_rows(
    name: str,
    stored_count: int,
    messages: list[tuple[str, str, str, str, str]],
    ledger_rows: list[tuple[str, str, int, str | None]],
) -> list[Violation]:
    """The invariants of one buffer, from its rows (any backend).

    ``messages``: ``(id, position, role, metadata, content)`` in position order;
    ``ledger_rows``: ``(call_id, declared_by, ordinal, answered_by)``.
    """
    found: list[Violation] = []

    def report(
        check: str, detail: str, message_id: str | None = None, call_id: str | None = None
    ) -> None:
        found.append(Violation(check, detail, name, message_id, call_id))

    contents = {id_: content for id_, _, _, _, content in messages}
    rows: list[tuple[str, str, str, Any]] = []  # metadata: a dict
    for id_, position, role, text, _ in messages:
        try:
            metadata = json.loads(text)
        except (ValueError, RecursionError):  # a damaged row (no CHECK stops a raw edit)
            metadata = None
        if not isinstance(metadata, dict):
            report("json", "metadata is not a readable JSON object", id_)
            metadata = {}
        rows.append((id_, position, role, metadata))
    if stored_count != len(rows):
        report("count", f"the stored count is {stored_count}, the buffer holds {len(rows)}")

    index_of = {row[0]: i for i, row in enumerate(rows)}
    expected: dict[str, tuple[str, int]] = {}  # call id -> (first declaring message, ordinal)
    declarations: dict[tuple[str, str], int] = {}  # (call id, declaring message) -> ordinal
    results: dict[str, str] = {}  # call id -> the tool message answering it
    for id_, position, role, metadata in rows:
        if not is_valid_key(position):
            report("position", f"malformed position key {position!r}", id_)
        if role == "assistant":
            for ordinal, call_id in enumerate(declared_call_ids(metadata)):
                expected.setdefault(call_id, (id_, ordinal))
                declarations.setdefault((call_id, id_), ordinal)
        elif role == "tool" and isinstance(metadata.get("tool_call_id"), str):
            results[metadata["tool_call_id"]] = id_

    ledger: dict[tuple[str, str], tuple[int, str | None]] = {
        (call_id, declared_by): (ordinal, answered_by)
        for call_id, declared_by, ordinal, answered_by in ledger_rows
    }
    for (call_id, declared_by), ordinal in declarations.items():
        entry = ledger.get((call_id, declared_by))
        if entry is None:
            report(
                "ledger",
                f"call {call_id!r} is declared but not in the ledger",
                declared_by,
                call_id,
            )
            continue
        if entry[0] != ordinal:
            report(
                "ledger",
                f"call {call_id!r}: the ledger says #{entry[0]} of its turn, the turn #{ordinal}",
                declared_by,
                call_id,
            )
        if entry[1] != results.get(call_id):
            report(
                "ledger",
                f"call {call_id!r}: the ledger says answered by {entry[1]}, "
                f"the messages say {results.get(call_id)}",
                declared_by,
                call_id,
            )
    for call_id, declared_by in ledger.keys() - declarations.keys():
        report(
            "ledger",
            f"the ledger holds call {call_id!r} of a turn that does not declare it",
            declared_by,
            call_id,
        )

    # MEM-3: no user turn after a call that has no result anywhere.
    for call_id, (declared_by, _) in expected.items():
        if call_id in results:
            continue
        later_user = next((r[0] for r in rows[index_of[declared_by] + 1 :] if r[2] == "user"), None)
        if later_user is not None:
            report("MEM-3", f"user turn after unanswered call {call_id!r}", later_user, call_id)

    # Placeholders: exact shape, and in the tool run right after their declaring turn.
    for i, (id_, _, role, metadata) in enumerate(rows):
        if not marked_healed(role, metadata):
            continue
        call_id = metadata.get("tool_call_id")
        content = contents[id_]
        if (
            not isinstance(call_id, str)
            or metadata != placeholder_metadata(call_id)
            or content != PLACEHOLDER_CONTENT
        ):
            report("placeholder", "a healed message does not have the placeholder's shape", id_)
            continue
        declaring = expected.get(call_id)
        if declaring is None:
            report(
                "placeholder", f"placeholder for {call_id!r}, which no turn declares", id_, call_id
            )
            continue
        turn = index_of[declaring[0]]
        if turn >= i or any(r[2] != "tool" for r in rows[turn + 1 : i]):
            report(
                "placeholder",
                f"placeholder for {call_id!r} is not in the tool run after its declaring turn",
                id_,
                call_id,
            )
    return found


def as_dicts(violations: list[Violation]) -> list[dict[str, Any]]:
    """JSON-ready form, for ``flowdrop-local check --json``."""
    return [attrs.asdict(v) for v in violations]

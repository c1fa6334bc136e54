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

from ._schema import schema_problems
from .positions import is_valid_key
from .rules.pairing import PLACEHOLDER_CONTENT, declared_call_ids, placeholder_metadata


@attrs.frozen
class Violation:
    """One broken invariant: which check, where, and what was found."""

    check: str
    detail: str
    buffer: str | None = None  # "scope/scope_id/key"
    message_id: str | None = None

    def __str__(self) -> str:
        where = " ".join(part for part in (self.buffer, self.message_id) if part)
        return f"{self.check}: {self.detail}" + (f" ({where})" if where else "")


_MESSAGES = (
    "SELECT id, position, role, metadata FROM messages WHERE buffer_id = ? ORDER BY position"
)
_LEDGER = "SELECT call_id, declared_by, ordinal, answered_by FROM tool_calls WHERE buffer_id = ?"


def check_database(conn: sqlite3.Connection) -> list[Violation]:
    """Every violation found in the file; an empty list means it is sound."""
    schema = _check_schema(conn)
    if schema:
        return schema  # reading on could run the foreign objects' SQL
    try:
        violations = [
            Violation("integrity_check", row[0])
            for row in conn.execute("PRAGMA integrity_check")
            if row[0] != "ok"
        ]
        if violations:
            return violations  # the rest would read a damaged file
        violations += [
            Violation("foreign_key_check", f"row {rowid} of {table} references a missing {parent}")
            for table, rowid, parent, _ in conn.execute("PRAGMA foreign_key_check")
        ]
    except sqlite3.DatabaseError as error:  # too damaged to even walk
        return [Violation("integrity_check", str(error))]
    if violations:
        return violations
    buffers = conn.execute("SELECT id, scope, scope_id, key, message_count FROM buffers").fetchall()
    for buffer_id, scope, scope_id, key, stored_count in buffers:
        violations += _check_buffer(conn, buffer_id, f"{scope}/{scope_id}/{key}", stored_count)
    return violations


def _check_schema(conn: sqlite3.Connection) -> list[Violation]:
    """Schema objects that are not exactly ours (``_schema.schema_problems``), checked first.

    Opening refuses such a file; this catches what was added later (``store.db``).
    """
    try:
        objects = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError:
        return []  # unreadable: integrity_check reports it
    return [Violation("schema", problem) for _, problem in schema_problems(objects)]


def _check_buffer(
    conn: sqlite3.Connection, buffer_id: int, name: str, stored_count: int
) -> list[Violation]:
    found: list[Violation] = []

    def report(check: str, detail: str, message_id: str | None = None) -> None:
        found.append(Violation(check, detail, name, message_id))

    rows = [
        (id_, position, role, json.loads(metadata))
        for id_, position, role, metadata in conn.execute(_MESSAGES, (buffer_id,))
    ]
    if stored_count != len(rows):
        report("count", f"buffers.message_count is {stored_count}, the buffer holds {len(rows)}")

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
        for call_id, declared_by, ordinal, answered_by in conn.execute(_LEDGER, (buffer_id,))
    }
    for (call_id, declared_by), ordinal in declarations.items():
        entry = ledger.get((call_id, declared_by))
        if entry is None:
            report("ledger", f"call {call_id!r} is declared but not in the ledger", declared_by)
            continue
        if entry[0] != ordinal:
            report(
                "ledger",
                f"call {call_id!r}: the ledger says #{entry[0]} of its turn, the turn #{ordinal}",
                declared_by,
            )
        if entry[1] != results.get(call_id):
            report(
                "ledger",
                f"call {call_id!r}: the ledger says answered by {entry[1]}, "
                f"the messages say {results.get(call_id)}",
                declared_by,
            )
    for call_id, declared_by in ledger.keys() - declarations.keys():
        report(
            "ledger",
            f"the ledger holds call {call_id!r} of a turn that does not declare it",
            declared_by,
        )

    # MEM-3: no user turn after a call that has no result anywhere.
    for call_id, (declared_by, _) in expected.items():
        if call_id in results:
            continue
        later_user = next((r[0] for r in rows[index_of[declared_by] + 1 :] if r[2] == "user"), None)
        if later_user is not None:
            report("MEM-3", f"user turn after unanswered call {call_id!r}", later_user)

    # Placeholders: exact shape, and in the tool run right after their declaring turn.
    for i, (id_, _, role, metadata) in enumerate(rows):
        if role != "tool" or metadata.get("healed") is not True:
            continue
        call_id = metadata.get("tool_call_id")
        content = conn.execute("SELECT content FROM messages WHERE id = ?", (id_,)).fetchone()[0]
        if (
            not isinstance(call_id, str)
            or metadata != placeholder_metadata(call_id)
            or content != PLACEHOLDER_CONTENT
        ):
            report("placeholder", "a healed message does not have the placeholder's shape", id_)
            continue
        declaring = expected.get(call_id)
        if declaring is None:
            report("placeholder", f"placeholder for {call_id!r}, which no turn declares", id_)
            continue
        turn = index_of[declaring[0]]
        if turn >= i or any(r[2] != "tool" for r in rows[turn + 1 : i]):
            report(
                "placeholder",
                f"placeholder for {call_id!r} is not in the tool run after its declaring turn",
                id_,
            )
    return found


def as_dicts(violations: list[Violation]) -> list[dict[str, Any]]:
    """JSON-ready form, for ``flowdrop-local check --json``."""
    return [attrs.asdict(v) for v in violations]

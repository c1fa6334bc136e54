"""Export, import and backup: moving histories between files without losing anything.

The export format is JSON Lines, one message per line, in buffer then position
order::

    {"scope": ..., "scope_id": ..., "key": ..., "id": ..., "position": ...,
     "role": ..., "content": ..., "metadata": {...}, "created_at": ...}

Import validates every line before it writes anything, then writes all buffers in
one transaction through the append path, so an imported history obeys the buffer
rules exactly as if it had been appended message by message: a user turn that
follows an unanswered call (a history written by another tool) is healed, and
duplicates are dropped. Ids, positions and timestamps are kept when given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .access import resolve_address
from .buffer import check_address_part
from .engine import Placement, new_message_id
from .errors import FlowdropError, InvalidAddress, InvalidImport, InvalidMessage
from .positions import is_valid_key
from .refused import buffer_of
from .rules.incoming import Incoming, normalize

if TYPE_CHECKING:
    from .backends.base import Backend
_ADDRESS = ("scope", "scope_id", "key")


@attrs.frozen
class ImportReport:
    """What an import wrote."""

    buffers: int
    imported: int
    healed: int
    dropped: int
    replaced_buffers: int = 0


def export_records(
    db: Backend, address: tuple[str, str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """Every message (or one buffer's), as export records, in buffer and position order.

    One statement, so the export is a consistent snapshot; the rows are read
    before the first is yielded, so the store is free while the caller iterates.
    """
    with db.read() as tx:
        rows = tx.all("export_all") if address is None else tx.all("export_one", address)
    # Read whole (one statement is one snapshot), then yield without holding the store.
    for scope, scope_id, key, id_, position, role, content, parts, metadata, created in rows:
        yield {
            "scope": scope,
            "scope_id": scope_id,
            "key": key,
            "id": id_,
            "position": position,
            "role": role,
            "content": json.loads(content) if parts else content,
            "metadata": json.loads(metadata),
            "created_at": created,
        }


def parse_lines(lines: Iterable[str]) -> list[tuple[int, Mapping[str, Any]]]:
    """JSON Lines into ``(line number, record)``; blank lines are skipped."""
    records: list[tuple[int, Mapping[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InvalidImport(number, f"not valid JSON: {error}") from None
        if not isinstance(record, dict):
            raise InvalidImport(number, "a line must be a JSON object")
        records.append((number, record))
    return records


@attrs.frozen
class _Planned:
    address: tuple[str, str, str]
    lines: list[int]
    batch: list[Incoming]
    placements: list[Placement]


def _plan(records: Iterable[tuple[int, Mapping[str, Any]]]) -> list[_Planned]:
    """Validate every record and group them by buffer, before anything is written."""
    grouped: dict[tuple[str, str, str], list[tuple[int, Mapping[str, Any]]]] = {}
    seen_ids: set[str] = set()
    for number, record in records:
        address = tuple(record.get(part) for part in _ADDRESS)
        if not all(isinstance(part, str) for part in address) or not (
            address[0].strip() and address[2].strip()  # type: ignore[union-attr]
        ):
            raise InvalidImport(
                number, "scope, scope_id and key must be strings (scope, key not blank)"
            )
        for name in ("id", "position", "created_at"):
            if name in record and not isinstance(record[name], str):
                raise InvalidImport(number, f"{name} must be a string")
        if "id" in record:
            if len(record["id"]) != 36:
                raise InvalidImport(number, f"id {record['id']!r} is not a UUID")
            if record["id"] in seen_ids:
                raise InvalidImport(number, f"id {record['id']!r} appears twice")
            seen_ids.add(record["id"])
        if "position" in record and not is_valid_key(record["position"]):
            raise InvalidImport(number, f"position {record['position']!r} is not a valid key")
        grouped.setdefault(address, []).append((number, record))  # type: ignore[arg-type]

    planned = []
    for address, rows in grouped.items():
        placed = ["position" in record for _, record in rows]
        if any(placed) and not all(placed):
            raise InvalidImport(
                rows[placed.index(False) if placed[0] else placed.index(True)][0],
                f"buffer {'/'.join(address)}: give a position on every line or on none",
            )
        if all(placed):
            rows.sort(key=lambda row: row[1]["position"])
            positions = [record["position"] for _, record in rows]
            for (number, _), previous, current in zip(
                rows[1:], positions, positions[1:], strict=False
            ):
                if previous == current:
                    raise InvalidImport(number, f"position {current!r} appears twice")
        batch = []
        for number, record in rows:
            message = {
                k: v
                for k, v in record.items()
                if k not in (*_ADDRESS, "id", "position", "created_at")
            }
            try:
                batch.append(normalize(message, 0))
            except InvalidMessage as error:
                raise InvalidImport(number, f"{error.field}: {error.problem}") from None
        placements = [
            Placement(
                record.get("id") or new_message_id(),
                record.get("position"),
                record.get("created_at"),
            )
            for _, record in rows
        ]
        planned.append(_Planned(address, [number for number, _ in rows], batch, placements))
    return planned


def import_records(
    db: Backend, records: Iterable[tuple[int, Mapping[str, Any]]], *, replace: bool = False
) -> ImportReport:
    """Import validated records in one transaction; see the module docstring.

    Raises:
        InvalidImport: a bad line, or a buffer that already holds messages while
            ``replace`` is false. Nothing is written.
    """
    planned = _plan(records)
    imported = healed = dropped = replaced = 0
    first_line: dict[tuple[str, str, str], int] = {}  # resolved address -> its first line
    with db.write() as tx:
        for plan in planned:
            scope, scope_id, key = plan.address
            try:  # identity scopes judged as everywhere
                check_address_part("key", key, allow_empty=False)
                buffer = buffer_of(db, resolve_address(scope, scope_id), scope, key, None)
            except InvalidAddress as error:
                raise InvalidImport(plan.lines[0], str(error)) from None
            if buffer.refused:
                raise InvalidImport(
                    plan.lines[0],
                    f"the {plan.address[0]} scope refuses {plan.address[1]!r}: "
                    "not a usable identity",
                )
            resolved = (buffer.scope, buffer.scope_id, buffer.key)
            if resolved in first_line:
                raise InvalidImport(
                    plan.lines[0],
                    f"names buffer {'/'.join(resolved)} with another spelling of its id "
                    f"than line {first_line[resolved]}",
                )
            first_line[resolved] = plan.lines[0]
            existing = buffer.existing_id(tx)
            if existing is not None and tx.one("count", (existing,))[0]:
                if not replace:
                    raise InvalidImport(
                        plan.lines[0],
                        f"buffer {'/'.join(plan.address)} already holds messages (use --replace)",
                    )
                tx.write("clear_ledger", (existing,))
                tx.write("clear_messages", (existing,))
                replaced += 1
            try:
                result = buffer.append_in(tx, plan.batch, plan.placements)
            except InvalidMessage as error:
                raise InvalidImport(plan.lines[error.index], error.problem) from None
            except FlowdropError:
                raise
            except Exception as error:  # a constraint, e.g. an id already used elsewhere
                raise InvalidImport(None, f"buffer {'/'.join(plan.address)}: {error}") from None
            imported += result.appended
            healed += len(result.healed_ids)
            dropped += result.dropped
    return ImportReport(len(planned), imported, healed, dropped, replaced)

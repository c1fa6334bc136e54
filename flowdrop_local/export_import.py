"""Export, import and backup: moving histories between files without losing anything.

The export format is JSON Lines, one message per line, in buffer then position
order::

    {"scope": ..., "scope_id": ..., "key": ..., "id": ..., "position": ...,
     "role": ..., "content": ..., "metadata": {...}, "created_at": ...}

Format version 2 (``export(full=True)``, the CLI's ``export`` without an address,
and ``copy``) starts with a header line ``{"flowdrop_export": 2}`` and adds, before
the messages, one line per session (``"record": "session"``), per granted viewer
(``"record": "viewer"``) and per memory value (``"record": "memory"``). A message
line has no ``record`` key, so a version-1 file (messages only, no header) still
imports, and a file from a newer version is refused by its header.

Export streams: it reads one snapshot on a connection of its own
(``Backend.snapshot_rows``: a read transaction on SQLite, a REPEATABLE READ one with
a server-side cursor on PostgreSQL), a chunk of rows at a time, so memory stays
flat and the store's writers go on while the caller iterates. A ``":memory:"``
SQLite store has no file a second connection could open: its export reads every
row first, then yields them.

Import reads its input once, in order (stdin cannot be read twice), and writes
in one transaction through the append path, so an imported history obeys the
buffer rules exactly as if it had been appended message by message: a user turn
that follows an unanswered call (a history written by another tool) is healed,
and duplicates are dropped. A bad line anywhere rolls the whole transaction
back: nothing is written. Memory is bounded: lines are validated and appended a
chunk at a time (``_CHUNK`` messages or ``_CHUNK_CHARS`` characters), and a line
longer than :data:`MAX_LINE_CHARS` is refused before it is parsed. What is kept
per buffer (its address, first line, last position: a few hundred bytes) grows
with the number of buffers, not of messages.

A buffer's lines normally come in one run, in position order, as export writes
them. They may also come in several runs (lines of other buffers in between):
each run continues the buffer where the last one stopped, exactly as if the
lines had been consecutive. Positions must increase through all of a buffer's
lines; a line whose position is not above the previous one of its buffer is
refused.

Ids, positions and timestamps are kept when given. A position is kept exactly
when it is an ordinary key: well formed, at most :data:`MAX_POSITION_LENGTH`
characters, with room after it (the key an append would put next is no longer),
and above the position kept before it. Any other position is re-keyed, in
order, between its neighbours: a copy between two stores keeps every position,
and a hostile file (``"z" * 27``, the largest key, after which every append
would lengthen its key) cannot make later keys grow.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from .access import IDENTITY_SCOPES, SCOPES, resolve_address, usable_identity
from .buffer import Buffer, Placement, new_message_id, valid_address_part
from .engine import edited, notify
from .errors import (
    CorruptRow,
    FlowdropError,
    InvalidAddress,
    InvalidImport,
    InvalidMessage,
    InvalidValue,
    has_lone_surrogate,
)
from .plans import run_plan
from .positions import is_valid_key, key_between, keys_between
from .refused_buffer import buffer_of
from .rules.incoming import Incoming, incoming, valid_message_id

if TYPE_CHECKING:
    from .backends.base import Backend, Tx

_ADDRESS = ("scope", "scope_id", "key")
_NOT_MESSAGE = (*_ADDRESS, "id", "position", "created_at")

MAX_POSITION_LENGTH: Final = 16
"""The longest position an import keeps; a longer one is re-keyed.

The store's own keys stay far below it: 1,000,000 appends reach 5 characters
(``benchmarks/keys.py``), and an integer part of 16 characters takes 62**14 appends.
"""
MAX_LINE_CHARS: Final = 32 * 1024 * 1024
"""The longest import line (characters, without its newline): Anthropic's request limit."""
_CHUNK: Final = 1000  # messages appended per call to Buffer._append
_CHUNK_CHARS: Final = 8 * 1024 * 1024  # ... or fewer, once they hold this much text


@attrs.frozen
class ImportReport:
    """What an import wrote."""

    buffers: int
    imported: int
    healed: int
    dropped: int
    replaced_buffers: int = 0
    sessions: int = 0
    viewers: int = 0
    memory: int = 0
    conversations: int = 0


# ------------------------------------------------------------------------ export


def export_records(
    backend: Backend, address: tuple[str, str, str] | None = None, *, full: bool = False
) -> Iterator[dict[str, Any]]:
    """Every message (or one buffer's), as export records, in buffer and position order.

    One snapshot, read as the caller iterates (see the module docstring).

    Raises:
        InvalidAddress: ``address`` is not ``None`` or three strings (at once).
        NotADatabase: a row is damaged (invalid JSON); the error names it.
    """
    reads = export_reads(address, full=full)
    backend.ensure_open()  # StoreClosed at the call, as every other read
    rows = (
        export_record(backend.where, i, row, full=full) for i, row in backend.snapshot_rows(reads)
    )
    return itertools.chain([{"flowdrop_export": FORMAT_VERSION}], rows) if full else rows


def export_reads(
    address: tuple[str, str, str] | None, *, full: bool = False
) -> list[tuple[str, Any]]:
    """The reads (named statement, parameters) of an export, to run in one snapshot.

    Format 2 (``full``) reads sessions before the viewers that name them, then
    memory, then the messages: one snapshot, so a viewer never names a session
    left out. The header line is not a read: the caller puts it first.

    Raises:
        InvalidAddress: ``address`` is not ``None`` or three strings.
    """
    if address is not None and (
        not isinstance(address, tuple | list)
        or len(address) != 3
        or not all(isinstance(part, str) for part in address)
    ):
        raise InvalidAddress(
            "an export address is None or (scope, scope_id, key), three strings; "
            f"got a {type(address).__name__}"
            + (f" of {len(address)}" if isinstance(address, tuple | list) else "")
        )
    if address is not None and any(has_lone_surrogate(part) for part in address):
        raise InvalidAddress("an export address must not hold a lone surrogate")
    messages = ("export_all", ()) if address is None else ("export_one", tuple(address))
    if not full:
        return [messages]
    return [(f"export_{kind}", ()) for kind in _SIDE_KINDS] + [messages]


def export_record(where: str, i: int, row: tuple[Any, ...], *, full: bool) -> dict[str, Any]:
    """The export record of a row of the ``i``-th read of :func:`export_reads`."""
    if full and i < len(_SIDE_KINDS):
        return _side_record(where, _SIDE_KINDS[i], row)
    return _record(where, row)


def _record(where: str, row: tuple[Any, ...]) -> dict[str, Any]:
    scope, scope_id, key, id_, position, role, content, parts, metadata, created = row
    try:
        decoded_content = json.loads(content) if parts else content
        decoded_metadata = json.loads(metadata)
    except (ValueError, RecursionError) as error:  # JSONDecodeError is a ValueError
        raise CorruptRow(
            f"{where} is damaged: message {id_} of buffer {scope}/{scope_id}/{key} "
            f"does not hold valid JSON ({type(error).__name__}: {error})"
        ) from None
    return {
        "scope": scope,
        "scope_id": scope_id,
        "key": key,
        "id": id_,
        "position": position,
        "role": role,
        "content": decoded_content,
        "metadata": decoded_metadata,
        "created_at": created,
    }


FORMAT_VERSION: Final = 2
"""The export format this version writes (and the newest it imports)."""
# (record kind, its fields in the order of the export_<kind>s statement's columns)
_SIDE_FIELDS: Final = {
    "session": (
        "id",
        "workflow_id",
        "name",
        "owner_id",
        "status",
        "conversation",
        "metadata",
        "created_at",
        "updated_at",
    ),
    "viewer": ("session_id", "user_id", "granted_at"),
    "memory": ("scope", "scope_id", "key", "value", "created_at", "updated_at"),
    # A conversation's title and metadata (buffers that have either), before its
    # messages: an import makes the buffer, named, and the messages go into it.
    "conversation": ("scope", "scope_id", "key", "title", "metadata", "created_at"),
}
_SIDE_KINDS: Final = tuple(_SIDE_FIELDS)
_JSON_FIELDS: Final = {"metadata", "value"}


def _side_record(where: str, kind: str, row: tuple[Any, ...]) -> dict[str, Any]:
    record: dict[str, Any] = {"record": kind}
    for field, value in zip(_SIDE_FIELDS[kind], row, strict=True):
        if field in _JSON_FIELDS:
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as error:
                raise CorruptRow(
                    f"{where} is damaged: a {kind} row does not hold valid JSON in {field} "
                    f"({type(error).__name__})"
                ) from None
        record[field] = value
    return record


# ------------------------------------------------------------------------ import


def number_records(records: Iterable[object]) -> Iterator[tuple[int, object]]:
    """``(number, record)`` from 1, for :func:`import_records`; refuses a non-iterable."""
    if isinstance(records, str | bytes | Mapping) or not isinstance(records, Iterable):
        raise InvalidImport(
            None, f"records must be an iterable of mappings, not {type(records).__name__}"
        )
    return enumerate(records, start=1)


def parse_lines(lines: Iterable[str]) -> Iterator[tuple[int, object]]:
    """JSON Lines into ``(line number, record)``, read once and lazily; blank lines skipped.

    A file (anything with ``readline``) is read ``MAX_LINE_CHARS`` at a time, so
    an overlong line is refused without holding it whole.
    """
    if isinstance(lines, str | bytes) or not isinstance(lines, Iterable):
        raise InvalidImport(
            None,
            f"lines must be an iterable of strings (a file, or text.splitlines()), "
            f"not {type(lines).__name__}",
        )
    return _parsed(lines)


def _file_lines(file: Any) -> Iterator[object]:
    while line := file.readline(MAX_LINE_CHARS + 1):
        yield line


def _without_newline(line: str | bytes) -> str | bytes:
    return line.rstrip("\r\n") if isinstance(line, str) else line.rstrip(b"\r\n")


def _parsed(lines: Iterable[object]) -> Iterator[tuple[int, object]]:
    source = _file_lines(lines) if callable(getattr(lines, "readline", None)) else iter(lines)
    number = 0
    while True:
        number += 1
        try:
            line = next(source)
        except StopIteration:
            return
        except UnicodeDecodeError as error:
            raise InvalidImport(
                None, f"not UTF-8 text (at line {number} or a little after it): {error}"
            ) from None
        if not isinstance(line, str | bytes):
            raise InvalidImport(number, f"a line must be a string, not {type(line).__name__}")
        if len(line) > MAX_LINE_CHARS and len(_without_newline(line)) > MAX_LINE_CHARS:
            raise InvalidImport(
                number, f"the line is longer than {MAX_LINE_CHARS:,} characters (the limit)"
            )
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InvalidImport(number, f"not UTF-8 text: {error}") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except RecursionError:
            raise InvalidImport(number, "not valid JSON: nested too deeply") from None
        except json.JSONDecodeError as error:
            raise InvalidImport(number, f"not valid JSON: {error}") from None
        except ValueError:  # an integer longer than Python converts
            raise InvalidImport(
                number,
                f"not valid JSON here: a number has more than "
                f"{sys.get_int_max_str_digits():,} digits",
            ) from None
        if not isinstance(record, dict):
            raise InvalidImport(number, "a line must be a JSON object")
        yield number, record


def keeps_position(key: str) -> bool:
    """Whether an import keeps this (well-formed) position as given: see the module docstring."""
    return len(key) <= MAX_POSITION_LENGTH and len(key_between(key, None)) <= MAX_POSITION_LENGTH


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: SQLite cannot take it
        return False
    return True


class _Pending:
    """One validated line waiting to be appended."""

    __slots__ = ("created_at", "id", "message", "number", "position", "weight")

    def __init__(
        self, number: int, message: Incoming, id_: str, position: str | None, created: str | None
    ) -> None:
        self.number = number
        self.message = message
        self.id = id_
        self.position = position
        self.created_at = created
        self.weight = len(message.content) + len(message.metadata)


class _Run:
    """What an import keeps of each buffer it wrote, across all its runs (kept small)."""

    __slots__ = ("address", "buffer_id", "first_line", "last_final", "last_given", "placed")

    def __init__(self, address: tuple[str, str, str], first_line: int) -> None:
        self.address = address
        self.first_line = first_line
        self.buffer_id: int | None = None
        self.placed: bool | None = None  # positions on every line, or on none
        self.last_given: str | None = None  # the last position a line gave
        self.last_final: str | None = None  # the last position stored (kept or re-keyed)


class _Importer:
    """The one-transaction import, fed one record at a time.

    One buffer is in progress at a time (``run``, ``buffer``): its lines wait in
    ``ready`` (final positions known) or ``waiting`` (to be re-keyed between the
    last kept position and the next), and go to the append path a chunk at a time.
    """

    def __init__(self, backend: Backend, tx: Tx, replace: bool) -> None:
        self.backend = backend
        self.tx = tx
        self.replace = replace
        self.runs: dict[tuple[str, str, str], _Run] = {}  # resolved address -> its run
        self.run: _Run | None = None
        self.buffer: Buffer | None = None
        self.ready: list[_Pending] = []
        self.ready_weight = 0
        self.waiting: list[_Pending] = []
        self.waiting_weight = 0
        self.chunk_ids: set[str] = set()
        self.imported = self.healed = self.dropped = self.replaced = 0
        self.side = dict.fromkeys(_SIDE_FIELDS, 0)  # sessions, viewers, memory values

    def add(self, number: int, record: object) -> None:
        if not isinstance(record, Mapping):
            raise InvalidImport(
                number, f"a record must be a mapping (a JSON object), not {type(record).__name__}"
            )
        if "flowdrop_export" in record:
            version = record["flowdrop_export"]
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise InvalidImport(number, f"not a flowdrop_local export header: {version!r}")
            if version > FORMAT_VERSION:
                raise InvalidImport(
                    number,
                    f"written in export format {version}; this flowdrop_local reads up to "
                    f"{FORMAT_VERSION}: upgrade flowdrop_local",
                )
            return
        kind = record.get("record")
        if kind is not None:
            self._add_side(number, kind, record)
            return
        address = tuple(record.get(part) for part in _ADDRESS)
        if not all(isinstance(part, str) and _encodable(part) for part in address) or not (
            address[0].strip() and address[2].strip()  # type: ignore[union-attr]
        ):
            raise InvalidImport(
                number,
                "scope, scope_id and key must be strings (scope, key not blank; "
                "no lone surrogates)",
            )
        for name in ("id", "position", "created_at"):
            if name in record and not isinstance(record[name], str):
                raise InvalidImport(number, f"{name} must be a string")
            if name in record and not _encodable(record[name]):
                raise InvalidImport(number, f"{name} must be a string without lone surrogates")
        given_id = record.get("id")
        if given_id is not None:
            try:  # stored in one spelling (lower case), as an append stores it
                given_id = valid_message_id(given_id, 0)
            except InvalidMessage:
                raise InvalidImport(number, f"id {given_id!r} is not a UUID") from None
        position = record.get("position")
        if position is not None and not is_valid_key(position):
            raise InvalidImport(number, f"position {position!r} is not a valid key")
        try:
            message = incoming({k: v for k, v in record.items() if k not in _NOT_MESSAGE}, 0)
        except InvalidMessage as error:
            raise InvalidImport(number, f"{error.field}: {error.problem}") from None

        run = self.run
        if run is None or run.address != address:
            run = self._start(number, address)  # type: ignore[arg-type]
        placed = position is not None
        if run.placed is None:
            run.placed = placed
        elif run.placed != placed:
            raise InvalidImport(
                number, f"buffer {'/'.join(run.address)}: give a position on every line or on none"
            )
        if position is not None:
            if run.last_given is not None and position <= run.last_given:
                raise InvalidImport(
                    number,
                    f"position {position!r} appears twice"
                    if position == run.last_given
                    else f"position {position!r} comes before {run.last_given!r}, the position "
                    "of an earlier line of its buffer: a buffer's lines must come in position "
                    "order (as export writes them)",
                )
            run.last_given = position
        if given_id is not None:
            if given_id in self.chunk_ids:
                raise InvalidImport(number, f"id {given_id!r} appears twice")
            self.chunk_ids.add(given_id)
        self._place(
            run,
            _Pending(
                number, message, given_id or new_message_id(), position, record.get("created_at")
            ),
        )

    def _add_side(self, number: int, kind: object, record: Mapping[str, Any]) -> None:
        """A session, viewer or memory line: checked, then inserted (or refused if present)."""
        if not isinstance(kind, str) or kind not in _SIDE_FIELDS:  # a list is not hashable
            raise InvalidImport(number, f"unknown record kind {kind!r}")
        if kind == "conversation":
            self._add_conversation(number, record)
            return
        fields = _SIDE_FIELDS[str(kind)]
        values: list[Any] = []
        for field in fields:
            value = record.get(field)
            if field in _JSON_FIELDS:
                if field == "metadata" and not isinstance(value, dict):
                    raise InvalidImport(number, f"{kind} {field} must be a JSON object")
                try:
                    value = json.dumps(value, ensure_ascii=False, allow_nan=False)
                except (TypeError, ValueError, RecursionError) as error:
                    raise InvalidImport(number, f"{kind} {field} is not JSON: {error}") from None
            elif field == "conversation":
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
                    raise InvalidImport(number, "session conversation must be a small integer")
            elif field == "owner_id":
                if value is not None and usable_identity(value) != value:
                    raise InvalidImport(number, f"session owner {value!r} is not a usable identity")
            elif not isinstance(value, str) or not _encodable(value):
                raise InvalidImport(number, f"{kind} {field} must be a string")
            values.append(value)
        if kind == "memory":  # what memory_set refuses, an import refuses
            if values[0] not in SCOPES:
                raise InvalidImport(number, f"memory scope {values[0]!r} is not one of {SCOPES}")
            if not values[2].strip():
                raise InvalidImport(number, "a memory key must not be blank")
            if values[0] in IDENTITY_SCOPES and usable_identity(values[1]) != values[1]:
                raise InvalidImport(
                    number, f"the {values[0]} scope refuses {values[1]!r}: not a usable identity"
                )
        if kind == "viewer" and usable_identity(values[1]) != values[1]:
            raise InvalidImport(number, f"viewer {values[1]!r} is not a canonical usable identity")
        if kind == "session" and usable_identity(values[0]) != values[0]:
            raise InvalidImport(number, f"session id {values[0]!r} is not canonical")
        self._finish()  # a buffer in progress is done: its lines came in one run
        key = tuple(values[: {"memory": 3, "viewer": 2, "session": 1}[str(kind)]])
        if self.tx.one(f"{kind}_present", key) is not None:
            if not self.replace:
                raise InvalidImport(
                    number, f"{kind} {'/'.join(map(str, key))} already exists (use --replace)"
                )
            self.tx.run(f"{kind}_remove", key)
        try:
            self.tx.run(f"import_{kind}", tuple(values))
        except FlowdropError:
            raise
        except Exception as error:  # a constraint: a viewer of a session not in the store
            raise InvalidImport(number, f"{kind}: {error}") from None
        self.side[str(kind)] += 1

    def _add_conversation(self, number: int, record: Mapping[str, Any]) -> None:
        """A conversation's title and metadata: its buffer is made (empty) or named.

        A buffer that exists with another title or metadata is refused unless
        ``replace``; an identity scope's address is judged as a message line's.
        """
        address = tuple(record.get(part) for part in _ADDRESS)
        title, metadata, created = (record.get(f) for f in ("title", "metadata", "created_at"))
        if not all(isinstance(part, str) and _encodable(part) for part in address):
            raise InvalidImport(number, "a conversation's scope, scope_id and key are strings")
        if not isinstance(title, str) or not _encodable(title):
            raise InvalidImport(number, "a conversation's title must be a string")
        if not isinstance(metadata, dict):
            raise InvalidImport(number, "a conversation's metadata must be a JSON object")
        if created is not None and (not isinstance(created, str) or not _encodable(created)):
            raise InvalidImport(number, "a conversation's created_at must be a string")
        try:
            metadata_text = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as error:
            raise InvalidImport(number, f"conversation metadata is not JSON: {error}") from None
        self._finish()
        scope, scope_id, key = (str(part) for part in address)
        try:
            valid_address_part("key", key, allow_empty=False)
            buffer = buffer_of(self.backend, resolve_address(scope, scope_id), scope, key, None)
        except InvalidAddress as error:
            raise InvalidImport(number, str(error)) from None
        if buffer.refused:
            raise InvalidImport(number, f"the {scope} scope refuses {scope_id!r}")
        found = self.tx.one("buffer_info", buffer.address)
        if (
            found is not None
            and (found[0], json.loads(found[1])) != (title, metadata)
            and (found[0], found[1]) != ("", "{}")
            and not self.replace
        ):
            raise InvalidImport(
                number,
                f"conversation {'/'.join(buffer.address)} already has another title or "
                "metadata (use --replace)",
            )
        buffer_id = buffer.existing_id(self.tx)
        if buffer_id is None:
            self.tx.run("create_buffer", buffer.address)
            buffer_id = buffer.existing_id(self.tx)
        self.tx.run("import_conversation", (title, metadata_text, created, buffer_id))
        self.side["conversation"] += 1

    def _place(self, run: _Run, pending: _Pending) -> None:
        """Keep the line's position, or hold it until its upper neighbour is known."""
        position = pending.position
        if position is None or (
            keeps_position(position) and (run.last_final is None or position > run.last_final)
        ):
            if self.waiting:
                self._rekey(run, position)
            self.ready.append(pending)
            self.ready_weight += pending.weight
            if position is not None:
                run.last_final = position
        else:
            self.waiting.append(pending)
            self.waiting_weight += pending.weight
            if len(self.waiting) >= _CHUNK or self.waiting_weight >= _CHUNK_CHARS:
                self._rekey(run, None)  # no neighbour in sight: at the end, in order
        if len(self.ready) >= _CHUNK or self.ready_weight >= _CHUNK_CHARS:
            self._flush(run)

    def _rekey(self, run: _Run, upper: str | None) -> None:
        """New positions for the waiting lines, in order, between the last kept and ``upper``."""
        keys = keys_between(run.last_final, upper, len(self.waiting))
        for pending, key in zip(self.waiting, keys, strict=True):
            pending.position = key
            self.ready.append(pending)
            self.ready_weight += pending.weight
        run.last_final = keys[-1]
        self.waiting = []
        self.waiting_weight = 0

    def _start(self, number: int, address: tuple[str, str, str]) -> _Run:
        """Finish the buffer in progress; begin (or go on with) the one ``address`` names."""
        self._finish()
        scope, scope_id, key = address
        try:  # identity scopes judged as everywhere
            valid_address_part("key", key, allow_empty=False)
            buffer = buffer_of(self.backend, resolve_address(scope, scope_id), scope, key, None)
        except InvalidAddress as error:
            raise InvalidImport(number, str(error)) from None
        if buffer.refused:
            raise InvalidImport(
                number,
                f"the {address[0]} scope refuses {address[1]!r}: not a usable identity",
            )
        resolved = (buffer.scope, buffer.scope_id, buffer.key)
        run = self.runs.get(resolved)
        if run is not None:
            if run.address != address:
                raise InvalidImport(
                    number,
                    f"names buffer {'/'.join(resolved)} with another spelling of its id "
                    f"than line {run.first_line}",
                )
        else:  # the buffer's first line
            existing = buffer.existing_id(self.tx)
            held = None if existing is None else self.tx.one("count", (existing,))
            if existing is not None and held is not None and held[0]:  # 0: holds no message
                if not self.replace:
                    raise InvalidImport(
                        number,
                        f"buffer {'/'.join(address)} already holds messages (use --replace)",
                    )
                self.tx.write("clear_ledger", (existing,))
                self.tx.write("clear_messages", (existing,))
                run_plan(edited(existing), self.tx)
                self.replaced += 1
            run = self.runs[resolved] = _Run(address, number)
        # A later run of the same buffer goes on where the last one stopped.
        self.run, self.buffer = run, buffer
        return run

    def _finish(self) -> None:
        """Append what is left of the buffer in progress."""
        if self.run is not None:
            if self.waiting:
                self._rekey(self.run, None)
            self._flush(self.run)
            self.run = self.buffer = None

    def _flush(self, run: _Run) -> None:
        """Append the lines whose positions are known, through the append path."""
        if not self.ready:
            return
        assert self.buffer is not None
        chunk = self.ready
        self._check_ids(chunk)
        try:
            result = self.buffer.append_in(
                self.tx,
                [p.message for p in chunk],
                [Placement(p.id, p.position, p.created_at) for p in chunk],
            )
        except InvalidMessage as error:
            raise InvalidImport(chunk[error.index].number, error.problem) from None
        except FlowdropError:
            raise
        except Exception as error:  # a constraint the checks above do not foresee
            raise InvalidImport(
                None,
                f"lines {chunk[0].number}-{chunk[-1].number}, buffer "
                f"{'/'.join(run.address)}: {error}",
            ) from None
        run.buffer_id = self.buffer.existing_id(self.tx)
        if self.replace and result.message_ids:
            # A message --replace deleted and this import brings back (its id) was
            # not deleted (offline sync forgets the deletion it recorded).
            run_plan(notify("restored", list(result.message_ids)), self.tx)
        self.imported += result.appended
        self.healed += len(result.healed_ids)
        self.dropped += result.dropped
        self.ready = []
        self.ready_weight = 0
        self.chunk_ids = set()

    def _check_ids(self, chunk: list[_Pending]) -> None:
        """Refuse an id an earlier chunk of this import, or another buffer, already stored."""
        ids = {p.id: p.number for p in chunk}
        for id_, buffer_id, *address in self.tx.all("used_ids", (list(ids),)):
            mine = {run.buffer_id for run in self.runs.values()}
            raise InvalidImport(
                ids[id_],
                f"id {id_!r} appears twice"
                if buffer_id in mine
                else f"id {id_!r} is already used by a message of buffer {'/'.join(address)}",
            )

    def finish(self) -> ImportReport:
        self._finish()
        kinds = [kind for kind in ("memory", "viewer") if self.side[kind]]
        if kinds:  # written with the stamps they had (offline sync must read them)
            run_plan(notify("registers_imported", kinds), self.tx)
        return ImportReport(
            len(self.runs),
            self.imported,
            self.healed,
            self.dropped,
            self.replaced,
            self.side["session"],
            self.side["viewer"],
            self.side["memory"],
            self.side["conversation"],
        )


def import_records(
    backend: Backend, records: Iterable[tuple[int, object]], *, replace: bool = False
) -> ImportReport:
    """Import numbered records in one transaction, as they come; see the module docstring.

    Raises:
        InvalidImport: a bad line, or a buffer that already holds messages while
            ``replace`` is false. The transaction is rolled back: nothing is written.
    """
    try:
        with backend.write() as tx:
            importer = _Importer(backend, tx, replace)
            for number, record in records:
                importer.add(number, record)
            return importer.finish()
    except InvalidValue as error:  # found by the database when the writes went in
        raise InvalidImport(None, str(error)) from None

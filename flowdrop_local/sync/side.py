"""One side of a sync: its transaction, its replica id and change numbers, its
views of buffers (unchanged, grown at the end, or read whole), and the checks a
peer's rows pass before they are written (a peer is untrusted input)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from ..access import SCOPES, resolve_address
from ..backends.base import Tx
from ..buffer import valid_address_part
from ..errors import InvalidAddress, InvalidMessage, SyncRefused
from ..export_import import MAX_LINE_CHARS
from ..memory import _key as memory_key
from ..positions import is_valid_key
from ..rules.incoming import incoming
from ..rules.merge import Entry
from ..rules.order import MAX_RANK, ROOT, Link
from ..rules.pairing import PLACEHOLDER_CONTENT, marked_healed, placeholder_metadata
from ..store import Store
from .common import Address, wall_clock
from .schema import DELETED_MESSAGE, DELETED_PLACEHOLDER, REMOVED_ROW


def digest_of(rows: Iterable[tuple[str, str, str]], start: str = "") -> str:
    """A buffer's digest: a chain over its ids, positions and content fingerprints,
    in order, so the digest of a buffer grown at the end follows from the digest
    of what it held before and the new rows alone."""
    digest = start
    for id_, position, fingerprint in rows:
        line = f"{digest} {id_} {position} {fingerprint}"
        digest = hashlib.md5(line.encode(), usedforsecurity=False).hexdigest()
    return digest


class View:
    """One buffer on one side, as this sync sees it.

    ``summary``: the buffer's row id, ``updated_at`` and last row (position, tally,
    id), or None when the buffer is absent. Every library write changes it (an append
    the last row; a delete or an edit in place a strictly later ``updated_at``), and
    every change that is not an append at the end also blanks the summary recorded
    with the buffer's state at the last sync (``engine.edited``). So, against that
    recorded state, a buffer is ``unchanged`` (same summary: the recorded digest is
    its digest, nothing is read), ``grown`` (only appended to at the end since:
    only the new rows need reading), or ``other`` (read whole; also with ``full``).
    """

    __slots__ = (
        "_entries",
        "_grown",
        "_held",
        "address",
        "buffer_id",
        "full",
        "side",
        "state",
        "summary",
    )

    def __init__(self, side: Side, address: Address, full: bool) -> None:
        self.side, self.address, self.full = side, address, full
        self._held: str | None = None
        self._entries: list[Entry] | None = None
        self._grown: bool | None = None
        found = side.tx.one("sync_summary_one", address)
        if found is not None:  # lock it (PostgreSQL), then read it again: no append
            side.tx.one("lock_buffer", (found[3],))  # can slip in before the commit
            found = side.tx.one("sync_summary_one", address)
        row = side.tx.one("sync_state_one", address)
        # (digest, summary) recorded at the last sync; what it held is read if needed
        self.state: tuple[str, str] | None = None if row is None else (str(row[0]), str(row[1]))
        self.buffer_id: int | None = None if found is None else int(found[3])
        self.summary = None if found is None else summary_of(found)

    @property
    def kind(self) -> str:
        """``absent``, ``unchanged``, ``grown`` or ``other`` (see the class)."""
        if self.buffer_id is None:
            return "absent"
        if self.full or self.state is None or not self.state[1]:
            return "other"
        if self.state[1] == self.summary:
            return "unchanged"
        if self._grown is None:  # the recorded last row still stands where it stood
            buffer_id, _, last, _, last_id = self.state[1].split("|")[:5]
            found = self.side.tx.one("sync_row_at", (self.buffer_id, last)) if last else None
            self._grown = buffer_id == str(self.buffer_id) and (
                not last or (found is not None and str(found[0]).lower() == last_id.lower())
            )
        return "grown" if self._grown else "other"

    @property
    def entries(self) -> list[Entry]:
        """Every message of the buffer, read once (and counted in ``buffers_read``)."""
        if self._entries is None:
            self._entries = [] if self.buffer_id is None else self.side.entries(self.buffer_id)
            self.side.buffers_read += 1
        return self._entries

    @property
    def read(self) -> bool:
        return self._entries is not None

    @property
    def rows(self) -> list[tuple[str, str, str]]:
        return [(e.id, e.position, e.fingerprint) for e in self.entries]

    @property
    def digest(self) -> str | None:
        if self.buffer_id is None:
            return None
        if self.kind == "unchanged":
            assert self.state is not None
            return self.state[0]
        return digest_of(self.rows)

    def held_at_last_sync_text(self) -> str:
        """The recorded ids (and fingerprint prefixes) of the last sync ('' if none)."""
        if self._held is None:
            row = self.side.tx.one("sync_state_held", self.address) if self.state else None
            self._held = "" if row is None else str(row[0])
        return self._held

    def held_at_last_sync(self) -> dict[str, str]:
        """What the buffer held at the last sync: id -> fingerprint prefix ({} if none)."""
        return parse_held(self.held_at_last_sync_text())


def held_of(rows: Iterable[tuple[str, str, str]]) -> str:
    """What a buffer held, as its state keeps it: each message's id and a prefix of
    its fingerprint (for the next sync's deletions, and its one-sided edits)."""
    return " ".join(f"{id_}:{fingerprint[:12]}" for id_, _, fingerprint in rows)


def parse_held(text: str) -> dict[str, str]:
    held = {}
    for token in text.split():
        id_, _, fingerprint = token.partition(":")
        held[id_] = fingerprint
    return held


def summary_of(row: Sequence[Any]) -> str:
    """A buffer's summary from a ``sync_candidates`` row (see :class:`View`)."""
    return f"{row[3]}|{row[4]}|{row[5] or ''}|{row[6] or 0}|{row[7] or ''}"


def is_placeholder_row(role: object, metadata_text: object) -> bool:
    """:func:`~flowdrop_local.rules.pairing.marked_healed` of a stored row (its
    metadata as the JSON text it is stored as)."""
    try:
        metadata = json.loads(metadata_text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return marked_healed(role, metadata)


def deletion_kind(entry: Entry, *, by_merge: bool) -> int:
    """What deleting this row is (a tombstone's kind): a placeholder's deletion, else
    a message's (the user's, the application's) or a row's (a merge's)."""
    if is_placeholder_row(entry.role, entry.metadata):
        return DELETED_PLACEHOLDER
    return REMOVED_ROW if by_merge else DELETED_MESSAGE


def spares(kind: int, placeholder: bool) -> bool:
    """Whether a tombstone of this kind leaves the row it names: a placeholder's
    tombstone never removes a real result that replaced the placeholder in place
    (MEM-10, where the deletion had not arrived)."""
    return kind == DELETED_PLACEHOLDER and not placeholder


def tombstone_kind(path: str, row: Sequence[Any]) -> int:
    """A tombstone's kind (its row's last column), refused unless one of
    :mod:`.schema`'s kinds: a peer's file is untrusted."""
    kind = row[-1]
    if isinstance(kind, bool) or not isinstance(kind, int):
        problem = f"has the kind {str(kind)[:20]!r}"
        raise SyncRefused(path, str(row[0]), problem, kind="tombstone")
    if not DELETED_MESSAGE <= kind <= DELETED_PLACEHOLDER:
        raise SyncRefused(path, str(row[0]), f"has the kind {kind}", kind="tombstone")
    return kind


class Side:
    """One store inside the sync's transaction."""

    def __init__(self, label: str, store: Store, tx: Tx, replica: str) -> None:
        self.label = label
        self.store = store
        self.tx = tx
        self.replica = replica
        # Deletions made meanwhile are numbered after this sync (PostgreSQL: the
        # lock the deletion triggers take); this sync's own are not recorded by them.
        tx.one("sync_seq_lock")
        # What a sync reads of memory, sessions and grants it may overwrite: no write
        # may commit between its read and its write (PostgreSQL: they wait for it).
        tx.run("sync_lock_registers")
        # From here a wait is short or a deadlock in the making (a delete holding a
        # buffer this sync reads, waiting for the change numbers it holds): PostgreSQL
        # gives up on it soon, and the sync runs again (SYNC_RETRIES).
        tx.run("sync_lock_timeout")
        tx.run("sync_quiet")
        self.seq: int = tx.one("sync_last_seq")[0]
        self.first_seq = self.seq  # at the start of this sync
        self.now = str(tx.one("sync_now")[0])  # this store's clock (its stamps' bound)
        self.mark = str(tx.one("sync_mark_clock")[0])  # its newest buffer stamp
        self.views: dict[Address, View] = {}
        self.kv_then: dict[str, str] = {}  # the kv of the pair's matching mark
        self.buffers_read = 0
        self.rows_read = 0

    def view(self, address: Address, full: bool) -> View:
        if address not in self.views:
            self.views[address] = View(self, address, full)
        return self.views[address]

    def rows_for(self, statement: str, ids: Iterable[str]) -> Iterator[Any]:
        """The rows a statement taking a list of message ids gives, 500 ids a time."""
        wanted = list(dict.fromkeys(ids))
        for start in range(0, len(wanted), 500):
            yield from self.tx.all(statement, (wanted[start : start + 500],))

    def where(self, ids: Iterable[str]) -> dict[str, Address]:
        """The buffer each of these message ids is in (absent ids are left out)."""
        return {
            str(row[0]).lower(): (str(row[1]), str(row[2]), str(row[3]))
            for row in self.rows_for("sync_where", ids)
        }

    def versions(self, ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        """The recorded (fingerprint, generation) of these messages' versions."""
        return {
            str(row[0]): (str(row[1]), self._counted(row, "edit generation"))
            for row in self.rows_for("sync_versions_of", ids)
        }

    def _counted(self, row: Sequence[Any], what: str) -> int:
        """A recorded count (an edit's generation, a link's rank), refused past
        :data:`MAX_SYNC_COUNT`: a peer's file could otherwise make the next edit or
        link overflow, and every later sync fail."""
        count = int(row[2])
        if not 0 <= count <= MAX_SYNC_COUNT:
            raise SyncRefused(self.store.path, str(row[0]), f"has an {what} of {count}")
        return count

    def links(self, ids: Iterable[str]) -> dict[str, Link]:
        """The links (``rules.order``) this store holds for these messages; a peer's
        file is untrusted: a link must name a message id, never its own, and a rank
        in bounds."""
        found = {}
        for row in self.rows_for("sync_links_of", ids):
            id_, parent = str(row[0]), str(row[1])
            rank = self._counted(row, "order rank")
            if parent != ROOT and (parent == id_ or not _is_id(parent)):
                raise SyncRefused(self.store.path, id_, f"has the malformed link {parent[:40]!r}")
            found[id_] = (parent, rank)
        return found

    def link_ranks(self, parents: Iterable[str]) -> dict[str, int]:
        """For each of these messages, the highest rank among its children's links here.
        Not the root's: the root is every buffer's, and no library write puts a
        message before a buffer's first (its children are those the merge read)."""
        wanted = [p for p in parents if p != ROOT]
        return {str(row[0]): int(row[1]) for row in self.rows_for("sync_link_ranks", wanted)}

    def placeholders(self, ids: Iterable[str]) -> set[str]:
        """Which of these message ids are placeholders here (lower-case ids)."""
        rows = self.rows_for("sync_where", ids)
        return {str(row[0]).lower() for row in rows if is_placeholder_row(row[4], row[5])}

    def tombstoned(self, ids: Iterable[str]) -> dict[str, int]:
        """The tombstones this store holds for these message ids: id -> its kind."""
        return {
            str(row[0]): tombstone_kind(self.store.path, row)
            for row in self.rows_for("sync_tombstones_held", ids)
        }

    def tombstone(self, rows: Sequence[tuple[str, Address, int]]) -> None:
        """Record deleted message ids (with what each deletion was: ``kind``) with this
        side's next sequence numbers; a tombstone held for one of them already stays
        unless the new one is stronger (a lower kind: it is numbered again)."""
        now = wall_clock()
        params = []
        for id_, address, kind in rows:
            self.seq += 1
            params.append((id_, *address, self.seq, now, kind))
        if params:
            self.tx.many("sync_tombstone_put", params)

    def entries(self, buffer_id: int) -> list[Entry]:
        found = [self._checked(Entry(*row)) for row in self.tx.all("sync_light", (buffer_id,))]
        self.rows_read += len(found)
        return found

    def entries_from(self, buffer_id: int, start: str) -> list[Entry]:
        """The buffer's messages at and after position ``start`` ('': all)."""
        if not start:
            return self.entries(buffer_id)
        rows = self.tx.all("sync_light_from", (buffer_id, start))
        found = [self._checked(Entry(*row)) for row in rows]
        self.rows_read += len(found)
        return found

    def contents(self, ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        found = {str(row[0]): (row[1], row[2]) for row in self.rows_for("sync_contents", ids)}
        for id_, (content, _) in found.items():
            if len(content) > MAX_MESSAGE_CHARS:
                raise SyncRefused(
                    self.store.path, id_, f"is longer than {MAX_MESSAGE_CHARS:,} characters"
                )
        return found

    def _checked(self, entry: Entry) -> Entry:
        """An entry as read from this side, refused unless an import would take it."""
        problem = row_problem(entry)
        if problem is not None:
            raise SyncRefused(self.store.path, entry.id, problem)
        return entry


# What a sync takes from a side, as an import would (a peer is untrusted input):
MAX_SYNC_POSITION: Final = 255
"""The longest position key a sync takes (a longer one makes every key after it as
long; the library's own keys stay under 10 characters in any ordinary history)."""


MAX_MESSAGE_CHARS: Final = MAX_LINE_CHARS
# The most edits of one message (or the highest rank) a sync takes as recorded: far beyond any
# real history, far below where a count overflows.
MAX_SYNC_COUNT: Final = MAX_RANK
"""The largest content a sync takes: an import's longest line."""


def _is_id(text: str) -> bool:
    """Whether ``text`` is a message id as the library writes it (a UUID, lower case)."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def row_problem(entry: Entry) -> str | None:
    """Why a row may not travel (None: it may): its key, its size, its healed mark."""
    if not is_valid_key(entry.position):
        return f"has the malformed position key {entry.position[:40]!r}"
    if len(entry.position) > MAX_SYNC_POSITION:
        return (
            f"has a position key of {len(entry.position):,} characters "
            f"(at most {MAX_SYNC_POSITION})"
        )
    if len(entry.metadata) > MAX_MESSAGE_CHARS:
        return f"has metadata longer than {MAX_MESSAGE_CHARS:,} characters"
    if entry.role == "tool" or "healed" in entry.metadata:  # (JSON may escape the key)
        metadata = json.loads(entry.metadata)
        if metadata.get("healed") is True:
            call_id = metadata.get("tool_call_id")
            if (
                entry.role != "tool"
                or not isinstance(call_id, str)
                or metadata != placeholder_metadata(call_id)
            ):
                return "is marked healed but is no placeholder"
    return None


def message_problem(entry: Entry, content: str, parts: int) -> str | None:
    """Why a peer's message may not be written here (None: it may): the checks an
    append and an import make of a message (roles, content and its parts, metadata,
    tool calls and the id a result answers), run on the row as stored."""
    try:
        record = {
            "role": entry.role,
            "content": json.loads(content) if parts else content,
            "metadata": json.loads(entry.metadata),
        }
        incoming(record, 0)
    except (InvalidMessage, ValueError) as error:
        return f"is not a message an import takes ({error})"
    return None


def address_problem(scope: str, scope_id: str, key: str, *, memory: bool = False) -> str | None:
    """Why a peer's buffer (or memory value) address may not be written here: the
    checks ``Store.buffer`` (or ``memory_set``) and an import make of it."""
    try:
        if memory and scope not in SCOPES:  # memory lives in the library's scopes only
            raise InvalidAddress(f"scope must be one of {', '.join(SCOPES)}; got {scope!r}")
        resolved = resolve_address(scope, scope_id)
        if memory:
            memory_key(key)
        else:
            valid_address_part("scope_id", scope_id, allow_empty=True)
            valid_address_part("key", key, allow_empty=False)
    except InvalidAddress as error:
        return f"is at an address an import refuses ({error})"
    if resolved.refused or (resolved.scope, resolved.scope_id) != (scope, scope_id):
        return "is at an address the library would not write (not a usable identity)"
    return None


def placeholder_problem(entry: Entry, content: str) -> str | None:
    """A healed mark on a row whose content is not the placeholder's."""
    if (
        entry.role == "tool"
        and content != PLACEHOLDER_CONTENT
        and json.loads(entry.metadata).get("healed") is True
    ):
        return "is marked healed but is no placeholder"
    return None

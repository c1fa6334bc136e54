"""Sessions: a conversation with an owner or nobody, readable by granted viewers.

Storage (schema.sql): ``sessions`` and ``session_viewers``. A session's
conversation is the buffer ``("session", id, "conversation-<n>")``, in the ordinary
buffers and messages tables; a reset increments ``n``, so earlier conversations
stay stored and readable.

Invariants:

* Every method of :class:`Sessions` loads the session and asks
  :func:`access.decide` under the store's lock, and a write does both inside the
  ``BEGIN IMMEDIATE`` transaction that acts on them: the decision and the effect
  see the same row, and a denial rolls back, so nothing of it takes effect. A
  drive holds the lock from the decision to the commit of the ordinary
  ``Buffer.append`` (the append path is not duplicated here).
* A read decides and reads in one read transaction (one snapshot): a revoke or a
  turn committed by another connection in between is either wholly before it or
  wholly after it.
* A session has one id, its canonical form (:func:`access.usable_identity`): the
  caller's id is canonicalised before the row is looked up, so the row the
  decision judges and the buffer ``("session", id, ...)`` read or written are
  addressed by the same string. A stored row whose id is not canonical (it would
  share its buffer with another session) cannot be loaded.
* A non-admin gets the same denial for a session (or message) that does not exist
  as for one it may not see (``<action>_denied``, the id it asked about): only an
  admin is told ``session_unavailable``.
* Viewing and driving are separate permissions (MEM-9). A drive runs under the
  context :func:`context_for` builds: the session's owner as ``user_id`` when the
  owner is a real user, else no user at all, never the caller (MEM-8).
* Session messages are updated or deleted only by an admin; a message whose
  session cannot be loaded is denied (MEM-15). A MEM-10 placeholder replacement
  happens inside an append, so it is part of a drive, not an edit.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from . import engine
from ._deprecated import renamed
from .access import (
    AccessDenied,
    AccessHook,
    ExecutionContext,
    Identifier,
    Principal,
    SessionFacts,
    decide,
    resolve_scope,
    usable_identity,
)
from .buffer import Buffer
from .engine import new_message_id, validate_batch
from .errors import (
    InvalidContext,
    InvalidMessage,
    InvalidSession,
    SessionStopped,
    shown,
    stored_json,
)
from .model import AppendResult, Message
from .plans import run_plan
from .refused_buffer import buffer_of
from .rules.incoming import MAX_STORED_BYTES, stored_content, too_big

if TYPE_CHECKING:
    from .backends.base import Backend, Tx

_STATUSES: Final = ("active", "stopped")


def conversation_key(n: int) -> str:
    """The buffer key of a session's ``n``-th conversation (0 until the first reset)."""
    return f"conversation-{n}"


@attrs.frozen
class Session:
    """A session as stored. ``owner_id`` is None when it is owned by nobody."""

    id: str
    workflow_id: str
    name: str
    owner_id: str | None
    status: str
    conversation: int
    conversation_key: str
    metadata: dict[str, Any]
    created_at: str
    updated_at: str


@attrs.frozen
class Turn:
    """What a drive did: the append report and the context the turn runs under."""

    session: Session
    context: ExecutionContext
    result: AppendResult


def context_for(session: Session) -> ExecutionContext:
    """The execution context a turn of ``session`` runs under (MEM-8).

    ``user_id`` is the owner when the owner is a real user, else None, so that an
    ownerless session's ``user`` scope refuses. The caller's identity is not an
    argument: it cannot leak in.
    """
    return ExecutionContext(
        user_id=usable_identity(session.owner_id),
        session_id=session.id,
        workflow_id=session.workflow_id,
    )


class _Owner(enum.Enum):
    SELF = "self"


SELF: Final = _Owner.SELF
_SessionList = list[Session]
_Messages = list[Message]
_Rows = list[dict[str, Any]]
_SessionViewers = list[str]
_Content = str | list[Any]


def _text(name: str, value: object, *, blank: bool) -> str:
    if not isinstance(value, str):
        raise InvalidSession(f"{name} must be a string, not {type(value).__name__}")
    if not blank and not value.strip():
        raise InvalidSession(f"{name} must not be blank")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSession(f"{name} contains a lone surrogate") from None
    return value


def _user(name: str, value: object) -> str:
    user = usable_identity(value)
    if user is None:
        raise InvalidSession(f"{name} {shown(value)} is not a usable user identity")
    return user


def _session_id(value: object) -> str | None:
    """The canonical id of a session the caller names, or None when it names none.

    Canonical as every buffer address is (``" abc "`` is ``"abc"``), so the row
    looked up and the conversation buffer are addressed by one string.
    """
    return usable_identity(_text("session id", value, blank=True))


def _metadata(value: object) -> str:
    if value is None:
        return "{}"
    if not isinstance(value, Mapping):
        raise InvalidSession(f"metadata must be a JSON object, not {type(value).__name__}")
    try:
        text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidSession(f"metadata must be a JSON object: {error}") from None
    if too_big(text):
        raise InvalidSession(f"metadata takes more than {MAX_STORED_BYTES:,} bytes as JSON")
    return text


def _row_to_session(row: tuple[Any, ...]) -> tuple[Session, SessionFacts]:
    sid, workflow_id, name, owner_id, status, n, metadata, created_at, updated_at, viewers = row
    session = Session(
        sid,
        workflow_id,
        name,
        owner_id,
        status,
        n,
        conversation_key(n),
        stored_json(metadata, "the metadata of session {}", sid),
        created_at,
        updated_at,
    )
    viewers = stored_json(viewers, "the viewers of session {}", sid)
    return session, SessionFacts(sid, owner_id, frozenset(viewers))


class Sessions:
    """The sessions API, acting as one :class:`Principal` (``store.sessions(principal)``).

    Raises, from every method:
        AccessDenied: the principal may not do this (``error_code`` says why);
            nothing took effect.
        InvalidSession, InvalidMessage: bad input; nothing was written.
    """

    def __init__(
        self,
        backend: Backend,
        principal: Principal,
        hooks: Callable[[], tuple[AccessHook, ...]] = tuple,
    ) -> None:
        if not isinstance(principal, Principal):
            raise InvalidContext(f"principal must be a Principal, not {type(principal).__name__}")
        self.backend = backend
        self.principal = principal
        self._hooks = hooks

    @property
    def db(self) -> Backend:
        """Deprecated: :attr:`backend` (``Store.db`` is a sqlite-utils view; this was
        the backend). Goes in the next release."""
        renamed("Sessions.db is now Sessions.backend")
        return self.backend

    def __repr__(self) -> str:
        return f"<Sessions of {self.backend.where!r} as {self.principal!r}>"

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _load(
        tx: Tx, session_id: str | None, *, lock: bool = False
    ) -> tuple[Session, SessionFacts] | None:
        """The session with this canonical id, or None (a None id names no session).

        ``lock``: in a write, lock the session's row until the commit, so no revoke,
        stop or grant can commit between the decision and the write it allows.
        """
        if session_id is None:
            return None
        row = tx.one("session_lock" if lock else "session_load", (session_id,))
        return None if row is None else _row_to_session(row)

    def _require(
        self, action: str, loaded: tuple[Session, SessionFacts] | None, asked: str | None
    ) -> Session:
        """Decide through access.decide(); raise AccessDenied, or return the session.

        ``asked``: the session id the caller named (None for a message's session). A
        non-admin's denial carries it, whether or not a session was found.
        """
        decision = decide(
            self.principal, action, None if loaded is None else loaded[1], self._hooks()
        )
        if not decision.allowed:
            session_id = (decision.session_id or asked) if self.principal.admin else asked
            raise AccessDenied(
                decision.error_code, decision.reason, action=action, session_id=session_id
            )
        assert loaded is not None
        return loaded[0]

    def _allowed(self, action: str, facts: SessionFacts) -> bool:
        return decide(self.principal, action, facts, self._hooks()).allowed

    def _change(self, session_id: object, action: str, statement: str, *args: object) -> Session:
        """Decide ``action``, run ``statement`` with ``(*args, session id)``, in one transaction."""
        sid = _session_id(session_id)
        with self.backend.write() as tx:
            self._require(action, self._load(tx, sid, lock=True), sid)
            tx.write(statement, (*args, sid))
            tx.write("session_touch", (sid,))
            loaded = self._load(tx, sid)
        assert loaded is not None
        return loaded[0]

    # ---------------------------------------------------------- create and read

    def create(
        self,
        workflow_id: str,
        *,
        name: str = "",
        metadata: Mapping[str, Any] | None = None,
        owner: Identifier | _Owner | None = SELF,
    ) -> Session:
        """Create a session of ``workflow_id``, owned by the principal by default.

        ``owner``: only an admin may name another owner, or ``None`` for a session
        owned by nobody (which only an admin can then drive).

        Raises:
            AccessDenied: ``create_denied``: a non-admin creating a session it would
                not own (an anonymous principal always: it owns nothing).
        """
        workflow = _text("workflow id", workflow_id, blank=False)
        title = _text("name", name, blank=True)
        meta = _metadata(metadata)
        owner_id = (
            self.principal.identity
            if owner is SELF
            else None
            if owner is None
            else _user("owner", owner)
        )
        sid = new_message_id()
        with self.backend.write() as tx:
            decide(self.principal, "create", SessionFacts(sid, owner_id), self._hooks()).enforce()
            tx.write("session_insert", (sid, workflow, title, owner_id, meta))
            loaded = self._load(tx, sid)
        assert loaded is not None
        return loaded[0]

    def get(self, session_id: str) -> Session:
        """The session, if the principal may view it."""
        sid = _session_id(session_id)
        with self.backend.read() as tx:
            return self._require("view", self._load(tx, sid), sid)

    def list(self, *, workflow_id: str | None = None) -> _SessionList:
        """The sessions the principal may view, oldest first (all of them for an admin).

        An anonymous non-admin principal sees none: it owns nothing and no grant
        names it.
        """
        if workflow_id is not None:
            workflow_id = _text("workflow id", workflow_id, blank=False)
        me = self.principal.identity
        with self.backend.read() as tx:
            if self.principal.admin:
                rows = tx.all("session_list_all", (workflow_id,))
            elif me is None:
                rows = []
            else:
                rows = tx.all("session_list_for", (me, workflow_id))
        # A row whose id is not canonical cannot be loaded, so it is not listed either.
        loaded = [_row_to_session(row) for row in rows if usable_identity(row[0]) == row[0]]
        return [session for session, facts in loaded if self._allowed("view", facts)]

    def read(
        self, session_id: str, limit: int | None = None, *, conversation: int | None = None
    ) -> _Rows:
        """The session's conversation as ``Buffer.read`` gives it, if the principal may view it.

        ``conversation``: an earlier conversation (0 is the first); default the current one.
        """
        with self.backend.read() as tx:  # the decision and the rows: one snapshot
            return self._conversation(tx, session_id, conversation).read_in(tx, limit)

    def messages(
        self, session_id: str, limit: int | None = None, *, conversation: int | None = None
    ) -> _Messages:
        """The session's conversation as :class:`Message` records, if the principal may view it."""
        with self.backend.read() as tx:  # the decision and the rows: one snapshot
            return self._conversation(tx, session_id, conversation).messages_in(tx, limit)

    def _conversation(self, tx: Tx, session_id: object, conversation: int | None) -> Buffer:
        sid = _session_id(session_id)
        if conversation is not None and (
            not isinstance(conversation, int) or isinstance(conversation, bool) or conversation < 0
        ):
            raise InvalidSession(
                f"conversation must be a non-negative integer, not {shown(conversation)}"
            )
        session = self._require("view", self._load(tx, sid), sid)
        n = session.conversation if conversation is None else conversation
        if n > session.conversation:
            raise InvalidSession(
                f"session {session.id} has conversations 0 to {session.conversation}, "
                f"not {shown(n)}"
            )
        return self._buffer(context_for(session), conversation_key(n))

    def _buffer(self, context: ExecutionContext, key: str) -> Buffer:
        return buffer_of(self.backend, resolve_scope(context, "session"), "session", key, None)

    # ----------------------------------------------------------------- driving

    def drive(
        self,
        session_id: str,
        messages: Mapping[str, Any] | Message | Iterable[Mapping[str, Any] | Message],
    ) -> Turn:
        """Send a turn: append ``messages`` to the current conversation (owner or admin).

        The decision and the append (healing, deduplication, MEM-10 replacement)
        are one write transaction: no writer, in this process or another, can stop
        the session between them.

        Returns:
            A :class:`Turn`: its ``context`` carries the owner, never the caller (MEM-8).

        Raises:
            AccessDenied: ``drive_denied`` for a viewer, a stranger or anyone anonymous.
            SessionStopped: the session is stopped; nothing was appended.
        """
        sid = _session_id(session_id)
        batch = validate_batch(messages)  # bad input is refused before any decision
        with self.backend.write() as tx:
            session = self._require("drive", self._load(tx, sid, lock=True), sid)
            if session.status != "active":
                raise SessionStopped(f"session {sid} is {session.status}; resume it first")
            context = context_for(session)
            buffer = self._buffer(context, session.conversation_key)
            # A refused buffer's append writes nothing (MEM-7).
            result = buffer.append(messages) if buffer.refused else buffer.append_in(tx, batch)
        return Turn(session, context, result)

    def context(self, session_id: str) -> ExecutionContext:
        """The context a turn of this session runs under (drive permission: it spends
        the owner's memory)."""
        sid = _session_id(session_id)
        with self.backend.read() as tx:
            return context_for(self._require("drive", self._load(tx, sid), sid))

    def stop(self, session_id: str) -> Session:
        """Stop the session: no turn is accepted until :meth:`resume` (owner or admin)."""
        return self._change(session_id, "drive", "session_set_status", "stopped")

    def resume(self, session_id: str) -> Session:
        """Accept turns again (owner or admin)."""
        return self._change(session_id, "drive", "session_set_status", "active")

    def reset(self, session_id: str) -> Session:
        """Start a fresh conversation; the old one stays stored (owner or admin)."""
        return self._change(session_id, "drive", "session_reset")

    # ------------------------------------------------------------------ sharing

    def grant(self, session_id: str, user_id: Identifier) -> None:
        """Let ``user_id`` read the session, not drive it (owner or admin)."""
        user = _user("viewer", user_id)
        self._change(session_id, "grant", "session_grant", user)

    def revoke(self, session_id: str, user_id: Identifier) -> None:
        """Withdraw a view grant; no error if there was none (owner or admin)."""
        user = _user("viewer", user_id)
        self._change(session_id, "grant", "session_revoke", user)

    def viewers(self, session_id: str) -> _SessionViewers:
        """The users granted view access (owner or admin)."""
        sid = _session_id(session_id)
        with self.backend.read() as tx:
            self._require("grant", self._load(tx, sid), sid)
            return [row[0] for row in tx.all("session_viewers", (sid,))]

    # ---------------------------------------------------- the administrative tier

    def delete_conversation(self, session_id: str, *, conversation: int | None = None) -> int:
        """Delete one of the session's conversations: its buffer, messages and ledger
        (admin only, MEM-15: it deletes session messages). The session stays.

        ``conversation``: which one (0 is the first); default the current one, which
        then reads as empty until the next turn. Returns how many messages went.

        Raises:
            AccessDenied: ``delete_denied`` for anyone but an admin, owner included
                (whether or not the session exists); for an admin,
                ``session_unavailable`` when the session cannot be loaded.
            InvalidSession: ``conversation`` is not one of the session's.
        """
        sid = _session_id(session_id)
        with self.backend.write() as tx:
            session = self._require("delete", self._load(tx, sid, lock=True), sid)
            n = self._conversation_number(session, conversation)
            buffer = self._buffer(context_for(session), conversation_key(n))
            return buffer.delete_in(tx)

    @staticmethod
    def _conversation_number(session: Session, conversation: int | None) -> int:
        if conversation is None:
            return session.conversation
        if (
            not isinstance(conversation, int)
            or isinstance(conversation, bool)
            or not (0 <= conversation <= session.conversation)
        ):
            raise InvalidSession(
                f"session {session.id} has conversations 0 to {session.conversation}, "
                f"not {shown(conversation)}"
            )
        return conversation

    def _message_session(self, tx: Tx, message_id: str) -> tuple[Session, SessionFacts] | None:
        """The session a message belongs to, or None when it cannot be loaded."""
        home = tx.one("message_home", (message_id,))
        if home is None or home[0] != "session" or usable_identity(home[1]) != home[1]:
            return None
        return self._load(tx, home[1], lock=True)  # only the admin's writes ask

    def update_message(self, message_id: str, content: _Content) -> Message:
        """Replace a session message's content (admin only, MEM-15).

        Its place, role and metadata stay: tool pairing is not edited here, and a
        healed placeholder is not edited at all (the real result replaces it by an
        append, MEM-10).

        Raises:
            AccessDenied: ``edit_denied`` for anyone but an admin (whether or not the
                message exists); for an admin, ``session_unavailable`` when the
                message's session cannot be loaded.
        """
        mid = _text("message id", message_id, blank=True)
        text, parts = stored_content(content, 0)
        if too_big(text):
            raise InvalidMessage(0, "content", f"takes more than {MAX_STORED_BYTES:,} bytes")
        with self.backend.write() as tx:
            self._require("edit", self._message_session(tx, mid), None)
            if tx.one("is_placeholder", (mid,))[0]:
                raise InvalidMessage(
                    0, "content", "a healed placeholder is replaced by appending its real result"
                )
            tx.write("update_message", (text, parts, mid))
            home = tx.one("message_for_removal", (mid,))
            run_plan(engine.edited(home[0]), tx)
            row = tx.one("message_by_id", (mid,))
        id_, position, role, stored, stored_parts, metadata, created_at = row
        return Message(
            id_,
            position,
            role,
            stored_json(stored, "message {}", id_) if stored_parts else stored,
            stored_json(metadata, "message {}", id_),
            created_at,
        )

    def delete_message(self, message_id: str) -> None:
        """Delete a session message (admin only, MEM-15).

        The buffer rules hold afterwards (:func:`~flowdrop_local.engine.remove_message`):
        a deleted turn takes its calls' placeholders with it, and a call left
        unanswered before a user turn is healed in the same transaction.

        Raises:
            AccessDenied: ``delete_denied`` for anyone but an admin (whether or not the
                message exists); for an admin, ``session_unavailable`` when the
                message's session cannot be loaded.
        """
        mid = _text("message id", message_id, blank=True)
        with self.backend.write() as tx:
            self._require("delete", self._message_session(tx, mid), None)
            run_plan(engine.remove_message(mid), tx)

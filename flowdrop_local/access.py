"""Identity scopes and session permissions: the two decisions, each made in one place.

Pure: no SQL, no I/O but the refusal warning. The store calls in here; nothing
here calls the store.

Invariants kept by this module:

* :func:`usable_identity` is the only definition of a usable identity. Every test
  of a user or session id (scope resolution, session owners, viewers, principals)
  goes through it, so "who is somebody" cannot mean two things.
* :func:`resolve_scope` is the only place a memory scope is resolved or refused
  (MEM-6, MEM-7, MEM-13). A refusal is reported as ``refused=True`` with the
  resolved id ``""``, and logs exactly one warning naming node, pipeline and
  workflow. Consumers check ``refused`` before they touch storage.
* :func:`decide` is the only place a session permission is decided (MEM-8, MEM-9,
  MEM-15). Extension hooks are consulted only after the rules allowed, and can only
  turn that into a denial: nothing a hook returns or raises can grant.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, NoReturn, cast

import attrs

from .errors import FlowdropError, InvalidAddress, InvalidContext, shown

log = logging.getLogger("flowdrop_local.access")

Identifier = int | str
Scope = Literal["global", "workflow", "pipeline", "execution", "session", "user"]
__all__ = [
    "IDENTITY_SCOPES",
    "SCOPES",
    "AccessDenied",
    "AccessRequest",
    "ExecutionContext",
    "Principal",
    "ScopeResolution",
    "resolve_scope",
    "usable_identity",
]

SCOPES: Final[tuple[str, ...]] = ("global", "workflow", "pipeline", "execution", "session", "user")
# Scopes whose bucket belongs to somebody: they refuse rather than degrade to "".
IDENTITY_SCOPES: Final = frozenset({"user", "session"})
# The context field each scope resolves from (global resolves from nothing).
_SCOPE_FIELD: Final[Mapping[str, str | None]] = {
    "global": None,
    "workflow": "workflow_id",
    "pipeline": "pipeline_id",
    "execution": "execution_id",
    "session": "session_id",
    "user": "user_id",
}
# A decimal spelling of an integer; zero or negative ones denote nobody.
_DECIMAL: Final = re.compile(r"([+-]?)(\d+)")


def usable_identity(value: object) -> str | None:
    """The canonical id ``value`` stands for, or None when it identifies nobody.

    Usable: a positive ``int`` (never a ``bool``), or a ``str`` that after trimming
    whitespace is non-empty, printable, and not a decimal spelling of zero or of a
    negative number. ``0`` and ``"0"`` are what an owner-less record reports for "no
    owner" (MEM-6), so they are nobody, like ``None``, ``""`` and ``"  "``. The
    canonical id is the trimmed string, ``str(n)`` for an int: ``7`` and ``"7"``
    are one user. An int too long to write in decimal (more than
    ``sys.get_int_max_str_digits()`` digits) has no canonical id: nobody.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _decimal(value) if value > 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or not text.isprintable():
        return None
    number = _DECIMAL.fullmatch(text)
    # int() per digit: a whole-string int() has a length limit, and \d matches
    # every script's digits, whose zeros denote nobody too.
    if number and (number[1] == "-" or not any(int(d) for d in number[2])):
        return None
    return text


def _decimal(value: int) -> str | None:
    """``str(value)``, or None past Python's int-to-str digit limit (a ValueError)."""
    try:
        return str(value)
    except ValueError:
        return None


def _writable_id(
    instance: object, attribute: attrs.Attribute[Identifier | None], value: Identifier | None
) -> None:
    """Refuse an int id that cannot be written in decimal: it could never be compared,
    logged or shown, so it is malformed rather than judged (pass such an id as a str)."""
    if isinstance(value, int) and not isinstance(value, bool) and _decimal(value) is None:
        raise InvalidContext(
            f"{attribute.name} is {shown(value)}; an int id that long cannot be written "
            "as text (pass it as a string)"
        )


def valid_scope_name(scope: object) -> str:
    """A scope name as an address takes it: printable ASCII, no surrounding whitespace.

    Scope names are identifiers the application chooses, so this costs nothing
    legitimate, and it is what makes the identity-scope typo guard complete:
    look-alikes such as ``"user\\u200b"``, ``"u\\u0455er"`` (Cyrillic dze), ``"u\\u017fer"``
    (long s) or ``"user\\x00"`` cannot name an ordinary, shared scope.

    Raises:
        InvalidAddress: not a string, blank, or not such a name.
    """
    if not isinstance(scope, str):
        raise InvalidAddress(f"scope must be a string, not {type(scope).__name__}")
    if not scope.strip():
        raise InvalidAddress("scope must not be blank")
    if not (scope.isascii() and scope.isprintable()) or scope != scope.strip():
        raise InvalidAddress(
            f"scope {shown(scope)} must be printable ASCII without surrounding whitespace"
        )
    return scope


# ---------------------------------------------------------------- contexts


@attrs.frozen
class ExecutionContext:
    """Who and what a memory read or write runs for.

    Fields are kept as given, usable or not: judging them is
    :func:`resolve_scope`'s job, so that a context carrying ``user_id=0`` refuses
    the ``user`` scope instead of failing to be built. Only an int too long to
    write in decimal is refused here (``InvalidContext``): it cannot even be shown.
    """

    user_id: Identifier | None = attrs.field(default=None, validator=_writable_id)
    session_id: Identifier | None = attrs.field(default=None, validator=_writable_id)
    workflow_id: Identifier | None = attrs.field(default=None, validator=_writable_id)
    pipeline_id: Identifier | None = attrs.field(default=None, validator=_writable_id)
    execution_id: Identifier | None = attrs.field(default=None, validator=_writable_id)
    node_id: Identifier | None = attrs.field(default=None, validator=_writable_id)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecutionContext:
        """Build a context from a mapping such as the spec examples' ``{"user_id": 0}``.

        Values are taken verbatim (no coercion: ``0`` and ``"0"`` stay what they are).

        Raises:
            InvalidContext: ``data`` is not a mapping, or names an unknown field.
        """
        if not isinstance(data, Mapping):
            raise InvalidContext(f"a context must be a mapping, not {type(data).__name__}")
        known = {field.name for field in attrs.fields(cls)}
        unknown = sorted(str(name) for name in data if name not in known)
        if unknown:
            raise InvalidContext(f"unknown context field(s): {', '.join(unknown)}")
        return cls(**data)


@attrs.frozen
class ScopeResolution:
    """The outcome of resolving a scope: a bucket id, or a refusal.

    ``scope_id`` is ``""`` both for a refusal and for the shared bucket of a
    non-identity scope; ``refused`` is what tells them apart (MEM-7).
    """

    scope: str
    scope_id: str
    refused: bool = False
    reason: str = ""


def resolve_scope(context: ExecutionContext | None, scope: str) -> ScopeResolution:
    """Resolve ``scope`` for ``context``: the one decision every consumer honours.

    ``global`` resolves to ``""``. ``workflow``, ``pipeline`` and ``execution``
    resolve to the context's id for them, or to ``""`` (their shared bucket) when it
    has none. ``user`` and ``session`` resolve to the usable id, and otherwise
    refuse (MEM-6, MEM-13): a refusal logs one warning and selects no bucket.

    Raises:
        InvalidAddress: ``scope`` is not one of :data:`SCOPES`.
        InvalidContext: ``context`` is neither an ExecutionContext nor None.
    """
    if not isinstance(scope, str) or scope not in _SCOPE_FIELD:
        raise InvalidAddress(f"scope must be one of {', '.join(SCOPES)}; got {shown(scope)}")
    if context is not None and not isinstance(context, ExecutionContext):
        raise InvalidContext(
            f"context must be an ExecutionContext or None, not {type(context).__name__}"
        )
    field = _SCOPE_FIELD[scope]
    raw = None if context is None or field is None else getattr(context, field)
    resolved = usable_identity(raw)
    if scope not in IDENTITY_SCOPES:
        return ScopeResolution(scope, resolved or "")
    if resolved is not None:
        return ScopeResolution(scope, resolved)
    if context is None:
        reason = "no execution context"
    elif raw is None:
        reason = f"the context carries no {field}"
    elif isinstance(raw, int | str) and not isinstance(raw, bool) and str(raw).strip() == "0":
        reason = f"{field} {shown(raw)} denotes nobody"
    else:
        reason = f"{field} {shown(raw)} is not a usable identifier"
    refusal = ScopeResolution(scope, "", refused=True, reason=reason)
    _warn_refusal(context, refusal)
    return refusal


def resolve_address(scope: str, scope_id: object) -> ScopeResolution:
    """Resolve an explicit ``(scope, scope_id)`` address, as ``Store.buffer`` takes it.

    An identity scope is judged by :func:`resolve_scope`, from a context carrying
    ``scope_id`` as its id, so an explicit ``store.buffer("user", "0", ...)`` refuses
    exactly as a context would. Any other scope name is returned as given: the
    address is the application's own (trusted tier), checked by ``Buffer``.
    """
    valid_scope_name(scope)
    if scope in IDENTITY_SCOPES:
        field = _SCOPE_FIELD[scope]
        assert field is not None
        identity = cast("Identifier | None", scope_id)  # judged, not trusted
        if isinstance(identity, int) and not isinstance(identity, bool) and not _decimal(identity):
            raise InvalidAddress(f"scope_id is {shown(identity)}; pass an id that long as a string")
        return resolve_scope(ExecutionContext(**{field: identity}), scope)
    if scope.lower() in IDENTITY_SCOPES:
        # 'User' would be an ordinary, shared scope: a typo must not become the
        # leak the identity scopes exist to prevent (look-alikes are not ASCII).
        raise InvalidAddress(
            f"scope {scope!r} is not the identity scope {scope.lower()!r}; "
            "write identity scopes exactly"
        )
    _warn_near_identity(scope)
    return ScopeResolution(scope, scope_id)  # type: ignore[arg-type]  # Buffer checks it


_NEAR_WARNED: set[str] = set()


def _one_letter_apart(a: str, b: str) -> bool:
    """Whether ``a`` becomes ``b`` by one letter changed, added or removed, or two
    neighbours swapped (``"sesion"``, ``"sesssion"``, ``"usr"``, ``"suer"``)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        apart = [i for i in range(len(a)) if a[i] != b[i]]
        return len(apart) == 1 or (
            len(apart) == 2
            and apart[1] == apart[0] + 1
            and a[apart[0]] == b[apart[1]]
            and a[apart[1]] == b[apart[0]]
        )
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def _warn_near_identity(scope: str) -> None:
    """Warn (once per name and process) when an ordinary scope is one letter away from
    an identity scope: ``"sesion"`` is a shared scope, readable by every caller that
    names it, which is what a typo of ``"session"`` must not silently become. Only a
    warning: such a name may be meant (an application's own ``"users"`` scope)."""
    lowered = scope.lower()
    near = next((name for name in IDENTITY_SCOPES if _one_letter_apart(lowered, name)), None)
    if near is None or scope in _NEAR_WARNED:
        return
    _NEAR_WARNED.add(scope)
    log.warning(
        "flowdrop_local: scope %r is one letter away from the identity scope %r; it is an "
        "ordinary, shared scope (no identity is checked); write %r if that was meant",
        scope,
        near,
        near,
    )


def _warn_refusal(context: ExecutionContext | None, refusal: ScopeResolution) -> None:
    """Exactly one warning per refusal (MEM-7), on ``logging`` so repeats are not hidden."""
    node, pipeline, workflow = (
        (None, None, None)
        if context is None
        else (context.node_id, context.pipeline_id, context.workflow_id)
    )
    log.warning(
        "flowdrop_local: the %s scope refused (%s); nothing was read or written "
        "[node=%r pipeline=%r workflow=%r]",
        refusal.scope,
        refusal.reason,
        node,
        pipeline,
        workflow,
        extra={
            "flowdrop_scope": refusal.scope,
            "flowdrop_node": node,
            "flowdrop_pipeline": pipeline,
            "flowdrop_workflow": workflow,
        },
    )


# --------------------------------------------------------- session access

Action = Literal["create", "view", "drive", "grant", "edit", "delete"]
ACTIONS: Final[tuple[str, ...]] = ("create", "view", "drive", "grant", "edit", "delete")

#: Every ``AccessDenied.error_code`` this library raises. Stable: codes are added,
#: never renamed or reused.
ERROR_CODES: Final = frozenset(
    {
        "create_denied",  # a non-admin creating a session it would not own
        "view_denied",  # neither owner, granted viewer, nor admin; or no such session
        "drive_denied",  # send a turn, stop, resume, reset: owner or admin only
        "grant_denied",  # sharing a session: owner or admin only
        "edit_denied",  # updating a session message: admin only (MEM-15)
        "delete_denied",  # deleting a session message: admin only (MEM-15)
        "session_unavailable",  # admins only: the session (or a message's) cannot be loaded
        "hook_denied",  # an extension hook denied what the rules allowed
        "hook_failed",  # an extension hook raised: fail closed
        "unknown_action",  # not one of ACTIONS: fail closed
        "scope_refused",  # storage reached through a refused buffer
    }
)


class AccessDenied(FlowdropError, PermissionError):
    """A principal may not do this; nothing of the request took effect.

    ``error_code`` is one of :data:`ERROR_CODES` and never changes meaning.
    """

    def __init__(
        self, error_code: str, message: str, *, action: str = "", session_id: str | None = None
    ) -> None:
        self.error_code = error_code
        self.action = action
        self.session_id = session_id
        super().__init__(f"access denied ({error_code}): {message}")

    def __str__(self) -> str:
        return str(self.args[0])


def _principal_admin(value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidContext(f"admin must be True or False, not {shown(value)}")
    return value


@attrs.frozen
class Principal:
    """Who acts on the sessions API: a user id (or none) and the admin flag.

    A principal whose ``user_id`` is not a usable identity is anonymous: it owns
    nothing and matches no owner, even an absent one (MEM-9).
    """

    user_id: Identifier | None = attrs.field(default=None, validator=_writable_id)
    admin: bool = attrs.field(default=False, converter=_principal_admin)

    @property
    def identity(self) -> str | None:
        """The canonical user id, or None for an anonymous principal."""
        return usable_identity(self.user_id)


@attrs.frozen
class SessionFacts:
    """What an access decision judges a session by: its id, owner and viewers."""

    session_id: str
    owner_id: str | None
    viewers: frozenset[str] = frozenset()


@attrs.frozen
class AccessRequest:
    """What an extension hook is shown: it may deny it, never grant it."""

    principal: Principal
    action: str
    session: SessionFacts


#: An extension hook: return ``False`` to deny. Any other return is no objection;
#: raising denies (``hook_failed``). Hooks run only after the rules allowed.
AccessHook = Callable[[AccessRequest], object]


@attrs.frozen
class Decision:
    """An access decision: allowed, or the stable code and reason of the denial."""

    allowed: bool
    action: str
    session_id: str | None = None
    error_code: str = ""
    reason: str = ""

    def enforce(self) -> None:
        """Raise :class:`AccessDenied` unless allowed."""
        if not self.allowed:
            raise AccessDenied(
                self.error_code, self.reason, action=self.action, session_id=self.session_id
            )


def decide(
    principal: Principal,
    action: str,
    session: SessionFacts | None,
    hooks: tuple[AccessHook, ...] = (),
) -> Decision:
    """The one access decision for the sessions API (MEM-8, MEM-9, MEM-15).

    Rules, in order: an unknown action or a session that cannot be loaded is denied;
    an admin may do anything; otherwise ``view`` needs the owner or a granted
    viewer, ``drive`` and ``grant`` need the owner, ``create`` needs the new
    session to be owned by the principal, and ``edit`` / ``delete`` (of a session
    message) are denied. Ownership needs a usable identity on both sides. Only
    then are the hooks asked, and each can only deny.
    """
    session_id = None if session is None else session.session_id
    if action not in ACTIONS:
        return Decision(
            False, action, session_id, "unknown_action", f"no such action {shown(action)}"
        )
    if session is None:
        if not principal.admin:
            # A missing session and one the principal may not see get one answer:
            # a non-admin cannot learn which ids exist.
            return Decision(False, action, None, f"{action}_denied", _denial_reason(action))
        return Decision(
            False,
            action,
            None,
            "session_unavailable",
            "the session cannot be loaded, so its ownership cannot be established",
        )
    if not _rules_allow(principal, action, session):
        return Decision(False, action, session_id, f"{action}_denied", _denial_reason(action))
    request = AccessRequest(principal, action, session)
    for hook in hooks:
        try:
            verdict = hook(request)
        except Exception as error:
            log.exception("flowdrop_local: access hook %r raised; denying", hook)
            return Decision(
                False, action, session_id, "hook_failed", f"a hook raised {shown(error)}"
            )
        if verdict is False:
            return Decision(
                False, action, session_id, "hook_denied", f"denied by hook {shown(hook)}"
            )
    return Decision(True, action, session_id)


def _rules_allow(principal: Principal, action: str, session: SessionFacts) -> bool:
    if principal.admin:
        return True
    me = principal.identity
    if me is None:
        return False  # an absent identity owns nothing and views nothing (MEM-9)
    owner = usable_identity(session.owner_id)
    owns = owner is not None and owner == me
    if action == "view":
        return owns or any(usable_identity(v) == me for v in session.viewers)
    if action in ("drive", "grant", "create"):
        return owns
    return False  # edit, delete: the administrative tier only (MEM-15)


def _denial_reason(action: str) -> str:
    return {
        "create": "a session can only be created by its own owner, or by an admin",
        "view": "only the owner, a granted viewer or an admin may read this session",
        "drive": "only the owner or an admin may send a turn, stop, resume or reset a session",
        "grant": "only the owner or an admin may share this session",
        "edit": "session messages can only be updated by an admin",
        "delete": "session messages can only be deleted by an admin",
    }[action]


def refused_storage(scope: str) -> NoReturn:
    """Raise for storage reached through a refused buffer: fail closed, never write."""
    raise AccessDenied("scope_refused", f"the {scope} scope refused; this buffer has no storage")

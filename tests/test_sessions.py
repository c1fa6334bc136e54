"""Sessions: the permission matrix (MEM-9, MEM-15), the drive context (MEM-8), hooks that
cannot grant, stop/resume/reset, the administrative tier, and bad input.

Every denial asserts AccessDenied, its error_code, and an unchanged file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from flowdrop_local import (
    AccessDenied,
    AccessRequest,
    ExecutionContext,
    InvalidContext,
    InvalidMessage,
    InvalidSession,
    Principal,
    Session,
    SessionStopped,
    Store,
)
from flowdrop_local.access import ERROR_CODES, Decision

from .conftest import snapshot

TURN = {"role": "user", "content": "next turn"}

ALICE = Principal("alice")  # owns the owned session
BOB = Principal("bob")  # granted view of both sessions
CAROL = Principal("carol")  # a stranger
NOBODY = Principal(None)  # anonymous
ZERO = Principal("0")  # anonymous, spelled as the owner-less record's zero
ADMIN = Principal("root", admin=True)
PRINCIPALS = {
    "owner": ALICE,
    "viewer": BOB,
    "stranger": CAROL,
    "anonymous": NOBODY,
    "zero": ZERO,
    "admin": ADMIN,
}


@attrs.frozen
class World:
    store: Store
    path: Path | str
    owned: Session
    ownerless: Session
    owned_message: str
    ownerless_message: str


@pytest.fixture
def world(target: str) -> Iterator[World]:
    """alice's session and an ownerless one; bob may view both; each holds one turn.

    On each backend: a SQLite file and a PostgreSQL schema."""
    with Store(target) as store:
        alice, admin = store.sessions(ALICE), store.sessions(ADMIN)
        owned = alice.create("wf-support", name="alice's chat")
        alice.grant(owned.id, "bob")
        alice.drive(owned.id, {"role": "user", "content": "alice says hi"})
        ownerless = admin.create("wf-support", name="kiosk", owner=None)
        admin.grant(ownerless.id, "bob")
        admin.drive(ownerless.id, {"role": "user", "content": "someone says hi"})
        yield World(
            store,
            target,
            owned,
            ownerless,
            admin.messages(owned.id)[0].id,
            admin.messages(ownerless.id)[0].id,
        )


# ------------------------------------------------------- the permission matrix

Y, N = True, False
# principal -> (read, drive, edit, delete) on the owned session, then on the ownerless one.
MATRIX: dict[str, tuple[tuple[bool, ...], tuple[bool, ...]]] = {
    "owner": ((Y, Y, N, N), (N, N, N, N)),
    "viewer": ((Y, N, N, N), (Y, N, N, N)),
    "stranger": ((N, N, N, N), (N, N, N, N)),
    "anonymous": ((N, N, N, N), (N, N, N, N)),
    "zero": ((N, N, N, N), (N, N, N, N)),
    "admin": ((Y, Y, Y, Y), (Y, Y, Y, Y)),
}
ACTIONS = ("read", "drive", "edit", "delete")
CODES = {
    "read": "view_denied",
    "drive": "drive_denied",
    "edit": "edit_denied",
    "delete": "delete_denied",
}
CELLS = [
    (who, which, action, MATRIX[who][which == "ownerless"][i])
    for who in MATRIX
    for which in ("owned", "ownerless")
    for i, action in enumerate(ACTIONS)
]


def _act(world: World, principal: Principal, which: str, action: str) -> Any:
    api = world.store.sessions(principal)
    session = world.owned if which == "owned" else world.ownerless
    message = world.owned_message if which == "owned" else world.ownerless_message
    if action == "read":
        return api.read(session.id)
    if action == "drive":
        return api.drive(session.id, TURN)
    if action == "edit":
        return api.update_message(message, "edited")
    return api.delete_message(message)


@pytest.mark.parametrize(
    ("who", "which", "action", "allowed"),
    CELLS,
    ids=[f"{w}-{s}-{a}-{'yes' if ok else 'no'}" for w, s, a, ok in CELLS],
)
def test_permission_matrix(world: World, who: str, which: str, action: str, allowed: bool) -> None:
    """Owner / viewer / stranger / anonymous / admin x read / drive / edit / delete."""
    before = snapshot(world.path)
    if allowed:
        _act(world, PRINCIPALS[who], which, action)
        if action == "read":
            assert snapshot(world.path) == before
        else:
            assert snapshot(world.path) != before
        return
    with pytest.raises(AccessDenied) as denied:
        _act(world, PRINCIPALS[who], which, action)
    assert denied.value.error_code == CODES[action]
    assert snapshot(world.path) == before


def test_matrix_holds_for_the_other_driving_actions(world: World) -> None:
    """stop, resume and reset are driving: a viewer, stranger or anonymous caller is refused."""
    for principal in (BOB, CAROL, NOBODY, ZERO):
        api = world.store.sessions(principal)
        for act in (api.stop, api.resume, api.reset, api.context):
            for session in (world.owned, world.ownerless):
                before = snapshot(world.path)
                with pytest.raises(AccessDenied) as denied:
                    act(session.id)
                assert denied.value.error_code == "drive_denied"
                assert snapshot(world.path) == before


def test_an_absent_identity_never_acquires_the_ownerless_session(world: World) -> None:
    """MEM-9: an absent identity is not matched against an absent owner."""
    for principal in (NOBODY, ZERO, Principal(""), Principal(0), Principal(False)):
        api = world.store.sessions(principal)
        assert api.list() == []
        with pytest.raises(AccessDenied) as denied:
            api.get(world.ownerless.id)
        assert denied.value.error_code == "view_denied"


# ------------------------------------------------------------------ MEM-8


def test_drive_runs_under_the_owner_never_the_caller(world: World) -> None:
    """MEM-8: an admin driving alice's session gets alice's context, not root's."""
    turn = world.store.sessions(ADMIN).drive(world.owned.id, TURN)
    assert turn.context == ExecutionContext(
        user_id="alice", session_id=world.owned.id, workflow_id="wf-support"
    )
    assert turn.result.appended == 1
    world.store.memory_set(turn.context, "user", "k", "alice's")
    assert world.store.memory_get(ExecutionContext(user_id="alice"), "user", "k").value == "alice's"
    assert world.store.memory_get(ExecutionContext(user_id="root"), "user", "k").found is False


def test_an_ownerless_turn_has_no_user_memory(world: World) -> None:
    """MEM-8: an ownerless session passes no user identity, so the user scope refuses."""
    turn = world.store.sessions(ADMIN).drive(world.ownerless.id, TURN)
    assert turn.context.user_id is None
    assert turn.context.session_id == world.ownerless.id
    before = snapshot(world.path)
    assert world.store.buffer_for(turn.context, "user", "notes").append(TURN).count == 0
    assert not world.store.memory_set(turn.context, "user", "k", 1).ok
    assert snapshot(world.path) == before
    # the session scope is real, though
    assert (
        world.store.memory_set(turn.context, "session", "k", 1).resolved_scope_id
        == world.ownerless.id
    )


def test_a_sessions_turns_live_in_its_session_buffer(world: World) -> None:
    """The conversation is the buffer ("session", id, conversation-0)."""
    buffer = world.store.buffer("session", world.owned.id, "conversation-0")
    assert [m["content"] for m in buffer.read()] == ["alice says hi"]
    assert world.store.sessions(BOB).read(world.owned.id) == buffer.read()


# -------------------------------------------------------- stop, resume, reset


def test_stop_refuses_turns_until_resumed(world: World) -> None:
    """A stopped session accepts no turn; resume accepts them again."""
    alice = world.store.sessions(ALICE)
    assert alice.stop(world.owned.id).status == "stopped"
    before = snapshot(world.path)
    with pytest.raises(SessionStopped):
        alice.drive(world.owned.id, TURN)
    with pytest.raises(SessionStopped):
        world.store.sessions(ADMIN).drive(world.owned.id, TURN)
    assert snapshot(world.path) == before
    assert alice.stop(world.owned.id).status == "stopped"  # idempotent
    assert alice.resume(world.owned.id).status == "active"
    assert alice.drive(world.owned.id, TURN).result.count == 2


def test_reset_starts_afresh_and_keeps_the_old_messages(world: World) -> None:
    """MEM-15: reset never deletes; the old conversation stays readable."""
    alice, bob = world.store.sessions(ALICE), world.store.sessions(BOB)
    session = alice.reset(world.owned.id)
    assert (session.conversation, session.conversation_key) == (1, "conversation-1")
    assert bob.read(world.owned.id) == []
    assert [m["content"] for m in bob.read(world.owned.id, conversation=0)] == ["alice says hi"]
    alice.drive(world.owned.id, TURN)
    assert [m["content"] for m in bob.read(world.owned.id)] == ["next turn"]
    assert alice.get(world.owned.id).updated_at >= world.owned.updated_at


def test_placeholder_replacement_is_part_of_a_drive(world: World) -> None:
    """MEM-10 through the sessions API: the owner's late tool result replaces the placeholder."""
    alice = world.store.sessions(ALICE)
    sid = world.owned.id
    alice.drive(
        sid, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "t"}]}
    )
    assert len(alice.drive(sid, TURN).result.healed_ids) == 1
    late = {"role": "tool", "tool_call_id": "c1", "content": "real"}
    before = snapshot(world.path)
    with pytest.raises(AccessDenied) as denied:
        world.store.sessions(BOB).drive(sid, late)
    assert denied.value.error_code == "drive_denied"
    assert snapshot(world.path) == before
    assert len(alice.drive(sid, late).result.replaced_ids) == 1


# --------------------------------------------------------------- hooks


def _granting_hooks() -> list[Callable[[AccessRequest], object]]:
    return [
        lambda request: True,
        lambda request: "allow",
        lambda request: Decision(True, request.action),
        lambda request: None,
    ]


@pytest.mark.parametrize("hook", _granting_hooks(), ids=["true", "allow", "decision", "none"])
def test_a_hook_cannot_grant_what_the_rules_denied(world: World, hook: Any) -> None:
    """MEM-15: with a hook that says yes to everything, every denied cell stays denied."""
    calls: list[AccessRequest] = []

    def eager(request: AccessRequest) -> object:
        calls.append(request)
        return hook(request)

    world.store.add_access_hook(eager)
    for who, which, action, allowed in CELLS:
        if allowed:
            continue
        before = snapshot(world.path)
        with pytest.raises(AccessDenied) as denied:
            _act(world, PRINCIPALS[who], which, action)
        assert denied.value.error_code == CODES[action]
        assert snapshot(world.path) == before
    assert calls == []  # consulted only after the rules allow
    world.store.sessions(ALICE).read(world.owned.id)
    assert [c.action for c in calls] == ["view"]


def test_a_hook_can_deny_anyone_admin_included(world: World) -> None:
    """A hook's False denies (hook_denied) even what an admin may do; removing it restores."""

    def no_driving(request: AccessRequest) -> bool:
        return request.action != "drive"

    world.store.add_access_hook(no_driving)
    before = snapshot(world.path)
    for principal in (ALICE, ADMIN):
        with pytest.raises(AccessDenied) as denied:
            world.store.sessions(principal).drive(world.owned.id, TURN)
        assert denied.value.error_code == "hook_denied"
    assert snapshot(world.path) == before
    assert world.store.sessions(ALICE).read(world.owned.id)  # other actions unaffected
    world.store.remove_access_hook(no_driving)
    assert world.store.sessions(ALICE).drive(world.owned.id, TURN).result.appended == 1


def test_a_failing_hook_denies(world: World) -> None:
    """A hook that raises (here: trying to mutate the frozen request) fails closed."""

    def meddling(request: AccessRequest) -> object:
        request.principal.admin = True  # type: ignore[misc]
        return True

    world.store.add_access_hook(meddling)
    before = snapshot(world.path)
    with pytest.raises(AccessDenied) as denied:
        world.store.sessions(ALICE).drive(world.owned.id, TURN)
    assert denied.value.error_code == "hook_failed"
    assert snapshot(world.path) == before


def test_list_honours_hooks(world: World) -> None:
    """list() judges each row with the same decision, hooks included."""
    assert [s.id for s in world.store.sessions(BOB).list()] == [world.owned.id, world.ownerless.id]
    world.store.add_access_hook(lambda r: r.session.session_id != world.ownerless.id)
    assert [s.id for s in world.store.sessions(BOB).list()] == [world.owned.id]


# ------------------------------------------------------- create, list, grant


def test_create_rules(world: World) -> None:
    """A non-admin creates only sessions it owns; an anonymous caller creates none."""
    before = snapshot(world.path)
    for principal, kwargs in (
        (NOBODY, {}),
        (ZERO, {}),
        (ALICE, {"owner": "bob"}),
        (ALICE, {"owner": None}),
    ):
        with pytest.raises(AccessDenied) as denied:
            world.store.sessions(principal).create("wf", **kwargs)
        assert denied.value.error_code == "create_denied"
    assert snapshot(world.path) == before
    assert world.store.sessions(ALICE).create("wf", owner="alice").owner_id == "alice"
    assert world.store.sessions(ADMIN).create("wf", owner=42).owner_id == "42"
    assert world.store.sessions(Principal(7)).create("wf").owner_id == "7"


def test_list_shows_only_what_the_principal_may_read(world: World) -> None:
    """Owned and granted sessions for a user; everything for an admin; a workflow filter."""
    other = world.store.sessions(CAROL).create("wf-other")

    def ids(principal: Principal, **kw: Any) -> list[str]:
        return [s.id for s in world.store.sessions(principal).list(**kw)]

    assert ids(ALICE) == [world.owned.id]
    assert ids(BOB) == [world.owned.id, world.ownerless.id]
    assert ids(CAROL) == [other.id]
    assert ids(ADMIN) == [world.owned.id, world.ownerless.id, other.id]
    assert ids(ADMIN, workflow_id="wf-other") == [other.id]
    assert ids(NOBODY) == ids(ZERO) == []


def test_grant_and_revoke(world: World) -> None:
    """The owner shares and unshares; a viewer cannot share further."""
    alice, carol = world.store.sessions(ALICE), world.store.sessions(CAROL)
    before = snapshot(world.path)
    with pytest.raises(AccessDenied) as denied:
        world.store.sessions(BOB).grant(world.owned.id, "carol")
    assert denied.value.error_code == "grant_denied"
    with pytest.raises(AccessDenied) as denied:
        world.store.sessions(BOB).viewers(world.owned.id)
    assert denied.value.error_code == "grant_denied"
    assert snapshot(world.path) == before
    alice.grant(world.owned.id, " carol ")
    assert alice.viewers(world.owned.id) == ["bob", "carol"]
    assert carol.read(world.owned.id)
    with pytest.raises(AccessDenied):
        carol.drive(world.owned.id, TURN)
    alice.revoke(world.owned.id, "carol")
    with pytest.raises(AccessDenied) as denied:
        carol.get(world.owned.id)
    assert denied.value.error_code == "view_denied"


# ------------------------------------------------- the administrative tier


def test_admin_edit_keeps_the_place_of_the_message(world: World) -> None:
    """An admin update changes content only; position, role and id stay."""
    admin = world.store.sessions(ADMIN)
    (old,) = admin.messages(world.owned.id)
    new = admin.update_message(old.id, [{"type": "text", "text": "redacted"}])
    assert (new.id, new.position, new.role) == (old.id, old.position, old.role)
    assert admin.messages(world.owned.id) == [new]
    admin.delete_message(old.id)
    assert admin.messages(world.owned.id) == []


def test_a_message_whose_session_cannot_be_loaded_is_denied(world: World) -> None:
    """MEM-15: no session, no decision but denial, even for an admin."""
    admin = world.store.sessions(ADMIN)
    notes = world.store.buffer("user", "alice", "notes")
    outside = notes.append(TURN).message_ids[0]
    stray = world.store.buffer("session", "no-such-session", "conversation-0")
    orphan = stray.append(TURN).message_ids[0]
    before = snapshot(world.path)
    for message_id in (outside, orphan, "no-such-message"):
        for act in (lambda m: admin.update_message(m, "x"), admin.delete_message):
            with pytest.raises(AccessDenied) as denied:
                act(message_id)
            assert denied.value.error_code == "session_unavailable"
    for call in (admin.get, admin.stop, lambda s: admin.drive(s, TURN)):
        with pytest.raises(AccessDenied) as denied:
            call("no-such-session")
        assert denied.value.error_code == "session_unavailable"
    assert snapshot(world.path) == before


# ---------------------------------------------------------------- bad input

BAD_INPUTS: list[tuple[str, Callable[[World], Any], type[Exception]]] = [
    ("blank-workflow", lambda w: w.store.sessions(ALICE).create("  "), InvalidSession),
    ("int-workflow", lambda w: w.store.sessions(ALICE).create(5), InvalidSession),  # type: ignore[arg-type]
    ("int-name", lambda w: w.store.sessions(ALICE).create("wf", name=5), InvalidSession),  # type: ignore[arg-type]
    ("list-metadata", lambda w: w.store.sessions(ALICE).create("wf", metadata=[1]), InvalidSession),  # type: ignore[arg-type]
    (
        "set-in-metadata",
        lambda w: w.store.sessions(ALICE).create("wf", metadata={"x": {1}}),
        InvalidSession,
    ),
    ("zero-owner", lambda w: w.store.sessions(ADMIN).create("wf", owner="0"), InvalidSession),
    ("bool-owner", lambda w: w.store.sessions(ADMIN).create("wf", owner=True), InvalidSession),
    ("zero-viewer", lambda w: w.store.sessions(ALICE).grant(w.owned.id, "0"), InvalidSession),
    ("blank-viewer", lambda w: w.store.sessions(ALICE).revoke(w.owned.id, " "), InvalidSession),
    ("int-session-id", lambda w: w.store.sessions(ALICE).get(5), InvalidSession),  # type: ignore[arg-type]
    (
        "negative-conversation",
        lambda w: w.store.sessions(ALICE).read(w.owned.id, conversation=-1),
        InvalidSession,
    ),
    (
        "future-conversation",
        lambda w: w.store.sessions(ALICE).read(w.owned.id, conversation=3),
        InvalidSession,
    ),
    (
        "bad-turn",
        lambda w: w.store.sessions(ALICE).drive(w.owned.id, {"role": "bogus"}),
        InvalidMessage,
    ),
    (
        "bad-batch",
        lambda w: w.store.sessions(ALICE).drive(w.owned.id, [TURN, {"content": 1}]),
        InvalidMessage,
    ),
    (
        "bad-content",
        lambda w: w.store.sessions(ADMIN).update_message(w.owned_message, 5),  # type: ignore[arg-type]
        InvalidMessage,
    ),
    ("admin-not-bool", lambda w: Principal("a", admin="yes"), InvalidContext),
    ("not-a-principal", lambda w: w.store.sessions("alice"), InvalidContext),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "call", "error"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_typed_and_changes_nothing(
    world: World, name: str, call: Callable[[World], Any], error: type[Exception]
) -> None:
    """Every bad input raises its typed error and leaves the file as it was."""
    before = snapshot(world.path)
    with pytest.raises(error):
        call(world)
    assert snapshot(world.path) == before


def test_every_denial_code_is_declared() -> None:
    """The codes the tests see are the stable, documented ones."""
    seen = {
        *CODES.values(),
        "drive_denied",
        "grant_denied",
        "create_denied",
        "hook_denied",
        "hook_failed",
        "session_unavailable",
        "scope_refused",
    }
    assert seen <= ERROR_CODES
    error = AccessDenied("view_denied", "no")
    assert isinstance(error, PermissionError) and error.error_code == "view_denied"


# -------------------------------------------- admin edits keep the buffer rules


def _healed_session(store: Store) -> tuple[Any, Any]:
    admin = store.sessions(ADMIN)
    session = admin.create("wf", name="healed", owner="alice")
    admin.drive(
        session.id,
        [
            {"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
            {"role": "tool", "tool_call_id": "c2", "content": "real"},
            {"role": "user", "content": "next"},  # heals c1
        ],
    )
    return admin, session


def test_deleting_a_declaring_turn_takes_its_placeholders(target: str) -> None:
    """An admin deleting a turn leaves no placeholder for a call nobody declares."""
    with Store(target) as store:
        admin, session = _healed_session(store)
        turn = admin.messages(session.id)[0]
        admin.delete_message(turn.id)
        assert [m.role for m in admin.messages(session.id)] == [
            "tool",
            "user",
        ]  # c2's real result stays
        assert store.check() == []


def test_deleting_a_result_heals_its_call_at_once(target: str) -> None:
    """A deleted real result un-answers its call before a user turn: healed in the same write."""
    with Store(target) as store:
        admin, session = _healed_session(store)
        result = next(m for m in admin.messages(session.id) if m.tool_call_id == "c2")
        admin.delete_message(result.id)
        messages = admin.messages(session.id)
        assert [(m.role, m.healed) for m in messages] == [
            ("assistant", False),
            ("tool", True),
            ("tool", True),
            ("user", False),
        ]
        assert store.check() == []


def test_a_placeholder_is_not_edited(target: str) -> None:
    """An admin edit of a placeholder is refused; the real result replaces it by an append."""
    with Store(target) as store:
        admin, session = _healed_session(store)
        placeholder = next(m for m in admin.messages(session.id) if m.healed)
        before = snapshot(target)
        with pytest.raises(InvalidMessage, match="replaced by appending"):
            admin.update_message(placeholder.id, "edited")
        assert snapshot(target) == before


# ------------------------------------------------ one snapshot, one answer (issue 10 D)


@pytest.mark.parametrize("read", ["read", "messages"])
def test_a_revoke_and_a_turn_committed_mid_read_are_not_seen(world: World, read: str) -> None:
    """Decision and rows are one snapshot: a revoke + new turn committed by another Store
    between bob's decision and his read is invisible to that read (and denies the next)."""
    fired: list[str] = []

    def revoke_meanwhile(request: AccessRequest) -> None:
        # Runs after the rules allowed bob to view: the decision is taken. Another
        # connection now revokes bob and adds a turn, before the rows are read.
        if request.action == "view" and not fired:
            fired.append(request.action)
            with Store(world.path) as other:
                alice = other.sessions(ALICE)
                alice.revoke(world.owned.id, "bob")
                alice.drive(world.owned.id, {"role": "user", "content": "after the revoke"})

    world.store.add_access_hook(revoke_meanwhile)
    rows = getattr(world.store.sessions(BOB), read)(world.owned.id)
    assert fired == ["view"]
    contents = [r["content"] if isinstance(r, dict) else r.content for r in rows]
    assert contents == ["alice says hi"]  # the snapshot of the decision: no new turn
    with pytest.raises(AccessDenied) as denied:
        getattr(world.store.sessions(BOB), read)(world.owned.id)
    assert denied.value.error_code == "view_denied"
    assert len(world.store.sessions(ADMIN).messages(world.owned.id)) == 2


def _plant_lookalike_session(path: Path | str, victim_id: str, owner: str) -> str:
    """A hostile file: a sessions row whose id trims to the victim's (CHECKs bypassed)."""
    lookalike = " " + victim_id
    if str(path).startswith("postgresql://"):
        import psycopg

        with psycopg.connect(str(path), autocommit=True) as pg:
            pg.execute("ALTER TABLE sessions DROP CONSTRAINT sessions_id_check")
            pg.execute(
                "INSERT INTO sessions (id, workflow_id, owner_id) VALUES (%s, 'wf', %s)",
                (lookalike, owner),
            )
        return lookalike
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute(
            "INSERT INTO sessions (id, workflow_id, owner_id) VALUES (?, 'wf', ?)",
            (lookalike, owner),
        )
        conn.commit()
    finally:
        conn.close()
    return lookalike


LOOKALIKE_CALLS: list[tuple[str, Callable[[Any, str], Any], str]] = [
    ("read", lambda api, sid: api.read(sid), "view_denied"),
    ("messages", lambda api, sid: api.messages(sid), "view_denied"),
    ("drive", lambda api, sid: api.drive(sid, TURN), "drive_denied"),
    ("context", lambda api, sid: api.context(sid), "drive_denied"),
    ("get", lambda api, sid: api.get(sid), "view_denied"),
]


@pytest.mark.parametrize(
    ("name", "call", "code"), LOOKALIKE_CALLS, ids=[c[0] for c in LOOKALIKE_CALLS]
)
def test_a_lookalike_session_id_reaches_nothing_of_the_victim(
    world: World, name: str, call: Callable[[Any, str], Any], code: str
) -> None:
    """carol's row " <alice's id>" is judged and addressed by one canonical id: alice's
    session, which carol may not use. She reads nothing of it and writes nothing to it."""
    lookalike = _plant_lookalike_session(world.path, world.owned.id, "carol")
    before = snapshot(world.path)
    carol = world.store.sessions(CAROL)
    with pytest.raises(AccessDenied) as denied:
        call(carol, lookalike)
    assert denied.value.error_code == code
    assert snapshot(world.path) == before
    assert lookalike not in [s.id for s in carol.list()]  # a row that cannot be loaded


def test_a_session_id_is_canonicalised_like_every_buffer_address(world: World) -> None:
    """ " <id> " names the session <id>, as " 7 " names user 7: one session, one buffer."""
    alice = world.store.sessions(ALICE)
    padded = f"  {world.owned.id} "
    assert alice.get(padded) == alice.get(world.owned.id)
    alice.drive(padded, TURN)
    assert [m["content"] for m in alice.read(world.owned.id)] == ["alice says hi", "next turn"]


def _missing_id(world: World) -> str:
    """An id shaped like a real one that names no session."""
    real = world.owned.id
    return real[:-4] + ("0000" if real[-4:] != "0000" else "1111")


NON_ADMIN_CALLS: list[tuple[str, Callable[[Any, str, str], Any], str]] = [
    ("get", lambda api, sid, mid: api.get(sid), "view_denied"),
    ("read", lambda api, sid, mid: api.read(sid), "view_denied"),
    ("messages", lambda api, sid, mid: api.messages(sid), "view_denied"),
    ("drive", lambda api, sid, mid: api.drive(sid, TURN), "drive_denied"),
    ("context", lambda api, sid, mid: api.context(sid), "drive_denied"),
    ("stop", lambda api, sid, mid: api.stop(sid), "drive_denied"),
    ("reset", lambda api, sid, mid: api.reset(sid), "drive_denied"),
    ("grant", lambda api, sid, mid: api.grant(sid, "dave"), "grant_denied"),
    ("viewers", lambda api, sid, mid: api.viewers(sid), "grant_denied"),
    ("update_message", lambda api, sid, mid: api.update_message(mid, "x"), "edit_denied"),
    ("delete_message", lambda api, sid, mid: api.delete_message(mid), "delete_denied"),
]


@pytest.mark.parametrize("who", ["stranger", "anonymous", "zero"])
@pytest.mark.parametrize(
    ("name", "call", "code"), NON_ADMIN_CALLS, ids=[c[0] for c in NON_ADMIN_CALLS]
)
def test_a_non_admin_cannot_tell_missing_from_not_yours(
    world: World, who: str, name: str, call: Callable[[Any, str, str], Any], code: str
) -> None:
    """Missing and not-yours give one code, one message, and back the id that was asked."""
    api = world.store.sessions(PRINCIPALS[who])
    answers = []
    for sid, mid in ((world.owned.id, world.owned_message), (_missing_id(world), "no-such-id")):
        with pytest.raises(AccessDenied) as denied:
            call(api, sid, mid)
        error = denied.value
        asked = None if name.endswith("_message") else sid
        assert error.session_id == asked
        answers.append((error.error_code, str(error)))
    assert answers[0] == answers[1] == (code, answers[0][1])


def test_a_viewer_driving_a_missing_session_is_told_what_it_is_told_for_a_real_one(
    world: World,
) -> None:
    """bob may view alice's session but not drive it: a missing id gives the same denial."""
    bob = world.store.sessions(BOB)
    codes = []
    for sid in (world.owned.id, _missing_id(world)):
        with pytest.raises(AccessDenied) as denied:
            bob.drive(sid, TURN)
        codes.append(str(denied.value))
    assert codes[0] == codes[1] and "drive_denied" in codes[0]


def test_an_admin_keeps_the_precise_code(world: World) -> None:
    """An admin is told a session or message cannot be loaded (session_unavailable)."""
    admin = world.store.sessions(ADMIN)
    for call in (
        lambda: admin.read(_missing_id(world)),
        lambda: admin.viewers(_missing_id(world)),
        lambda: admin.update_message("no-such-id", "x"),
    ):
        with pytest.raises(AccessDenied) as denied:
            call()
        assert denied.value.error_code == "session_unavailable"


def test_a_revoke_waits_for_a_drive_that_was_allowed(target: str) -> None:
    """The drive locks the session row from its decision to its commit (on PostgreSQL
    FOR UPDATE, on SQLite the file's write lock): a revoke from another store waits."""
    import threading
    import time

    with Store(target) as store:
        alice = store.sessions(ALICE)
        session = alice.create("wf")
        alice.grant(session.id, "bob")
        revoked = threading.Event()
        waited: list[bool] = []

        def revoke() -> None:
            with Store(target) as other:
                other.sessions(ALICE).revoke(session.id, "bob")
            revoked.set()

        def hook(request: Any) -> bool:
            if request.action == "drive" and not waited:
                worker = threading.Thread(target=revoke)
                worker.start()
                time.sleep(0.5)  # the revoke is sent and must now wait for the lock
                waited.append(not revoked.is_set())
            return True

        store.add_access_hook(hook)
        alice.drive(session.id, TURN)
        revoked.wait(30)
        assert waited == [True] and revoked.is_set()
        assert alice.viewers(session.id) == []

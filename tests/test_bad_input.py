"""Bad input gets a typed error naming the message and the field, and writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import (
    ExecutionContext,
    FlowdropError,
    InvalidAddress,
    InvalidArgument,
    InvalidContext,
    InvalidMessage,
    InvalidSession,
    Principal,
    Store,
)
from flowdrop_local.access import usable_identity
from flowdrop_local.rules.incoming import too_big

from .conftest import snapshot

OK_USER = {"role": "user", "content": "hi"}
CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f"}]}


class Unserialisable:
    pass


# (what is appended, index named by the error, field named by the error)
BAD = [
    ({"role": "operator", "content": "x"}, 0, "role"),
    ({"content": "no role"}, 0, "role"),
    ({"role": "user", "content": 42}, 0, "content"),
    ({"role": "user", "content": {"text": "a dict"}}, 0, "content"),
    ({"role": "user", "content": ["not a part"]}, 0, "content[0]"),
    ({"role": "user", "content": [{"text": "part without a type"}]}, 0, "content[0]"),
    (
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        },
        0,
        "content[0]",
    ),
    (
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]},
        0,
        "content[0]",
    ),
    ({"role": "user", "content": "x", "metadata": "not an object"}, 0, "metadata"),
    ({"role": "user", "content": "x", "metadata": ["list"]}, 0, "metadata"),
    ({"role": "assistant", "content": "", "tool_calls": {"id": "c1"}}, 0, "tool_calls"),
    ({"role": "assistant", "content": "", "tool_calls": ["c1"]}, 0, "tool_calls[0]"),
    (
        {"role": "assistant", "content": "", "tool_calls": [{"name": "no id"}]},
        0,
        "tool_calls[0].id",
    ),
    ({"role": "assistant", "content": "", "tool_calls": [{"id": "  "}]}, 0, "tool_calls[0].id"),
    ({"role": "assistant", "content": "", "tool_calls": [{"id": 7}]}, 0, "tool_calls[0].id"),
    (
        {"role": "assistant", "tool_calls": [{"id": "a"}, {"tool_call_id": ""}]},
        0,
        "tool_calls[1].id",
    ),
    ({"role": "user", "content": "x", "tool_calls": [{"id": "c1"}]}, 0, "tool_calls"),
    ({"role": "tool", "content": "x", "tool_call_id": 5}, 0, "tool_call_id"),
    ({"role": "tool", "content": "x", "tool_call_id": ""}, 0, "tool_call_id"),
    # SQLite's JSON functions end a string at NUL: such an id could not be matched.
    ({"role": "tool", "content": "x", "tool_call_id": "call\x00A"}, 0, "tool_call_id"),
    ({"role": "assistant", "tool_calls": [{"id": "call\x00A"}]}, 0, "tool_calls[0].id"),
    ({"role": "user", "content": "x", "tool_call_id": "c1"}, 0, "tool_call_id"),
    (
        {"role": "tool", "content": "x", "tool_call_id": "a", "metadata": {"tool_call_id": "b"}},
        0,
        "tool_call_id",
    ),
    ({"role": "tool", "content": "x", "metadata": {"healed": "yes"}}, 0, "metadata.healed"),
    ({"role": "user", "content": "x", "metadata": {"n": float("nan")}}, 0, "metadata.n"),
    ({"role": "user", "content": "x", "metadata": {"o": Unserialisable()}}, 0, "metadata.o"),
    ({"role": "user", "content": "x", "metadata": {1: "int key"}}, 0, "metadata"),
    ({"role": "user", "content": "lone \ud800 surrogate"}, 0, "content"),
    ({"role": "user", "content": "x", "metadata": {"k": "\udfff"}}, 0, "metadata.k"),
    ([OK_USER, OK_USER, {"role": "robot", "content": "x"}], 2, "role"),
    ([CALL, {"role": "tool", "tool_call_id": None, "content": 3.5}], 1, "content"),
    ("a string is not a message", 0, "message"),
    (42, 0, "message"),
    ([OK_USER, "not a mapping"], 1, "message"),
]


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"d": value}
    return value


BAD.append(({"role": "user", "content": "x", "metadata": _deep(500)}, 0, "metadata" + ".d" * 200))


@pytest.mark.parametrize(
    ("bad", "index", "field"), BAD, ids=[f"{i}-{row[2]}" for i, row in enumerate(BAD)]
)
def test_bad_message_is_refused_and_the_file_is_unchanged(
    db_path: Path, bad: Any, index: int, field: str
) -> None:
    """Each bad input raises InvalidMessage naming index and field; no table changes."""
    with Store(db_path) as store:
        buffer = store.buffer("session", "s1", "chat")
        buffer.append([{"role": "system", "content": "be brief"}, CALL])
        before = snapshot(db_path)
        with pytest.raises(InvalidMessage) as caught:
            buffer.append(bad)
        assert (caught.value.index, caught.value.field) == (index, field)
        assert f"message {index}: {field}:" in str(caught.value)
        assert isinstance(caught.value, FlowdropError)
        assert isinstance(caught.value, ValueError)
        assert snapshot(db_path) == before
        # The store is still usable, and the dangling call still heals afterwards.
        assert buffer.append(OK_USER).healed_ids != ()


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ((1, "s", "k"), "scope must be a string"),
        (("", "s", "k"), "scope must not be blank"),
        (("workflow", None, "k"), "scope_id must be a string"),
        (("session", "s", "  "), "key must not be blank"),
        (("User", "0", "k"), "is not the identity scope 'user'"),
        (("SESSION", "", "k"), "is not the identity scope 'session'"),
        ((" session", "", "k"), "printable ASCII without surrounding whitespace"),
    ],
)
def test_bad_address_is_refused(store: Store, address: tuple[Any, Any, Any], problem: str) -> None:
    """A buffer address that is not three strings (scope and key not blank) is refused."""
    with pytest.raises(InvalidAddress, match=problem):
        store.buffer(*address)


@pytest.mark.parametrize("limit", [-1, "5", 2.5, True])
def test_bad_limit_is_refused(store: Store, limit: Any) -> None:
    """read(limit=...) takes a non-negative int only."""
    buffer = store.buffer("s", "", "k")
    buffer.append(OK_USER)
    with pytest.raises(ValueError, match="limit"):
        buffer.read(limit=limit)


def test_a_database_error_mid_batch_rolls_back_everything(db_path: Path) -> None:
    """A batch that fails inside SQLite (a raw trigger raising) leaves nothing behind."""
    with Store(db_path) as store:
        buffer = store.buffer("session", "s1", "chat")
        buffer.append(OK_USER)
        conn = store.backend.connection()
        conn.execute(
            "CREATE TEMP TRIGGER fail_third AFTER INSERT ON main.messages "
            "WHEN NEW.content = 'boom' BEGIN SELECT RAISE(ABORT, 'boom'); END"
        )
        before = snapshot(db_path)
        with pytest.raises(Exception, match="boom"):
            buffer.append(
                [CALL, {"role": "user", "content": "heals c1"}, {"role": "user", "content": "boom"}]
            )
        assert snapshot(db_path) == before
        assert not conn.in_transaction
        assert len(buffer) == 1


# ------------------------------- every error of the public API is typed (issue 10 B)

HUGE = 10**5000  # more digits than Python writes as text (ValueError from str())


def _deep_list(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


def _session(store: Store) -> str:
    admin = store.sessions(Principal("root", admin=True))
    session = admin.create("wf", owner="alice")
    admin.drive(session.id, OK_USER)
    return session.id


# (what is called, the typed error it raises); each raised a built-in before.
TYPED: list[tuple[str, Any, type[FlowdropError]]] = [
    ("read-before-list", lambda s: s.buffer("s", "", "k").read(before=["x"]), InvalidArgument),
    ("read-before-int", lambda s: s.buffer("s", "", "k").read(1, before=5), InvalidArgument),
    ("limit-huge-negative", lambda s: s.buffer("s", "", "k").read(-HUGE), InvalidArgument),
    ("scope-surrogate", lambda s: s.buffer("s\ud800", "", "k"), InvalidAddress),
    ("scope-id-surrogate", lambda s: s.buffer("s", "\udfff", "k").read(), InvalidAddress),
    ("key-surrogate", lambda s: s.buffer("s", "", "k\ud800").read(), InvalidAddress),
    ("key-surrogate-buffer-for", lambda s: s.buffer_for(None, "global", "\ud800"), InvalidAddress),
    ("memory-get-surrogate", lambda s: s.memory_get(None, "global", "k\ud800"), InvalidAddress),
    ("memory-set-surrogate", lambda s: s.memory_set(None, "global", "\ud800", 1), InvalidAddress),
    (
        "memory-delete-surrogate",
        lambda s: s.memory_delete(None, "global", "\udc00"),
        InvalidAddress,
    ),
    ("scope-unhashable", lambda s: s.buffer(["user"], "7", "k"), InvalidAddress),
    ("principal-huge", lambda s: Principal(HUGE), InvalidContext),
    ("context-huge", lambda s: ExecutionContext(user_id=HUGE), InvalidContext),
    ("context-huge-node", lambda s: ExecutionContext.from_dict({"node_id": -HUGE}), InvalidContext),
    ("address-huge", lambda s: s.buffer("user", HUGE, "k"), InvalidAddress),
    (
        "grant-huge",
        lambda s: s.sessions(Principal("alice")).grant(_session(s), HUGE),
        InvalidSession,
    ),
    (
        "owner-huge",
        lambda s: s.sessions(Principal("root", admin=True)).create("wf", owner=HUGE),
        InvalidSession,
    ),
    (
        "conversation-huge",
        lambda s: s.sessions(Principal("alice")).read(_session(s), conversation=-HUGE),
        InvalidSession,
    ),
    (
        "deep-equal-tool-call-id",
        lambda s: s.buffer("s", "", "k").append(
            {
                "role": "tool",
                "tool_call_id": _deep_list(100_000),
                "metadata": {"tool_call_id": _deep_list(100_000)},
            }
        ),
        InvalidMessage,
    ),
    (
        "deep-equal-tool-calls",
        lambda s: s.buffer("s", "", "k").append(
            {
                "role": "assistant",
                "tool_calls": _deep_list(100_000),
                "metadata": {"tool_calls": _deep_list(100_000)},
            }
        ),
        InvalidMessage,
    ),
    (
        "deep-equal-extra-key",
        lambda s: s.buffer("s", "", "k").append(
            {
                "role": "user",
                "content": "x",
                "extra": _deep_list(100_000),
                "metadata": {"extra": _deep_list(100_000)},
            }
        ),
        InvalidMessage,
    ),
]


@pytest.mark.parametrize(("name", "call", "error"), TYPED, ids=[t[0] for t in TYPED])
def test_bad_arguments_raise_typed_errors_and_change_nothing(
    db_path: Path, name: str, call: Any, error: type[FlowdropError]
) -> None:
    """Each argument that used to escape as a built-in error is a FlowdropError now."""
    with Store(db_path) as store:
        store.buffer("s", "", "k").append(OK_USER)
        before = snapshot(db_path)
        with pytest.raises(error):
            call(store)
        if not name.endswith("-huge") or name.startswith(("principal", "context", "address")):
            assert snapshot(db_path) == before


@pytest.mark.parametrize(
    "limit", [2**63 - 1, 2**63, 2**64, HUGE], ids=["2**63-1", "2**63", "2**64", "10**5000"]
)
def test_a_limit_past_sqlite_integers_means_everything(db_path: Path, limit: int) -> None:
    """read/messages (on a buffer and a session) take any non-negative int: capped, not an
    OverflowError."""
    with Store(db_path) as store:
        sid = _session(store)
        buffer = store.buffer("s", "", "k")
        buffer.append([OK_USER, OK_USER])
        alice = store.sessions(Principal("alice"))
        assert buffer.read(limit) == buffer.read()
        assert buffer.messages(limit) == buffer.messages()
        first = buffer.messages()[-1].id
        assert buffer.read(limit, before=first) == buffer.read()[:1]
        assert alice.read(sid, limit) == alice.read(sid)
        assert alice.messages(sid, limit) == alice.messages(sid)


def test_ids_of_five_thousand_digits_are_judged_not_crashed(store: Store) -> None:
    """As a str such an id is an ordinary usable identity; as an int it names nobody."""
    digits = "7" * 5000
    assert usable_identity(digits) == digits
    assert usable_identity(HUGE) is None
    store.buffer("user", digits, "k").append(OK_USER)
    admin = store.sessions(Principal("root", admin=True))
    session = admin.create("wf", owner=digits)
    assert store.sessions(Principal(digits)).get(session.id).owner_id == digits


def test_content_past_sqlite_length_limit_is_refused_before_sqlite(db_path: Path) -> None:
    """1,000,000,001 bytes of content: InvalidMessage naming content, not sqlite3.DataError.

    A real one-gigabyte string (about 1 GB of memory for a second).
    """
    with Store(db_path) as store:
        buffer = store.buffer("s", "", "k")
        buffer.append(OK_USER)
        before = snapshot(db_path)
        huge = "x" * 1_000_000_001
        with pytest.raises(InvalidMessage) as caught:
            buffer.append({"role": "user", "content": huge})
        del huge
        assert caught.value.field == "content"
        assert snapshot(db_path) == before
        assert len(buffer) == 1


@pytest.mark.parametrize(
    ("char", "extra", "too_big_"),
    [
        ("x", "", False),  # exactly the limit: stored
        ("x", "x", True),
        ("\u00e9", "", False),  # 2 bytes each in UTF-8
        ("\u00e9", "x", True),
    ],
    ids=["ascii-at-limit", "ascii-past", "two-byte-at-limit", "two-byte-past"],
)
def test_the_size_check_counts_utf8_bytes_of_all_parts(
    char: str, extra: str, too_big_: bool
) -> None:
    """too_big() counts encoded bytes of content and metadata together (999 MB pieces of 1 MB)."""
    piece = char * (1_000_000 // len(char.encode()))
    assert too_big(*[piece] * 999, extra) is too_big_
    assert too_big(piece, extra) is False


@pytest.mark.parametrize(
    ("scope", "near"),
    [
        ("sesion", "session"),
        ("sessoin", "session"),
        ("sessions", "session"),
        ("Sesion", "session"),
        ("usr", "user"),
        ("users", "user"),
        ("uesr", "user"),
    ],
)
def test_a_scope_one_letter_from_an_identity_scope_is_warned_about_once(
    db_path: Path, caplog: pytest.LogCaptureFixture, scope: str, near: str
) -> None:
    """An ordinary scope one letter away from ``user``/``session`` works (it may be
    meant) but logs one warning naming the identity scope, once per name."""
    import logging

    caplog.set_level(logging.WARNING, "flowdrop_local")
    with Store(db_path) as store:
        store.buffer(scope, "s1", "k").append(OK_USER)
        store.buffer(scope, "s2", "k").read()
    warned = [r.getMessage() for r in caplog.records if "one letter away" in r.getMessage()]
    assert len(warned) == 1 and repr(scope) in warned[0] and repr(near) in warned[0]


@pytest.mark.parametrize("scope", ["session", "user", "global", "chat", "sess", "usage"])
def test_other_scopes_are_not_warned_about(
    db_path: Path, caplog: pytest.LogCaptureFixture, scope: str
) -> None:
    import logging

    caplog.set_level(logging.WARNING, "flowdrop_local")
    with Store(db_path) as store:
        store.buffer(scope, "s1", "k").read()
    assert not [r for r in caplog.records if "one letter away" in r.getMessage()]

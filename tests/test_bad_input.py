"""Bad input gets a typed error naming the message and the field, and writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import FlowdropError, InvalidAddress, InvalidMessage, Store

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
        conn = store._connection()
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

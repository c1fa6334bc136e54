"""A caller-supplied message id: stored as given; a retry with the same ids stores nothing twice.

A message dict may carry ``"id"`` (a UUID). The append stores the message under it;
when the buffer already holds that id the message is dropped and counted in
``dropped``, so an append retried after a lost answer (a cancelled task, a timeout)
is safe. An id that another buffer holds is refused with ``MessageIdTaken``.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowdrop_local import InvalidMessage, Message, MessageIdTaken, Store
from flowdrop_local.engine import new_message_id

from .conftest import snapshot

A, B, C, D = (new_message_id() for _ in range(4))


def _turn(ids: tuple[str, str, str, str]) -> list[dict[str, Any]]:
    """A user turn, a call, its result and the answer, each with its id."""
    return [
        {"role": "user", "content": "weather?", "id": ids[0]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}], "id": ids[1]},
        {"role": "tool", "content": "rain", "tool_call_id": "c1", "id": ids[2]},
        {"role": "assistant", "content": "take an umbrella", "id": ids[3]},
    ]


def test_a_retried_batch_stores_nothing_twice(target: str) -> None:
    """The first append stores each message under its id; the retry drops all four."""
    with Store(target) as store:
        buf = store.buffer("session", "s1", "chat")
        first = buf.append(_turn((A, B, C, D)))
        again = buf.append(_turn((A, B, C, D)))
        assert first.message_ids == (A, B, C, D) and first.appended == 4
        assert (again.appended, again.dropped, again.count, again.message_ids) == (0, 4, 4, ())
        assert [m.id for m in buf.messages()] == [A, B, C, D]
        assert store.check() == []


def test_a_retry_that_goes_further_stores_only_what_is_new(target: str) -> None:
    """A batch of a stored message and a new one: the stored one is dropped, the new appended."""
    with Store(target) as store:
        buf = store.buffer("session", "s1", "chat")
        buf.append({"role": "user", "content": "hi", "id": A})
        result = buf.append(
            [
                {"role": "user", "content": "hi", "id": A},
                {"role": "user", "content": "more", "id": B},
            ]
        )
        assert (result.appended, result.dropped, result.message_ids) == (1, 1, (B,))
        assert [m["content"] for m in buf.read()] == ["hi", "more"]


def test_a_retried_user_turn_after_an_unanswered_call_heals_once(target: str) -> None:
    """The user turn that healed a call is dropped on retry: no second placeholder or turn."""
    with Store(target) as store:
        buf = store.buffer("session", "s1", "chat")
        buf.append({"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]})
        first = buf.append({"role": "user", "content": "next", "id": A})
        again = buf.append({"role": "user", "content": "next", "id": A})
        assert len(first.healed_ids) == 1 and again.healed_ids == () and again.dropped == 1
        assert [m["role"] for m in buf.read()] == ["assistant", "tool", "user"]
        assert store.check() == []


def test_an_id_in_upper_case_is_the_same_id(target: str) -> None:
    """Ids are stored in lower case; a retry spelling the id in upper case is still a duplicate."""
    with Store(target) as store:
        buf = store.buffer("session", "s1", "chat")
        assert buf.append({"role": "user", "content": "hi", "id": A.upper()}).message_ids == (A,)
        assert buf.append({"role": "user", "content": "hi", "id": A.upper()}).dropped == 1


@pytest.mark.parametrize(
    ("bad_id", "why"),
    [
        ("x", "not a UUID"),
        ("", "empty"),
        (123, "not a string"),
        (A.replace("-", ""), "32 hex digits without hyphens"),
        ("{" + A[1:-1] + "}", "braces"),
        ("g" + A[1:], "a letter that is not hex"),
        (A + " ", "37 characters"),
        (["a"], "a list"),
    ],
)
def test_a_malformed_id_is_invalid_and_writes_nothing(
    target: str, bad_id: object, why: str
) -> None:
    """Each malformed id gets InvalidMessage for field "id" at its index; the store is unchanged."""
    with Store(target) as store:
        store.buffer("session", "s1", "chat").append({"role": "user", "content": "before"})
        before = snapshot(target)
        with pytest.raises(InvalidMessage) as raised:
            store.buffer("session", "s1", "chat").append(
                [{"role": "user", "content": "ok"}, {"role": "user", "content": "x", "id": bad_id}]
            )
        assert (raised.value.index, raised.value.field) == (1, "id"), why
        assert snapshot(target) == before


def test_an_id_twice_in_one_batch_is_invalid(target: str) -> None:
    """The second use of an id in one batch is InvalidMessage at its index; nothing is written."""
    with Store(target) as store:
        before = snapshot(target)
        with pytest.raises(InvalidMessage) as raised:
            store.buffer("session", "s1", "chat").append(
                [
                    {"role": "user", "content": "a", "id": A},
                    {"role": "user", "content": "b", "id": A},
                ]
            )
        assert (raised.value.index, raised.value.field) == (1, "id")
        assert not isinstance(raised.value, MessageIdTaken)
        assert snapshot(target) == before


def test_an_id_another_buffer_holds_is_taken_and_writes_nothing(target: str) -> None:
    """Ids are keys across the store: MessageIdTaken (an InvalidMessage) names the index."""
    with Store(target) as store:
        store.buffer("session", "s1", "chat").append({"role": "user", "content": "mine", "id": A})
        before = snapshot(target)
        with pytest.raises(MessageIdTaken) as raised:
            store.buffer("session", "s2", "chat").append(
                [
                    {"role": "user", "content": "new", "id": B},
                    {"role": "user", "content": "x", "id": A},
                ]
            )
        assert isinstance(raised.value, InvalidMessage) and raised.value.index == 1
        assert "s1" not in str(raised.value)  # another buffer's address is not disclosed
        assert snapshot(target) == before
        assert store.buffer("session", "s2", "chat").count() == 0


@pytest.mark.parametrize(
    ("message", "what"),
    [
        ({"role": "user", "content": "hi", "id": None}, "id None: no id given"),
        ({"role": "user", "content": "hi"}, "no id key"),
    ],
)
def test_without_an_id_each_append_stores_a_new_message(message: dict[str, Any], what: str) -> None:
    """With no id (or ``None``) the library makes one: appending twice stores two turns."""
    with Store(":memory:") as store:
        buf = store.buffer("session", "s1", "chat")
        ids = buf.append(message).message_ids + buf.append(message).message_ids
        assert len(set(ids)) == 2, what
        assert "id" not in buf.read()[0]["metadata"]


def test_a_message_record_from_another_buffer_is_copied_under_a_new_id() -> None:
    """A ``Message`` read from one buffer appends to another as a copy: its id is not carried."""
    with Store(":memory:") as store:
        source = store.buffer("session", "s1", "chat")
        source.append({"role": "user", "content": "hi", "id": A})
        [record] = source.messages()
        assert isinstance(record, Message)
        copied = store.buffer("session", "s2", "chat").append(record)
        assert copied.appended == 1 and copied.message_ids != (A,)

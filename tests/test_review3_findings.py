"""Findings of the third review (schema version 3): each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowdrop_local import InvalidImport, Principal, Store

UPPER = "0190A000-0000-7000-8000-00000000000A"


def test_an_import_names_an_upper_case_id_another_buffer_holds(tmp_path: Path) -> None:
    """An imported id is stored in one spelling (lower case), as an append stores it:
    one held by another buffer is InvalidImport naming it (was KeyError), and two
    spellings of one id in an import are the same id."""
    with Store(tmp_path / "x.db") as store:
        store.buffer("app", "x", "a").append({"role": "user", "content": "hi", "id": UPPER})
        record = {"scope": "app", "scope_id": "x", "key": "c", "role": "user", "content": "z"}
        with pytest.raises(InvalidImport, match="already used"):
            store.import_records([{**record, "id": UPPER}])
        with pytest.raises(InvalidImport, match="appears twice"):
            store.import_records([{**record, "id": UPPER}, {**record, "id": UPPER.lower()}])
        store.import_records([{**record, "id": UPPER.replace("A", "B")}])
        (message,) = store.buffer("app", "x", "c").messages()
        assert message.id == UPPER.replace("A", "B").lower()
        assert store.check() == []


@pytest.mark.parametrize("emptied", ["clear", "title"])
def test_an_import_into_a_buffer_that_exists_but_is_empty(tmp_path: Path, emptied: str) -> None:
    """A buffer whose row exists without messages takes an import (was TypeError:
    the count of an empty buffer has no last row to read it from)."""
    with Store(tmp_path / "x.db") as store:
        buffer = store.buffer("app", "x", "k")
        if emptied == "clear":
            buffer.append({"role": "user", "content": "x"})
            buffer.clear()
        else:
            buffer.set_title("t")
        report = store.import_records(
            [{"scope": "app", "scope_id": "x", "key": "k", "role": "user", "content": "hi"}]
        )
        assert report.imported == 1 and len(buffer) == 1
        assert store.check() == []


def test_deleting_a_turn_by_its_upper_case_id_also_deletes_its_placeholder(
    tmp_path: Path,
) -> None:
    """The admin's delete by id takes any case: the turn's healed placeholder goes with
    it, as with the lower-case id (was left behind, and check() reported it)."""
    with Store(tmp_path / "x.db") as store:
        admin = store.sessions(Principal("root", admin=True))
        session = admin.create("wf", owner="alice")
        admin.drive(
            session.id,
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f"}]},
                {"role": "user", "content": "u2"},  # heals c1
            ],
        )
        turn = next(m for m in admin.messages(session.id) if m.role == "assistant")
        admin.delete_message(turn.id.upper())
        assert [m.role for m in admin.messages(session.id)] == ["user", "user"]
        assert store.check() == []


def _twins(tmp_path: Path) -> tuple[Store, Store]:
    from flowdrop_local.syncing import enable

    a = Store(tmp_path / "a.db")
    a.buffer("global", "g", "k0").append({"role": "user", "content": "seed"})
    enable(a)
    a.backup(tmp_path / "b.db")
    return a, Store(tmp_path / "b.db")


def _rows(store: Store) -> list[tuple[object, ...]]:
    return [
        (ref.scope, ref.scope_id, ref.key, m.id, m.position, m.role, m.content)
        for ref in store.buffers()
        for m in store.buffer(ref.scope, ref.scope_id, ref.key).messages()
    ]


def test_sync_refuses_one_id_in_two_buffers_and_changes_nothing(tmp_path: Path) -> None:
    """A caller-supplied id used in another buffer on each side is a typed
    SyncIdConflict naming both buffers (was sqlite3.IntegrityError); neither side changes."""
    from flowdrop_local import SyncIdConflict, sync
    from flowdrop_local.engine import new_message_id

    a, b = _twins(tmp_path)
    with a, b:
        shared = new_message_id()
        a.buffer("global", "g", "k1").append({"role": "user", "content": "A", "id": shared})
        b.buffer("global", "g", "k2").append({"role": "user", "content": "B", "id": shared})
        before = (_rows(a), _rows(b))
        with pytest.raises(SyncIdConflict, match=r"k1.*k2"):
            sync(a, b)
        assert (_rows(a), _rows(b)) == before
        assert a.check() == [] and b.check() == []


def test_sync_refuses_one_id_for_a_turn_and_a_result(tmp_path: Path) -> None:
    """The same id for a user turn on one side and a tool result on the other: a typed
    SyncIdConflict (was sqlite3.IntegrityError from the tool-result index)."""
    from flowdrop_local import SyncIdConflict, sync
    from flowdrop_local.engine import new_message_id

    a, b = _twins(tmp_path)
    with a, b:
        shared = new_message_id()
        a.buffer("global", "g", "k1").append({"role": "user", "content": "A", "id": shared})
        b.buffer("global", "g", "k1").append(
            [
                {"role": "assistant", "content": "c", "tool_calls": [{"id": "c1", "name": "f"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "B", "id": shared},
            ]
        )
        before = (_rows(a), _rows(b))
        with pytest.raises(SyncIdConflict):
            sync(a, b)
        assert (_rows(a), _rows(b)) == before

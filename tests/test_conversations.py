"""Conversations (issue 13): info, title, metadata, the recent listing, delete and fork."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import (
    AccessDenied,
    InvalidAddress,
    InvalidArgument,
    InvalidSession,
    MessageNotFound,
    Principal,
    Store,
)
from flowdrop_local.errors import BufferNotEmpty
from flowdrop_local.model import BufferInfo
from flowdrop_local.rules.pairing import PLACEHOLDER_CONTENT

from .conftest import spec_examples


def _call(call_id: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "metadata": {"tool_calls": [{"tool_call_id": call_id, "name": "search"}]},
    }


def _result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "content": text, "metadata": {"tool_call_id": call_id}}


# ------------------------------------------------------------------ info, title, metadata


class TestInfo:
    def test_a_buffer_without_a_row_reads_as_empty(self, store: Store) -> None:
        """info() of a never-written address: empty title and metadata, no timestamps, 0."""
        assert store.buffer("chat", "u", "k").info() == BufferInfo("chat", "u", "k")

    def test_info_follows_appends(self, store: Store) -> None:
        """count is the buffer's count; created_at and updated_at are set on the first append."""
        buf = store.buffer("chat", "u", "k")
        buf.append([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
        info = buf.info()
        assert (info.count, info.title, info.metadata) == (2, "", {})
        assert info.created_at and info.updated_at and info.address == ("chat", "u", "k")

    def test_set_title_creates_the_row_and_keeps_messages(self, store: Store) -> None:
        """A conversation can be titled before its first message; the title is kept."""
        buf = store.buffer("chat", "u", "k")
        assert buf.set_title("Trip to Lisbon").title == "Trip to Lisbon"
        buf.append({"role": "user", "content": "hi"})
        assert buf.info().title == "Trip to Lisbon" and buf.info().count == 1
        assert buf.set_title("").title == ""

    def test_update_metadata_merges_and_none_removes(self, store: Store) -> None:
        """A shallow merge: keys replace, a None value removes the key, others stay."""
        buf = store.buffer("chat", "u", "k")
        buf.update_metadata({"pinned": True, "model": "x", "tags": ["a"]})
        info = buf.update_metadata({"model": "y", "pinned": None})
        assert info.metadata == {"model": "y", "tags": ["a"]}

    @pytest.mark.parametrize(
        ("title", "problem"),
        [
            (None, "must be a string"),  # not text
            (5, "must be a string"),
            ("x" * 1001, "at most 1,000"),  # a sidebar line, not a document
            ("a\x00b", "NUL"),  # PostgreSQL text cannot hold it
            ("\udcff", "lone surrogate"),  # cannot be stored as UTF-8
        ],
    )
    def test_bad_titles_are_refused(self, store: Store, title: object, problem: str) -> None:
        """Each bad title is an InvalidArgument naming the problem; nothing is written."""
        buf = store.buffer("chat", "u", "k")
        with pytest.raises(InvalidArgument, match=problem):
            buf.set_title(title)  # type: ignore[arg-type]
        assert buf.info().created_at is None

    @pytest.mark.parametrize(
        ("changes", "problem"),
        [
            ([("a", 1)], "must be a mapping"),  # not a mapping
            ({1: "x"}, "keys must be strings"),
            ({"a": object()}, "must be a JSON object"),  # not JSON
            ({"a": float("nan")}, "must be a JSON object"),  # NaN is not JSON
            ({"a": "x" * 1_000_000}, "more than"),  # over 1,000,000 bytes of JSON
        ],
    )
    def test_bad_metadata_is_refused(self, store: Store, changes: Any, problem: str) -> None:
        """Each bad change is an InvalidArgument; the stored metadata is unchanged."""
        buf = store.buffer("chat", "u", "k")
        buf.update_metadata({"kept": 1})
        with pytest.raises(InvalidArgument, match=problem):
            buf.update_metadata(changes)
        assert buf.info().metadata == {"kept": 1}

    def test_refused_buffer_has_empty_info(self, store: Store) -> None:
        """A refused identity scope (user '0') reads as an empty conversation."""
        buf = store.buffer("user", "0", "k")
        assert buf.info() == BufferInfo("user", "", "k") and buf.delete() == 0


# ------------------------------------------------------------------------ listing


def _titled(store: Store, n: int, scope: str = "chat") -> list[tuple[str, str, str]]:
    addresses = []
    for i in range(n):
        buf = store.buffer(scope, f"u{i % 3}", f"c{i}")
        buf.append({"role": "user", "content": f"message {i}"})
        addresses.append(buf.address)
    return addresses


class TestConversations:
    def test_pages_cover_every_buffer_once_most_recent_first(self, store: Store) -> None:
        """Paging with the cursor lists every buffer exactly once, newest updated_at first."""
        _titled(store, 7)
        seen: list[BufferInfo] = []
        page = store.conversations(limit=3)
        sizes = [len(page.items)]
        seen += page.items
        while page.next is not None:
            page = store.conversations(limit=3, after=page.next)
            sizes.append(len(page.items))
            seen += page.items
        assert sizes == [3, 3, 1]
        assert len({info.address for info in seen}) == 7
        stamps = [info.updated_at or "" for info in seen]
        assert stamps == sorted(stamps, reverse=True)

    def test_recently_updated_comes_first(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An append after the granularity moves its buffer to the top of the listing."""
        from flowdrop_local import engine

        old, new = store.buffer("chat", "u", "old"), store.buffer("chat", "u", "new")
        old.append({"role": "user", "content": "1"})
        time.sleep(0.01)
        new.append({"role": "user", "content": "2"})
        assert store.conversations().items[0].key == "new"
        monkeypatch.setattr(engine, "UPDATED_AT_GRANULARITY", 0)  # every append writes it
        time.sleep(0.01)
        old.append({"role": "user", "content": "3"})
        assert [i.key for i in store.conversations().items] == ["old", "new"]

    def test_empty_buffers_are_listed(self, store: Store) -> None:
        """A titled buffer without messages, and a cleared one, are conversations (count 0)."""
        store.buffer("chat", "u", "titled").set_title("Draft")
        cleared = store.buffer("chat", "u", "cleared")
        cleared.append({"role": "user", "content": "x"})
        cleared.clear()
        listed = {i.key: i.count for i in store.conversations().items}
        assert listed == {"titled": 0, "cleared": 0}
        assert store.buffers() == []  # buffers() is unchanged: it lists non-empty ones

    @pytest.mark.parametrize(
        ("filters", "expected"),
        [
            ({"scope": "chat"}, {"c0", "c1", "c2", "c3"}),
            ({"scope": "chat", "scope_id": "u1"}, {"c1"}),
            ({"scope_id": "u0"}, {"c0", "c3", "x0"}),
            ({"scope": "other"}, {"x0", "x1"}),
            ({"scope": "none"}, set()),
        ],
    )
    def test_filters(self, store: Store, filters: dict[str, str], expected: set[str]) -> None:
        """scope and scope_id filter the listing, alone or together, paged the same way."""
        _titled(store, 4)
        _titled(store, 2, scope="other")
        keys: set[str] = set()
        after = None
        while True:
            page = store.conversations(limit=1, after=after, **filters)
            keys |= {i.key.replace("c", "x") if i.scope == "other" else i.key for i in page.items}
            if page.next is None:
                break
            after = page.next
        assert keys == expected

    def test_deleted_and_titled_show_in_listing(self, store: Store) -> None:
        """A deleted buffer leaves the listing; the title shows in it."""
        a, b = store.buffer("chat", "u", "a"), store.buffer("chat", "u", "b")
        a.append({"role": "user", "content": "x"})
        b.append({"role": "user", "content": "y"})
        b.set_title("B")
        a.delete()
        assert [(i.key, i.title, i.count) for i in store.conversations().items] == [("b", "B", 1)]

    @pytest.mark.parametrize(
        ("kwargs", "error"),
        [
            ({"order": "oldest"}, InvalidArgument),  # only "recent"
            ({"limit": -1}, InvalidArgument),
            ({"limit": True}, InvalidArgument),
            ({"after": "not a cursor!"}, InvalidArgument),
            ({"after": "MTIz"}, InvalidArgument),  # base64 of "123": no separator
            ({"after": 5}, InvalidArgument),
            ({"scope": 5}, InvalidAddress),
            ({"scope_id": 5}, InvalidAddress),
        ],
    )
    def test_bad_arguments(self, store: Store, kwargs: dict[str, Any], error: type) -> None:
        """Each bad argument is a typed error before any SQL runs."""
        with pytest.raises(error):
            store.conversations(**kwargs)

    def test_limit_zero_is_an_empty_last_page(self, store: Store) -> None:
        _titled(store, 2)
        assert (
            store.conversations(limit=0).items == () and store.conversations(limit=0).next is None
        )


def test_recent_page_reads_a_range_of_the_recency_index(tmp_path: Path) -> None:
    """SQLite's plan for a page is a search of buffers_recent, never a scan or a sort."""
    from flowdrop_local.backends.sqlite import SQL

    with Store(tmp_path / "x.db") as store:
        conn = store.db.conn
        plan = conn.execute(
            "EXPLAIN QUERY PLAN " + SQL["conversations_recent"],
            ("9999", 1, None, None, 10),
        ).fetchall()
    details = " | ".join(row[3] for row in plan)
    assert "SEARCH b USING INDEX buffers_recent" in details, details
    assert "TEMP B-TREE" not in details, details


# ------------------------------------------------------------------------- delete


class TestDelete:
    def test_delete_removes_row_messages_and_ledger(self, store: Store) -> None:
        """delete() returns how many messages went; the address then reads as never written."""
        buf = store.buffer("chat", "u", "k")
        buf.append([{"role": "user", "content": "q"}, _call("c1"), _result("c1", "r")])
        buf.set_title("T")
        assert buf.delete() == 3
        assert buf.info() == BufferInfo("chat", "u", "k") and buf.read() == []
        assert buf.delete() == 0
        assert store.check() == []

    def test_a_handle_appends_again_after_delete(self, store: Store) -> None:
        """The same handle (and another one) can start the buffer afresh."""
        buf, other = store.buffer("chat", "u", "k"), store.buffer("chat", "u", "k")
        buf.append(_call("c1"))
        other.append({"role": "user", "content": "seen"})  # heals c1; other caches the id
        assert buf.delete() == 3
        other.append({"role": "user", "content": "new"})
        assert [m["content"] for m in buf.read()] == ["new"]
        assert store.check() == []

    def test_a_stale_handle_never_writes_into_a_buffer_that_reused_the_id(
        self, tmp_path: Path
    ) -> None:
        """SQLite gives a deleted buffer's row id to the next new buffer: a handle that
        knew the old id still appends to, pops from and clears its own address."""
        with Store(tmp_path / "x.db") as store:
            stale = store.buffer("chat", "u", "old")
            stale.append({"role": "user", "content": "mine"})
            store.buffer("chat", "u", "old").delete()
            newcomer = store.buffer("chat", "u", "new")
            newcomer.append({"role": "user", "content": "theirs"})
            assert newcomer._id == stale._id  # the id was reused
            stale.append({"role": "user", "content": "mine again"})
            assert [m["content"] for m in newcomer.read()] == ["theirs"]
            assert [m["content"] for m in stale.read()] == ["mine again"]
            assert stale.pop() is not None and stale.clear() == 0
            assert [m["content"] for m in newcomer.read()] == ["theirs"]

    def test_delete_from_another_connection_is_seen(self, tmp_path: Path) -> None:
        """A buffer deleted through another Store is recreated, not written under its old id."""
        path = tmp_path / "x.db"
        with Store(path) as one, Store(path) as two:
            buf = one.buffer("chat", "u", "k")
            buf.append({"role": "user", "content": "a"})
            assert two.buffer("chat", "u", "k").delete() == 1
            two.buffer("chat", "u", "other").append({"role": "user", "content": "b"})
            buf.append({"role": "user", "content": "c"})
            assert [m["content"] for m in buf.read()] == ["c"]
            assert [m["content"] for m in two.buffer("chat", "u", "other").read()] == ["b"]


# --------------------------------------------------------------- sessions' delete


@pytest.mark.parametrize(
    ("principal", "code"),
    [
        (Principal(user_id="owner"), "delete_denied"),  # the owner too: MEM-15
        (Principal(user_id="viewer"), "delete_denied"),  # a granted viewer
        (Principal(user_id="stranger"), "delete_denied"),
        (Principal(), "delete_denied"),  # anonymous: owns nothing (MEM-9)
        (Principal(user_id="0"), "delete_denied"),  # "0" is nobody
        (Principal(user_id="owner", admin=True), None),  # the administrative tier
    ],
)
def test_delete_conversation_is_admin_only(
    store: Store, principal: Principal, code: str | None
) -> None:
    """Only an admin deletes a session's conversation; every other principal is denied
    and nothing is deleted."""
    owner = store.sessions(Principal(user_id="owner"))
    session = owner.create("wf")
    owner.grant(session.id, "viewer")
    owner.drive(session.id, {"role": "user", "content": "hello"})
    api = store.sessions(principal)
    if code is None:
        assert api.delete_conversation(session.id) == 1
        assert owner.read(session.id) == []
        assert owner.get(session.id).id == session.id  # the session stays
    else:
        with pytest.raises(AccessDenied) as denied:
            api.delete_conversation(session.id)
        assert denied.value.error_code == code
        assert len(owner.read(session.id)) == 1


def test_delete_conversation_missing_session_and_old_conversations(store: Store) -> None:
    """A non-admin gets delete_denied for a missing session, an admin session_unavailable;
    an earlier conversation is deleted by number, and a number out of range is refused."""
    with pytest.raises(AccessDenied, match="delete_denied"):
        store.sessions(Principal(user_id="x")).delete_conversation("nope")
    admin = store.sessions(Principal(admin=True))
    with pytest.raises(AccessDenied, match="session_unavailable"):
        admin.delete_conversation("nope")
    session = admin.create("wf", owner="owner")
    admin.drive(session.id, {"role": "user", "content": "first"})
    admin.reset(session.id)
    admin.drive(session.id, {"role": "user", "content": "second"})
    assert admin.delete_conversation(session.id, conversation=0) == 1
    assert admin.read(session.id, conversation=0) == []
    assert [m["content"] for m in admin.read(session.id)] == ["second"]
    for bad in (2, -1, True, "0"):
        with pytest.raises(InvalidSession):
            admin.delete_conversation(session.id, conversation=bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- fork


class TestFork:
    def test_fork_copies_up_to_the_cut_with_new_ids_and_positions_kept(self, store: Store) -> None:
        """History through ``at``; positions, content and timestamps kept; ids new."""
        src = store.buffer("chat", "u", "main")
        src.append([{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}])
        src.append([{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}])
        original = src.messages()
        fork = src.fork(at=original[2].id, to=("chat", "u", "edit"))
        copied = fork.messages()
        assert [(m.position, m.role, m.content, m.created_at) for m in copied] == [
            (m.position, m.role, m.content, m.created_at) for m in original[:3]
        ]
        assert not {m.id for m in copied} & {m.id for m in original}
        assert len(fork) == 3 and fork.info().count == 3
        assert len(src) == 4  # the source is untouched
        fork.append({"role": "user", "content": "q2, edited"})
        assert [m["content"] for m in fork.read()] == ["s", "q1", "a1", "q2, edited"]
        assert store.check() == []

    def test_mem3_call_answered_after_the_cut_is_healed_by_the_forks_next_user_turn(
        self, store: Store
    ) -> None:
        """MEM-3 (spec example): a fork cut after the call but before its result holds the
        call unanswered; the fork's next user turn places the placeholder right after it."""
        before, healed = spec_examples("MEM-3")[0]["json"], spec_examples("MEM-3")[1]["json"]
        src = store.buffer("chat", "u", "main")
        src.append(before[:1])  # the call
        src.append(_result("c1", "found it"))  # answered later in the source
        src.append(before[1:])
        call_id = src.messages()[0].id
        fork = src.fork(at=call_id, to=("chat", "u", "fork"))
        assert [m["role"] for m in fork.read()] == ["assistant"]
        assert store.check() == []  # an unanswered call with no user turn after it is sound
        fork.append(before[1:])
        result = fork.append({"role": "user", "content": "try again"})
        assert result.healed_ids == ()  # healed already by the first user turn of the fork
        assert fork.read() == healed
        assert [m["content"] for m in src.read()][1] == "found it"  # source untouched
        assert store.check() == []

    def test_calls_answered_before_the_cut_stay_answered(self, store: Store) -> None:
        """A result inside the cut answers its call in the fork: no healing, no duplicate."""
        src = store.buffer("chat", "u", "main")
        src.append([{"role": "user", "content": "q"}, _call("c1"), _result("c1", "r")])
        src.append({"role": "assistant", "content": "done"})
        fork = src.fork(at=src.messages()[2].id, to=("chat", "u", "fork"))
        result = fork.append({"role": "user", "content": "next"})
        assert result.healed_ids == ()
        assert fork.append(_result("c1", "again")).dropped == 1  # MEM-1 holds in the fork
        assert store.check() == []

    def test_a_healed_placeholder_is_copied_and_can_still_be_replaced(self, store: Store) -> None:
        """A placeholder inside the cut stays one: the real result replaces it (MEM-10)."""
        src = store.buffer("chat", "u", "main")
        src.append([_call("c1"), {"role": "user", "content": "anything?"}])
        cut = src.messages()[1]
        assert cut.healed
        fork = src.fork(at=cut.id, to=("chat", "u", "fork"))
        assert fork.append(_result("c1", "late")).replaced_ids
        assert [m["content"] for m in fork.read()] == ["", "late"]
        assert src.read()[1]["content"] == PLACEHOLDER_CONTENT
        assert store.check() == []

    def test_fork_into_an_empty_existing_buffer_keeps_its_title(self, store: Store) -> None:
        src = store.buffer("chat", "u", "main")
        src.append({"role": "user", "content": "q"})
        store.buffer("chat", "u", "fork").set_title("Fork")
        fork = src.fork(at=src.messages()[0].id, to=("chat", "u", "fork"))
        assert fork.info().title == "Fork" and fork.info().count == 1

    @pytest.mark.parametrize(
        ("at", "to", "error"),
        [
            ("no-such-id", ("chat", "u", "f"), MessageNotFound),
            ("00000000-0000-7000-8000-000000000000", ("chat", "u", "f"), MessageNotFound),
            (None, ("chat", "u", "f"), InvalidArgument),  # at must be an id
            ("ID", ("chat", "u"), InvalidAddress),  # not a 3-tuple
            ("ID", "chat/u/f", InvalidAddress),
            ("ID", ("chat", "u", ""), InvalidAddress),  # blank key
            ("ID", ("user", "0", "f"), InvalidAddress),  # an identity scope naming nobody
            ("ID", ("chat", "u", "full"), BufferNotEmpty),  # the target holds messages
            ("ID", ("chat", "u", "main"), BufferNotEmpty),  # itself
            ("OTHER", ("chat", "u", "f"), MessageNotFound),  # a message of another buffer
        ],
    )
    def test_bad_forks_are_refused_and_write_nothing(
        self, store: Store, at: Any, to: Any, error: type
    ) -> None:
        src = store.buffer("chat", "u", "main")
        src.append({"role": "user", "content": "q"})
        full = store.buffer("chat", "u", "full")
        full.append({"role": "user", "content": "other"})
        at = {"ID": src.messages()[0].id, "OTHER": full.messages()[0].id}.get(at, at)
        with pytest.raises(error):
            src.fork(at=at, to=to)
        assert store.buffer("chat", "u", "f").info().created_at is None
        assert len(full) == 1 and len(src) == 1

    def test_fork_of_a_missing_buffer(self, store: Store) -> None:
        with pytest.raises(MessageNotFound):
            store.buffer("chat", "u", "none").fork(
                at="00000000-0000-7000-8000-000000000000", to=("chat", "u", "f")
            )

    def test_long_fork_copies_in_runs_and_reports_progress(self, store: Store) -> None:
        """A fork longer than a run copies in several statements, tally right, progress told."""
        from flowdrop_local import buffer as buffer_module

        src = store.buffer("chat", "u", "main")
        src.append([{"role": "user", "content": str(i)} for i in range(25)])
        calls: list[tuple[int, int]] = []
        old = buffer_module.FORK_RUN
        buffer_module.FORK_RUN = 10
        try:
            fork = src.fork(
                at=src.messages()[22].id,
                to=("chat", "u", "f"),
                progress=lambda done, total: calls.append((done, total)),
            )
        finally:
            buffer_module.FORK_RUN = old
        assert calls == [(10, 23), (20, 23), (23, 23)]
        assert len(fork) == 23 and [m["content"] for m in fork.read()] == [
            str(i) for i in range(23)
        ]
        assert fork.append({"role": "user", "content": "x"}).count == 24
        assert store.check() == []


def test_fork_ids_are_version_7(tmp_path: Path) -> None:
    """The ids a fork makes inside SQLite are UUIDv7, as appends make them."""
    import uuid

    with Store(tmp_path / "x.db") as store:
        src = store.buffer("chat", "u", "main")
        src.append({"role": "user", "content": "q"})
        fork = src.fork(at=src.messages()[0].id, to=("chat", "u", "f"))
        made = uuid.UUID(fork.messages()[0].id)
    assert made.version == 7 and made.variant == uuid.RFC_4122


def test_fork_ids_are_version_7_on_postgresql(postgresql_url: str) -> None:
    import uuid

    with Store(postgresql_url) as store:
        src = store.buffer("chat", "u", "main")
        src.append([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
        fork = src.fork(at=src.messages()[1].id, to=("chat", "u", "f"))
        made = [uuid.UUID(m.id) for m in fork.messages()]
    assert all(m.version == 7 and m.variant == uuid.RFC_4122 for m in made)
    assert len(set(made)) == 2


def test_sqlite_schema_untouched_by_conversations(tmp_path: Path) -> None:
    """Titles, forks and deletes add no schema object: the file still verifies as ours."""
    path = tmp_path / "x.db"
    with Store(path) as store:
        src = store.buffer("chat", "u", "main")
        src.append({"role": "user", "content": "q"})
        src.fork(at=src.messages()[0].id, to=("chat", "u", "f")).set_title("t")
        src.delete()
    conn = sqlite3.connect(path)
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert not any("search" in name for name in names)


def test_refused_buffer_drops_titles_and_has_nothing_to_fork(store: Store) -> None:
    """A refused identity scope validates a title then drops it (as MEM-7 drops a turn);
    it holds no message to fork at; bad input is still an error."""
    buf = store.buffer("session", "", "k")
    assert buf.set_title("x") == BufferInfo("session", "", "k")
    assert buf.update_metadata({"a": 1}) == BufferInfo("session", "", "k")
    with pytest.raises(InvalidArgument):
        buf.set_title(5)  # type: ignore[arg-type]
    with pytest.raises(MessageNotFound):
        buf.fork(at="x", to=("chat", "u", "f"))
    assert store.conversations().items == ()

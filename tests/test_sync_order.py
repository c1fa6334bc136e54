"""The one order every replica gives a buffer (rules.order, sync.order): links made
when a sync first sees a message, read depth first; deleted messages keep their
place; a peer's links are untrusted; stores synced before links take them."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import Store, SyncRefused, sync
from flowdrop_local.rules.merge import Entry, merge
from flowdrop_local.rules.order import (
    MAX_RANK,
    ROOT,
    Link,
    link_new,
    tree_order,
)
from flowdrop_local.sync.schema import schema_steps
from flowdrop_local.syncing import enable

from .conftest import snapshot

K = ("global", "", "k")

# ------------------------------------------------------------------ the tree, pure

# (links, ids wanted, expected order)
TREES = [
    pytest.param(
        {"q": (ROOT, 0), "u": ("q", 0), "r": ("u", 0), "v": ("q", 0)},
        "qurv",
        "qurv",
        id="two blocks after one message: each whole, the lower first id first",
    ),
    pytest.param(
        {"q": (ROOT, 0), "u": ("q", 0), "h": ("q", 1), "r": ("u", 0)},
        "qhur",
        "qhur",
        id="a higher rank reads first: a row placed right after its parent stays there",
    ),
    pytest.param(
        {"q": (ROOT, 0), "x": ("q", 0), "y": ("x", 0), "z": ("q", 0)},
        "qyz",
        "qyz",
        id="a deleted message keeps its place: what followed it stays before z",
    ),
    pytest.param(
        {"q": (ROOT, 0), "y": ("gone", 0)},
        "qy",
        "qy",
        id="a parent no store here holds: hangs from the root",
    ),
    pytest.param(
        {"q": (ROOT, 0), "a": ("b", 0), "b": ("a", 0)},
        "qab",
        "qab",
        id="a cycle (a hostile file) is read after the rest, from its lowest id",
    ),
]


@pytest.mark.parametrize(("links", "wanted", "expected"), TREES)
def test_the_tree_read_depth_first(links: dict[str, Link], wanted: str, expected: str) -> None:
    assert tree_order(_ids(wanted, links), links) == _ids(expected, links)


def _ids(text: str, links: dict[str, Link]) -> list[str]:
    """Split a run of one-letter ids, and the two-letter ones the table names."""
    names = sorted(links, key=len, reverse=True)
    found = []
    while text:
        name = next(n for n in names if text.startswith(n))
        found.append(name)
        text = text[len(name) :]
    return found


def test_an_id_without_a_link_is_an_error() -> None:
    with pytest.raises(ValueError, match="without a link"):
        tree_order(["q", "x"], {"q": (ROOT, 0)})


LINKING = [
    pytest.param(
        ["q", "u", "r"], {}, {}, {"q": (ROOT, 0), "u": ("q", 0), "r": ("u", 0)},
        id="appends at the end: a chain of rank 0",
    ),
    pytest.param(
        ["q", "h", "u"], {"q": (ROOT, 0), "u": ("q", 0)}, {}, {"h": ("q", 1)},
        id="placed between q and its child u: ranks above u, reads before it",
    ),
    pytest.param(
        ["q", "h"], {"q": (ROOT, 0)}, {"q": 4}, {"h": ("q", 5)},
        id="above a deleted child the store holds too (its rank read from the store)",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("order", "links", "ranks", "made"), LINKING)
def test_links_made_from_a_stores_order(
    order: list[str], links: dict[str, Link], ranks: dict[str, int], made: dict[str, Link]
) -> None:
    """Each new link keeps the store's order: the tree reads it back as it stood."""
    known = dict(links)
    assert link_new(order, known, list(links.values()), ranks) == made
    assert tree_order(order, known) == order


def test_a_block_another_store_appended_after_the_same_message_does_not_raise_a_rank() -> None:
    """What the other side holds is left out of the ranks: two blocks appended after q
    on two stores are both rank 0, and stand by their first ids."""
    links = {"q": (ROOT, 0), "u": ("q", 0)}  # the other side's block, linked first
    link_new(["q", "s"], links, [(ROOT, 0)], {})
    assert links["s"] == ("q", 0)


def test_the_merge_takes_the_order_and_keeps_the_most_keys() -> None:
    """Keys only store the order: the most messages keep a key (a message both hold
    at two keys, either side's), and the others get keys between their neighbours'."""
    q = Entry("q", "a0", "user", "{}", "f1", "t")
    a = [
        q,
        Entry("x", "a5", "assistant", "{}", "f2", "t"),
        Entry("y", "a6", "user", "{}", "f3", "t"),
    ]
    b = [
        q,
        Entry("x", "a4", "assistant", "{}", "f2", "t"),
        Entry("z", "a5", "user", "{}", "f4", "t"),
    ]
    merged = merge(a, b, ["q", "x", "z", "y"])
    assert [(p.entry.id, p.position) for p in merged.placed] == [
        ("q", "a0"), ("x", "a4"), ("z", "a5"), ("y", "a6")
    ]  # fmt: skip
    merged = merge(a, b, ["q", "y", "x", "z"])  # keys that no longer ascend: new ones
    placed = [(p.entry.id, p.position) for p in merged.placed]
    assert [i for i, _ in placed] == ["q", "y", "x", "z"]
    keys = [k for _, k in placed]
    assert keys == sorted(keys) and len(set(keys)) == 4 and merged.rekeyed == 1  # y
    with pytest.raises(ValueError, match="every message"):
        merge(a, b, ["q", "x", "y"])


# ------------------------------------------------------------------ across stores


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def said(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def stores(tmp_path: Path, count: int) -> list[Store]:
    first = Store(str(tmp_path / "s0.db"))
    first.buffer(*K).append(user("q"))
    enable(first)
    for n in range(1, count):
        first.backup(str(tmp_path / f"s{n}.db"))
    return [first, *(Store(str(tmp_path / f"s{n}.db")) for n in range(1, count))]


def order(store: Store) -> list[str]:
    return [str(m.content) for m in store.buffer(*K).messages()]


def test_what_followed_a_deleted_message_keeps_its_place_where_it_never_was(
    tmp_path: Path,
) -> None:
    """a writes x, b answers it (y), a pops x and writes w. c never held x: it takes y
    from b, then a's deletion of x, and all three read w (written after q when q
    already had a child, x: so first among q's children) before y (below x)."""
    a, b, c = stores(tmp_path, 3)
    a.buffer(*K).append(said("x"))
    sync(a, b)
    b.buffer(*K).append(user("y"))
    a.buffer(*K).pop()
    a.buffer(*K).append(said("w"))
    sync(b, c)
    sync(a, c)
    sync(a, b)
    assert order(a) == order(b) == order(c) == ["q", "w", "y"]


def test_a_window_does_not_walk_the_deleted_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """a appends through a window of 20, syncing with c as it goes (each row linked
    while what it followed stood). At message 260, b took the history from c and
    appended b1, linked at a sync with d. 300 messages later, a and b merge whole:
    each line up (from a's rows, from b1) climbs until they meet, where b1 was
    written, and reads no further: the deleted links read are those between, not
    the history back to its start."""
    import importlib

    order_module = importlib.import_module("flowdrop_local.sync.order")
    a, b, c, d = stores(tmp_path, 4)
    window = a.buffer(*K, window=20)
    for n in range(150):
        window.append([user(f"u{n}"), said(f"s{n}")])
        if n % 5 == 4:
            sync(a, c)
        if n == 129:
            sync(b, c)
            b.buffer(*K).append(user("b1"))
            sync(b, d)
    fetched: list[int] = []
    real = order_module._fetch

    def counting(sides: Any, ids: list[str], held: Any) -> Any:
        fetched.append(len(ids))
        return real(sides, ids, held)

    monkeypatch.setattr(order_module, "_fetch", counting)
    report = sync(a, b, full=True)
    assert report.buffers_merged == 1 and len(_links(a.path)) > 250
    assert 0 < sum(fetched) <= 2 * 20 + 2, fetched  # both lines, the 20 deleted between
    assert order(a) == order(b) and "b1" in order(a)


def _links(path: str) -> dict[str, tuple[str, int]]:
    """A store's links as the file holds them (ids as 16 bytes, the root's parent NULL)."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT id, parent, rank FROM flowdrop_sync_links").fetchall()
    finally:
        conn.close()
    return {
        str(uuid.UUID(bytes=r[0])): (ROOT if r[1] is None else str(uuid.UUID(bytes=r[1])), r[2])
        for r in rows
    }


def _tamper(path: str, sql: str, *params: object) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql, params)
    conn.close()


@pytest.mark.parametrize(
    ("parent", "rank", "problem"),
    [
        ("not an id", 0, "malformed link"),
        ("self", 0, "malformed link"),
        ("01a23502-4148-7000-8000-00000000000G", 0, "malformed link"),
        (b"\x01" * 15, 0, "malformed link"),
        (ROOT, 2**40, "order rank of"),
        (ROOT, -2, "order rank of"),
    ],
)
def test_a_peers_bad_link_is_refused(tmp_path: Path, parent: Any, rank: int, problem: str) -> None:
    """A link names a message id (never its own) or the root, with a rank in bounds;
    anything else is refused, and neither side changes."""
    a, b = stores(tmp_path, 2)
    b.buffer(*K).append(said("from b"))
    sync(a, b)
    a.buffer(*K).append(user("more"))
    b.buffer(*K).append(user("more from b"))
    b.close()
    last = uuid.UUID(max(_links(b.path))).bytes  # a UUIDv7: the newest linked message
    stored: object = last if parent == "self" else parent if parent else None
    _tamper(
        b.path,
        "UPDATE flowdrop_sync_links SET parent = ?, rank = ? WHERE id = ?",
        stored,
        rank,
        last,
    )
    b = Store(b.path)
    before = (snapshot(a.path), snapshot(b.path))
    with pytest.raises(SyncRefused, match=problem):
        sync(a, b, full=True)
    assert (snapshot(a.path), snapshot(b.path)) == before


def test_a_store_synced_before_links_takes_step_3_and_orders_alike(tmp_path: Path) -> None:
    """A store at sync schema step 2 (its merges counted moves, no links): its next
    sync takes step 3 (the moves table goes, links come), and three replicas that
    synced before links order what they share alike from then on."""
    a, b, c = stores(tmp_path, 3)
    a.buffer(*K).append(said("a1"))
    sync(a, b)
    for store in (a, b, c):
        store.close()
        _tamper(store.path, "DROP TABLE flowdrop_sync_links")
        _tamper(
            store.path,
            "CREATE TABLE flowdrop_sync_moves (id TEXT PRIMARY KEY, "
            "position TEXT NOT NULL, generation BIGINT NOT NULL)",
        )
        _tamper(store.path, "ALTER TABLE flowdrop_sync_tombstones DROP COLUMN kind")
        _tamper(store.path, "UPDATE flowdrop_sync_schema SET step = 2")
    a, b, c = (Store(s.path) for s in (a, b, c))
    a.buffer(*K).append(user("a2"))
    b.buffer(*K).append(user("b1"))
    c.buffer(*K).append(user("c1"))
    sync(a, b)
    sync(b, c)
    sync(c, a)
    sync(a, b)
    assert order(a) == order(b) == order(c)
    steps = len(schema_steps(postgresql=False))
    for store in (a, b, c):
        conn = sqlite3.connect(store.path)
        try:
            assert conn.execute("SELECT step FROM flowdrop_sync_schema").fetchall() == [(steps,)]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        finally:
            conn.close()
        assert "flowdrop_sync_moves" not in tables and "flowdrop_sync_links" in tables
        assert len(_links(store.path)) == len(order(store))
        assert store.check() == []


def test_a_backup_and_its_store_hold_the_same_links(tmp_path: Path) -> None:
    """Found by the four-replica test (seed 833344, now one of its examples): a store
    and its backup both held messages written since the last sync without links.
    The store then lost the message before them to a peer's deletion and linked the
    next one after the message before that; the backup, still holding it, linked it
    after it: two links for one message, and two replicas ordering what they share
    apart. A backup now links every message first: both hold the same links."""
    a, b = stores(tmp_path, 2)
    a.buffer(*K).append([said("m"), user("a1")])
    b.buffer(*K).append(user("b1"))
    sync(a, b)
    a.buffer(*K).append([said("a2"), user("a3")])
    a.buffer("global", "", "other").append(user("o1"))
    a.backup(str(tmp_path / "copy.db"))
    copy = Store(str(tmp_path / "copy.db"))
    ids = {m.id for r in a.buffers() for m in a.buffer(r.scope, r.scope_id, r.key).messages()}
    a.close()
    copy.close()
    assert set(_links(a.path)) >= ids
    assert _links(copy.path) == _links(a.path)


def test_the_sql_link_rule_links_as_a_merge_does(tmp_path: Path) -> None:
    """The link rule is written twice: in Python for merges (``rules.order.link_new``)
    and as one statement for a whole store (``sync_link_everything``, before a
    backup). Two copies of one store, one linked each way, hold the same links: a
    buffer synced and then appended to (after a deleted child: rank 1), one never
    synced, one emptied and written again."""
    import shutil

    a, b = stores(tmp_path, 2)
    a.buffer(*K).append([said("m1"), user("x")])
    sync(a, b)
    a.buffer(*K).pop()  # x: its link stays, so the next child of m1 ranks 1
    a.buffer(*K).append([said("m2"), user("m3")])
    a.buffer("global", "", "never").append([user("n1"), said("n2"), user("n3")])
    a.buffer("global", "", "again").append(user("g1"))
    sync(a, b)
    a.buffer("global", "", "again").clear()
    a.buffer("global", "", "again").append([user("g2"), said("g3")])
    a.close()
    for name in ("by_sql", "by_merge"):
        shutil.copy(a.path, tmp_path / f"{name}.db")
    by_sql = Store(str(tmp_path / "by_sql.db"))
    by_sql.backup(str(tmp_path / "by_sql_copy.db"))  # links every message in SQL
    by_merge = Store(str(tmp_path / "by_merge.db"))
    peer = Store(str(tmp_path / "peer.db"))
    sync(by_merge, peer, scopes="all")  # each buffer merged whole, linked in Python
    ids = {
        m.id
        for r in by_merge.buffers()
        for m in by_merge.buffer(r.scope, r.scope_id, r.key).messages()
    }
    for store in (by_sql, by_merge, peer):
        store.close()
    sql_links, merge_links = _links(by_sql.path), _links(by_merge.path)
    assert set(sql_links) >= ids and set(merge_links) >= ids
    assert {i: sql_links[i] for i in ids} == {i: merge_links[i] for i in ids}
    rank_one = [i for i in ids if merge_links[i][1] == 1]
    assert len(rank_one) == 1 and sql_links[rank_one[0]][1] == 1  # m2, after the deleted x


# ------------------------------------------- review 10's campaign (helper, 2,450 runs)


def _agree(*replicas: Store) -> None:
    """Every two replicas order the messages they both hold alike."""
    orders = [[str(m.id) for m in r.buffer(*K).messages()] for r in replicas]
    for i, x in enumerate(orders):
        for y in orders[i + 1 :]:
            both = set(x) & set(y)
            assert [m for m in x if m in both] == [m for m in y if m in both]


def test_a_rank_at_the_bound_does_not_push_the_next_past_it() -> None:
    """A peer's rank at the highest a store takes: the next child's rank stays there
    (before: one above, which the next sync refused, on the honest pair too)."""
    links = {"q": (ROOT, 0), "u": ("q", MAX_RANK)}
    assert link_new(["q", "h", "u"], links, list(links.values()), {}) == {"h": ("q", MAX_RANK)}


def test_a_deleted_parents_link_travels_with_its_child(tmp_path: Path) -> None:
    """c writes p, then s after it (each linked at a sync with d); b writes u after
    q; d removes q and p, a pops q. a takes s from c alone, with no line to walk up:
    p's link must come with s's, or a and b read s as hanging from the root (u
    before s) where d, holding p's link, reads s below p (before u). Review 10
    found this with stores whose first messages had no links; since backups link
    first, this shape no longer loses the link before the fix either, and the test
    keeps the invariant (a store holding a link holds its ancestors')."""
    from flowdrop_local.engine import remove_message
    from flowdrop_local.plans import run_plan

    a, b, c, d = stores(tmp_path, 4)
    c.buffer(*K).append(said("p"))
    sync(c, d)
    c.buffer(*K).append(user("s"))
    sync(c, d)
    b.buffer(*K).append(user("u"))
    with d.backend.write() as tx:
        for m in d.buffer(*K).messages():
            if m.content in ("q", "p"):
                run_plan(remove_message(m.id), tx)
    a.buffer(*K).pop()
    for x, y in ((c, d), (c, a), (a, b), (b, d), (a, d), (c, b)):
        sync(x, y, full=True)
        _agree(a, b, c, d)
    assert order(a) == order(b) == order(c) == order(d) == ["s", "u"]


@pytest.mark.parametrize("synced_before_links", [False, True])
def test_copies_linked_by_a_grown_merge_and_a_whole_one_link_alike(
    tmp_path: Path, synced_before_links: bool
) -> None:
    """Six copies of q p: a and e merge what they appended (an incremental merge),
    b and d merge whole, c clears and starts again. The incremental merge used to
    give p a link of its own (the end of what both held unlinked), the whole merge
    another: where they met, what followed p moved. Copies made by ``backup`` hold
    links; copies of a store synced before links merge whole at first."""
    a = Store(str(tmp_path / "a.db"))
    a.buffer(*K).append([user("q"), said("p")])
    enable(a)
    for n in "bcdef":
        a.backup(str(tmp_path / f"{n}.db"))
    if synced_before_links:
        for n in "abcdef":
            _tamper(str(tmp_path / f"{n}.db"), "DELETE FROM flowdrop_sync_links")
    a = Store(str(tmp_path / "a.db"))
    b, c, d, e, f = (Store(str(tmp_path / f"{n}.db")) for n in "bcdef")
    a.buffer(*K).append(user("x"))
    sync(a, e)
    b.buffer(*K).append(user("z"))
    sync(b, d, full=True)
    c.buffer(*K).clear()
    c.buffer(*K).append(user("w"))
    sync(c, f, full=True)
    for x, y in ((c, b), (c, a), (a, b), (d, e)):
        sync(x, y)
        _agree(a, b, c, d, e, f)


def test_a_result_answered_in_place_by_two_merges_apart_is_linked_alike(tmp_path: Path) -> None:
    """Two pairs each moved one result into its call's tool run, making the same row
    (its id derived from the result's) from two orders: two links, and the row and
    x ordered apart once they met. The row now has the one link every merge gives
    it: right after the turn declaring the call."""
    s0 = Store(str(tmp_path / "s0.db"))
    s0.buffer(*K).append(user("start"))
    enable(s0)
    for n in (1, 2):
        s0.backup(str(tmp_path / f"s{n}.db"))
    s1, s2 = Store(str(tmp_path / "s1.db")), Store(str(tmp_path / "s2.db"))
    s0.buffer(*K).append(user("u0"))
    s1.buffer(*K).append(user("u1"))
    s0.buffer(*K).append({"role": "assistant", "content": "call", "tool_calls": [{"id": "c0"}]})
    result_id = "01a23600-0000-7000-8000-000000000001"  # its derived id sorts after x's
    s1.buffer(*K).append({"id": result_id, "role": "tool", "tool_call_id": "c0", "content": "r"})
    s0.backup(str(tmp_path / "s3.db"))
    s1.backup(str(tmp_path / "s4.db"))
    s3, s4 = Store(str(tmp_path / "s3.db")), Store(str(tmp_path / "s4.db"))
    s3.buffer(*K).append(said("x"))
    for x, y in ((s0, s1), (s3, s4), (s0, s2), (s2, s3), (s1, s4), (s0, s4)):
        sync(x, y)
        _agree(s0, s1, s2, s3, s4)
    for store in (s0, s1, s2, s3, s4):
        assert store.check() == []


def test_two_results_filling_one_placeholder_apart_are_a_conflict(tmp_path: Path) -> None:
    """b fills the placeholder by an append (an edit of it), a merge of a and c
    replaces it with a's result: the fill by the merge counted no edit, so b's won
    silently and a's result was lost. A merge's replacement now keeps the result's
    own row (answered in the tool run): two results of one call, a MEM-1 conflict,
    the other kept for the user on every store."""
    from flowdrop_local.syncing import conflicts

    a, b, c = stores(tmp_path, 3)
    c.buffer(*K).append({"role": "assistant", "content": "", "tool_calls": [{"id": "c2"}]})
    b.buffer(*K).append(user("u"))
    sync(c, b, full=True)
    a.buffer(*K).append({"role": "tool", "tool_call_id": "c2", "content": "result from A"})
    b.buffer(*K).append({"role": "tool", "tool_call_id": "c2", "content": "result from B"})
    sync(a, c)
    sync(a, b, full=True)
    sync(b, c)
    assert order(a) == order(b) == order(c)
    kept = [m for m in order(a) if m.startswith("result")]
    assert len(kept) == 1
    lost = {"result from A", "result from B"} - set(kept)
    for store in (a, b, c):
        assert [x["message"]["content"] for x in conflicts(store) if x["rule"] == "MEM-1"] == [
            *lost
        ]


# ------------------------------------ results a merge places, and their deletions
# Found by the second campaign over order (5,112 random runs, 23 failures): each
# test below failed before its fix.


def _id(n: int) -> str:
    return f"01900000-0000-7000-8000-{n:012x}"


LATE = "7f000000-0000-7000-8000-00000000000{}"  # ids above any UUIDv7 made today


def _call(n: int, *calls: str) -> dict[str, Any]:
    tool_calls = [{"id": c, "name": "f"} for c in calls]
    return {"id": _id(n), "role": "assistant", "content": "T", "tool_calls": tool_calls}


def _result(id_: str, call_id: str, text: str) -> dict[str, Any]:
    return {"id": id_, "role": "tool", "tool_call_id": call_id, "content": text}


def _pairs(store: Store) -> list[tuple[str, str]]:
    return [(m.id, str(m.content)) for m in store.buffer(*K).messages()]


def _lost_nothing(*replicas: Store) -> None:
    """Every replica holds the same history, clean."""
    first = _pairs(replicas[0])
    for store in replicas:
        assert store.check() == []
        assert _pairs(store) == first, store.path


def test_two_answers_of_one_turn_stand_as_every_later_merge_reads_them(tmp_path: Path) -> None:
    """Two results of one turn's calls stand after a user turn: the merge answers
    both in the turn's tool run (both linked first among the turn's children). It
    put each right after the turn as it made it, so the second ahead of the first,
    while the tree reads them by id: the next merge swapped them on every store
    (each one's order of what it shared changed). Now each stands where the tree
    puts it."""
    a = Store(str(tmp_path / "a.db"))
    a.buffer(*K).append({"id": _id(1), **user("start")})
    enable(a)
    for name in "bc":
        a.backup(str(tmp_path / f"{name}.db"))
    b, c = Store(str(tmp_path / "b.db")), Store(str(tmp_path / "c.db"))
    a.buffer(*K).append([{"id": _id(2), **said("s")}, _call(3, "c1", "c2")])
    b.buffer(*K).append(
        [
            {"id": _id(4), **user("u")},
            _result(_id(6), "c1", "r1"),
            _result(_id(7), "c2", "r2"),
        ]
    )
    sync(a, b)
    first = [text for _, text in _pairs(a)]
    assert first[first.index("T") + 1 : first.index("u")] in (["r1", "r2"], ["r2", "r1"])
    c.buffer(*K).append(user("w"))
    sync(c, a)
    sync(b, c)
    for store in (a, b, c):
        assert [t for _, t in _pairs(store)] == [*first, "w"], store.path
    _lost_nothing(a, b, c)


def test_the_answers_of_one_turn_follow_the_tree_whoever_made_them() -> None:
    """The rule itself: a row answering a call of a turn already answered in its run
    by a row with a higher id stands before it, one with a lower id after it (and
    after what descends from it)."""
    from flowdrop_local.rules.merge import answered_in_place_id

    def entry(id_: str, key: str, role: str, metadata: str) -> Entry:
        return Entry(id_, key, role, metadata, f"fp-{id_}", "2026-01-01T00:00:00.000Z")

    turn = entry("t", "a1", "assistant", '{"tool_calls": [{"id": "c1"}, {"id": "c2"}]}')
    user_turn = entry("u", "a3", "user", "{}")
    late = entry("r2", "a4", "tool", '{"tool_call_id": "c2"}')
    for other_id, expect_first in ((chr(0x30), True), ("~", False)):
        # a row a merge made before for c1 (its id below or above the new one's)
        other = entry(other_id, "a2", "tool", '{"tool_call_id": "c1"}')
        links = {"t": (ROOT, 0), other_id: ("t", MAX_RANK), "u": (other_id, 0), "r2": ("u", 0)}
        rows = [turn, other, user_turn, late]
        merged = merge(rows, rows, [e.id for e in rows], links=links)
        ids = [p.entry.id for p in merged.placed]
        new = answered_in_place_id("r2")
        assert merged.answered == ((new, "t"),)
        # the other row's descendant here is the user turn: the tree reads the new row
        # after the user turn when it ranks after the other row, and the merge says so
        expected = ["t", other_id, "u", new] if expect_first else ["t", new, other_id, "u"]
        assert ids == expected, (other_id, ids)
        assert tree_order(ids, {**links, new: ("t", MAX_RANK)}) == ids


@pytest.mark.parametrize("how", ["the user deletes it", "a merge drops it", "by a fill"])
def test_a_result_outlives_the_deletion_of_the_placeholder_it_replaced(
    tmp_path: Path, how: str
) -> None:
    """A real result replaces a placeholder (MEM-10) where the placeholder's
    deletion has not arrived: the user popped it on another store, or a merge there
    dropped it as the call's second result, or (``by a fill``) the result was
    appended there and took the placeholder's row, id and all. Before the fix the
    placeholder's tombstone reached the result and deleted it on every store, with
    no conflict recorded. A placeholder's tombstone now says it deleted a
    placeholder, and a real result outlives it."""
    from flowdrop_local.syncing import conflicts

    start = Store(str(tmp_path / "start.db"))
    start.buffer(*K).append([{"id": _id(1), **user("start")}, _call(2, "c1")])
    enable(start)
    start.backup(str(tmp_path / "late.db"))  # start, T: the result comes here
    start.backup(str(tmp_path / "other.db"))
    late, other = Store(str(tmp_path / "late.db")), Store(str(tmp_path / "other.db"))
    start.buffer(*K).append({"id": _id(3), **user("u")})  # heals: a placeholder after T
    start.backup(str(tmp_path / "deleter.db"))
    deleter = Store(str(tmp_path / "deleter.db"))
    if how == "the user deletes it":
        deleter.buffer(*K).pop()  # u
        deleter.buffer(*K).pop()  # the placeholder
    elif how == "a merge drops it":
        other.buffer(*K).append(_result(_id(4), "c1", "first result"))
        sync(other, deleter)  # the first result stands before the placeholder: it goes
    late_result = "" if how == "by a fill" else "result"
    if how == "by a fill":
        start.buffer(*K).append(_result(LATE.format(5), "c1", "result"))  # fills it in place
        deleter.buffer(*K).pop()  # u
        deleter.buffer(*K).pop()  # the placeholder
    else:
        late.buffer(*K).append(_result(LATE.format(5), "c1", late_result))
        sync(late, start)  # start: the placeholder goes, the result answers c1
    replicas = (start, deleter, late, other)
    for x, y in ((start, deleter), (start, late), (start, other), (deleter, late)):
        sync(x, y)
    _lost_nothing(*replicas)
    texts = [t for _, t in _pairs(start)]
    recorded = {c["message"]["content"] for s in replicas for c in conflicts(s)}
    assert "result" in texts or "result" in recorded, (texts, recorded)
    if how != "a merge drops it":
        assert "result" in texts


@pytest.mark.parametrize("placed", ["replacing a placeholder", "after a user turn"])
def test_a_deleted_result_stays_deleted_wherever_a_merge_placed_its_content(
    tmp_path: Path, placed: str
) -> None:
    """A merge that did not know the result was deleted elsewhere answers its call in
    the tool run with a row holding its content (replacing the placeholder, or
    because the result stood after a user turn). Before the fix the deletion named
    the result's own id only and the content came back on every store, the
    deleter's too. A message's tombstone now reaches the rows holding its content."""
    a = Store(str(tmp_path / "a.db"))
    a.buffer(*K).append({"id": _id(1), **user("start")})
    if placed == "replacing a placeholder":
        a.buffer(*K).append(_call(2, "c1"))
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    if placed == "replacing a placeholder":
        a.buffer(*K).append({"id": _id(3), **user("u")})  # heals c1 on a
        b.buffer(*K).append(_result(LATE.format(4), "c1", "r"))
    else:
        a.buffer(*K).append(_call(2, "c1"))
        b.buffer(*K).append([{"id": _id(3), **user("u")}, _result(_id(4), "c1", "r")])
    b.backup(str(tmp_path / "c.db"))
    c = Store(str(tmp_path / "c.db"))
    c.buffer(*K).pop()  # c deletes r
    sync(b, a)  # r's content goes into c1's tool run, in a row of its own
    assert "r" in [t for _, t in _pairs(a)]
    sync(c, a)
    sync(c, b)
    sync(a, b)
    _lost_nothing(a, b, c)
    assert "r" not in [t for _, t in _pairs(a)]


def test_deleting_a_result_that_replaced_a_placeholder_is_a_message_deletion(
    tmp_path: Path,
) -> None:
    """c pops a placeholder; a real result fills it on a (same id). The sync keeps
    the result (a placeholder's tombstone), so c holds the row and a tombstone of
    the placeholder. Then c's user deletes the result: the deletion must be a
    message's, numbered again, or a kept it and sent it back."""
    a, c = stores(tmp_path, 2)
    a.buffer(*K).append([_call(2, "c1"), user("u")])
    sync(a, c)
    c.buffer(*K).pop()  # u
    c.buffer(*K).pop()  # the placeholder
    a.buffer(*K).append(_result(LATE.format(5), "c1", "result"))  # fills it in place
    sync(a, c)
    assert order(c) == ["q", "T", "result"]
    c.buffer(*K).pop()  # the result: a message deleted
    sync(c, a)
    sync(a, c)
    assert order(a) == order(c) == ["q", "T"]
    _lost_nothing(a, c)


def _kinds(path: str) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return sorted(r[0] for r in conn.execute("SELECT kind FROM flowdrop_sync_tombstones"))
    finally:
        conn.close()


def test_a_store_at_step_3_deletes_then_takes_step_4(tmp_path: Path) -> None:
    """A store synced before tombstones had kinds: its deletions are recorded (by
    triggers without a kind) until its next sync takes step 4; those count as a
    message's; after it, a placeholder's deletion says so."""
    from flowdrop_local.sync.schema import DELETED_MESSAGE, DELETED_PLACEHOLDER

    a, b = stores(tmp_path, 2)
    a.buffer(*K).append([_call(2, "c1"), user("u"), said("gone")])
    sync(a, b)
    for store in (a, b):
        store.close()
        _tamper(store.path, "ALTER TABLE flowdrop_sync_tombstones DROP COLUMN kind")
        _tamper(store.path, "UPDATE flowdrop_sync_schema SET step = 3")
    a, b = Store(a.path), Store(b.path)
    a.buffer(*K).pop()  # "gone", before step 4
    sync(a, b)
    assert order(b) == order(a) == ["q", "T", "Tool call was interrupted; no result.", "u"]
    assert _kinds(a.path) == [DELETED_MESSAGE]
    a.buffer(*K).pop()  # u
    a.buffer(*K).pop()  # the placeholder
    assert _kinds(a.path) == [DELETED_MESSAGE, DELETED_MESSAGE, DELETED_PLACEHOLDER]
    sync(a, b)
    assert order(b) == ["q", "T"]
    assert _kinds(b.path) == _kinds(a.path)


@pytest.mark.parametrize("kind", [7, -1, "message"])
def test_a_peers_tombstone_of_an_unknown_kind_is_refused(tmp_path: Path, kind: object) -> None:
    a, b = stores(tmp_path, 2)
    a.buffer(*K).append(said("x"))
    sync(a, b)
    b.buffer(*K).pop()
    b.close()
    _tamper(b.path, "UPDATE flowdrop_sync_tombstones SET kind = ?", kind)
    b = Store(b.path)
    before = (snapshot(a.path), snapshot(b.path))
    with pytest.raises(SyncRefused, match="tombstone"):
        sync(a, b)
    assert (snapshot(a.path), snapshot(b.path)) == before


def test_postgresql_records_a_placeholders_deletion_as_one(
    tmp_path: Path, postgresql_url: str
) -> None:
    """PostgreSQL's triggers (step 4) say what a deletion was, as SQLite's do; and a
    result that replaced the placeholder elsewhere outlives its deletion there."""
    from flowdrop_local.sync.schema import DELETED_MESSAGE, DELETED_PLACEHOLDER

    server = Store(postgresql_url)
    server.buffer(*K).append([user("q"), _call(2, "c1"), user("u")])
    laptop = Store(str(tmp_path / "laptop.db"))
    sync(server, laptop)
    server.buffer(*K).pop()  # u
    server.buffer(*K).pop()  # the placeholder
    with server.backend.read() as tx:
        kinds = sorted(int(r[6]) for r in tx.all("sync_tombstones_after", (0,)))
    assert kinds == [DELETED_MESSAGE, DELETED_PLACEHOLDER]
    laptop.buffer(*K).append(_result(LATE.format(5), "c1", "result"))  # fills it
    sync(laptop, server)
    assert order(server) == order(laptop) == ["q", "T", "result"]
    assert server.check() == [] and laptop.check() == []
    server.close()

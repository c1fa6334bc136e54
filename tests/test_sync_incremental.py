"""Incremental sync (issue 14): a sync reads only buffers written since the pair last
synced, and of those only the ones whose summary changed; it must still miss nothing.

The property tests run rounds of random operations (appends, late results, pops,
clears, windows, message removals, buffer deletes, re-imports) and syncs in random
pair orders, and after each incremental sync check that a ``full=True`` sync (which
reads every message) finds nothing left to move. One of them pairs SQLite with a real
PostgreSQL server.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import Store, sync
from flowdrop_local.engine import remove_message
from flowdrop_local.plans import run_plan
from flowdrop_local.positions import keys_between
from flowdrop_local.syncing import enable

from .test_sync import KEYS, apply, call, converged, result, rows, said, user

extra = st.one_of(
    st.tuples(st.just("remove"), st.integers(0, 50)),
    st.tuples(st.just("delete"), st.just("")),
    st.tuples(st.just("reimport"), st.just("")),
)
operation = st.one_of(
    st.tuples(st.just("user"), st.sampled_from(["hi", "again", "?"])),
    st.tuples(st.just("said"), st.sampled_from(["ok", "sure"])),
    st.tuples(st.just("call"), st.sampled_from([f"c{i}" for i in range(4)])),
    st.tuples(st.just("result"), st.sampled_from([f"c{i}" for i in range(4)])),
    st.tuples(st.just("pop"), st.just("")),
    st.tuples(st.just("clear"), st.just("")),
    st.tuples(st.just("window"), st.sampled_from(["w1", "w2"])),
    extra,
)
program = st.lists(st.tuples(st.sampled_from(KEYS), operation), max_size=8)


def act(store: Store, ops: list[Any], tag: str) -> None:
    """test_sync.apply, plus removals of one message, buffer deletes and re-imports."""
    for address, (kind, arg) in ops:
        buf = store.buffer(*address)
        if kind == "remove":
            held = buf.messages()
            if held:
                with store.backend.write() as tx:
                    run_plan(remove_message(held[arg % len(held)].id), tx)
        elif kind == "delete":
            buf.delete()
        elif kind == "reimport":
            records = list(store.export(address))
            if len(records) > 1:  # the same messages again, in one transaction
                store.import_records(records, replace=True)
        else:
            apply(store, [(address, (kind, arg))], tag)


def in_sync(x: Store, y: Store) -> None:
    """x and y read the same, and a sync that reads everything finds nothing to move."""
    converged(x, y)
    assert sync(x, y, full=True).moved == 0


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    common=program,
    rounds=st.lists(
        st.tuples(
            st.sampled_from([(0, 1), (1, 2), (0, 2), (1, 0), (2, 1), (2, 0)]), program, program
        ),
        min_size=2,
        max_size=5,
    ),
    seed=st.integers(0, 2**16),
)
def test_incremental_syncs_miss_nothing(
    tmp_path_factory: pytest.TempPathFactory, common: Any, rounds: Any, seed: int
) -> None:
    """Three replicas; each round two of them change and sync incrementally; after
    every sync a full sync moves nothing, and at the end all three converge."""
    random.seed(seed)
    folder = tmp_path_factory.mktemp("rounds")
    first = Store(str(folder / "0.db"))
    act(first, common, "base")
    enable(first)
    stores = [first]
    for i in (1, 2):
        first.backup(str(folder / f"{i}.db"))
        stores.append(Store(str(folder / f"{i}.db")))
    for n, ((x, y), ops_x, ops_y) in enumerate(rounds):
        act(stores[x], ops_x, f"{x}.{n}")
        act(stores[y], ops_y, f"{y}.{n}")
        sync(stores[x], stores[y])
        in_sync(stores[x], stores[y])
        assert sync(stores[x], stores[y]).buffers_read == 0
    for x, y in [(0, 1), (1, 2), (0, 1)]:
        sync(stores[x], stores[y])
    converged(*stores)
    for store in stores:
        store.close()


@contextlib.contextmanager
def fresh_postgresql(server: str) -> Iterator[str]:
    """A URL of an empty schema of its own on the suite's server (dropped afterwards)."""
    import psycopg

    schema = f"inc_{random.getrandbits(48):x}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in server else "?"
    try:
        yield f"{server}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    common=program,
    rounds=st.lists(st.tuples(program, program), min_size=2, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_sqlite_and_postgresql_converge_round_after_round(
    tmp_path_factory: pytest.TempPathFactory,
    postgresql_server: str,
    common: Any,
    rounds: Any,
    seed: int,
) -> None:
    """A SQLite file and a PostgreSQL store (made by the first sync), changed apart
    and synced round after round: equal and sound after each, nothing missed."""
    random.seed(seed)
    folder = tmp_path_factory.mktemp("pg")
    with fresh_postgresql(postgresql_server) as url:
        a, b = Store(str(folder / "a.db")), Store(url)
        try:
            act(a, common, "base")
            sync(a, b)
            in_sync(a, b)
            for n, (ops_a, ops_b) in enumerate(rounds):
                act(a, ops_a, f"a{n}")
                act(b, ops_b, f"b{n}")
                sync(a, b)
                in_sync(a, b)
        finally:
            a.close()
            b.close()


# ------------------------------------------------------------- what a sync reads


def aged(store: Store) -> None:
    """Every buffer last written long ago, an hour apart (as on a store used for
    months): the last one written holds the store's newest stamp."""
    with store.backend.write() as tx:
        tx.conn.execute(
            "UPDATE buffers SET updated_at = "
            "strftime('%Y-%m-%dT%H:%M:%fZ', '2026-01-01', '+' || id || ' hours')"
        )


def test_a_sync_reads_only_what_changed(tmp_path: Path) -> None:
    """40 buffers of 30 messages. A sync reads only what was appended since the two
    last held the same (from the last user turn before it), not the buffers whole,
    and the sync after that reads nothing."""
    a = Store(str(tmp_path / "a.db"))
    for n in range(40):
        a.buffer("global", "", f"b{n}").append(
            [user(f"q{i}") if i % 2 == 0 else said(f"a{i}") for i in range(30)]
        )
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    aged(a)  # behind the library: every summary changed, no row did
    aged(b)
    first = sync(a, b)
    # Each side reads its last two rows per buffer (the last user turn, the reply).
    assert (first.buffers_compared, first.buffers_read, first.rows_read) == (40, 0, 160)
    assert (first.buffers_merged, first.moved) == (0, 0)
    a.buffer("global", "", "b7").append(user("from a"))
    b.buffer("global", "", "b30").append(user("from b"))
    second = sync(a, b)
    # The two written since, and the one holding the newest stamp at the last sync
    # (the pair's mark): its summary is the recorded one, so it is not read.
    assert (second.buffers_compared, second.buffers_read, second.buffers_merged) == (3, 0, 2)
    # Per buffer: the last user turn and its reply on both sides, the new turn on
    # one, then the first side's merged rows read back: 3 + 2 + 3.
    assert second.rows_read == 2 * (3 + 2 + 3)
    assert (second.sent_a_to_b, second.sent_b_to_a) == (1, 1)
    third = sync(a, b)
    # The two merged buffers were written by the sync, so they are looked at again,
    # but their summaries are the ones it recorded: nothing is read.
    assert (third.buffers_compared, third.rows_read, third.moved) == (2, 0, 0)
    converged(a, b)
    assert sync(a, b, full=True).moved == 0


def _remove_result(store: Store) -> None:
    (found,) = [m for m in store.buffer(*KEYS[0]).messages() if m.content == "real"]
    with store.backend.write() as tx:
        run_plan(remove_message(found.id), tx)


def _late_result(store: Store) -> None:
    store.buffer(*KEYS[0]).append(result("c2", "late"))


def _reimport_edited(store: Store) -> None:
    records = list(store.export(KEYS[0]))
    for record in records:
        if record.get("content") == "first":
            record["content"] = "first, edited"
    store.import_records(records, replace=True)


# Changes that keep a buffer's count and last row: only a strictly later updated_at
# tells the next sync that the buffer changed (done right after the last sync, in
# the same millisecond as likely as not).
SAME_SHAPE = [
    pytest.param(_remove_result, "real", None, id="a removed result, healed again"),
    pytest.param(_late_result, None, "late", id="a late result replaces its placeholder"),
    pytest.param(_reimport_edited, "first", "first, edited", id="a re-import, edited"),
]


@pytest.mark.parametrize(("change", "gone", "arrived"), SAME_SHAPE)
def test_a_change_that_keeps_count_and_tail_is_seen(
    tmp_path: Path, change: Any, gone: str | None, arrived: str | None
) -> None:
    a = Store(str(tmp_path / "a.db"))
    a.buffer(*KEYS[0]).append(
        [user("first"), call("c1"), result("c1", "real"), call("c2"), user("next")]
    )
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    for _ in range(5):  # each time: sync, then change at once
        sync(a, b)
        before = a.buffer(*KEYS[0]).count()
        change(a)
        if change is not _reimport_edited:
            assert a.buffer(*KEYS[0]).count() == before
        report = sync(a, b)
        assert report.moved > 0
        in_sync(a, b)
        contents = [m.content for m in b.buffer(*KEYS[0]).messages()]
        if gone is not None:
            assert gone not in contents
        if arrived is not None:
            assert arrived in contents
        if change is not _remove_result:
            break
        a.buffer(*KEYS[0]).append(result("c1", "real"))  # answer it again for the next loop
        sync(a, b)


def test_a_deleted_buffer_is_found_without_reading_the_others(tmp_path: Path) -> None:
    a = Store(str(tmp_path / "a.db"))
    for n in range(10):
        a.buffer("global", "", f"b{n}").append([user("q"), said("a")])
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    aged(a)
    aged(b)
    sync(a, b)
    b.buffer("global", "", "b3").delete()
    report = sync(a, b)
    # The deleted one and the one holding the newest stamp at the last sync (b9).
    assert (report.buffers_compared, report.deleted_on_a) == (2, 2)
    assert ("global", "", "b3") not in rows(a)
    in_sync(a, b)


def test_full_reads_a_change_made_behind_the_library(tmp_path: Path) -> None:
    """Plain SQL that adds a message without touching buffers.updated_at is missed by
    an incremental sync (the documented limit); ``full=True`` finds it."""
    a = Store(str(tmp_path / "a.db"))
    a.buffer(*KEYS[0]).append([user("q"), said("a")])
    a.buffer(*KEYS[1]).append([user("q"), said("a")])  # written last: the newest stamp
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    aged(a)
    aged(b)
    sync(a, b)
    (key,) = keys_between(a.buffer(*KEYS[0]).messages()[-1].position, None, 1)
    with a.backend.write() as tx:  # the last row's tally keeps the count right
        tx.conn.execute(
            "INSERT INTO messages (buffer_id, position, id, role, content, tally) "
            "SELECT buffer_id, ?, randomblob(16), 'assistant', 'behind', 3 FROM messages "
            "LIMIT 1",
            (key,),
        )
    assert sync(a, b).moved == 0
    assert sync(a, b, full=True).sent_a_to_b == 1
    in_sync(a, b)
    assert [m.content for m in b.buffer(*KEYS[0]).messages()][-1] == "behind"


def _wal_frames(path: Path) -> int:
    wal = Path(f"{path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return 0 if size == 0 else (size - 32) // (4096 + 24)


def test_tracking_changes_costs_a_plain_append_no_page(tmp_path: Path) -> None:
    """Sync keeps no change log: on a store that syncs, a plain append writes the
    pages it writes on a store that never synced (the row and the id index; counted
    as WAL frames), and nothing of sync's tables."""
    written = {}
    for name in ("never.db", "synced.db"):
        path = tmp_path / name
        with Store(str(path)) as store:
            assert store.backend.connection().execute("PRAGMA page_size").fetchone() == (4096,)
            buf = store.buffer(*KEYS[0])
            buf.append([user(f"q{i}") for i in range(200)])
            if name == "synced.db":
                enable(store)
                store.backup(str(tmp_path / "peer.db"))
                with Store(str(tmp_path / "peer.db")) as peer:
                    sync(store, peer)
            buf.append(user("warm"))  # the coarse updated_at was written just now
            frames = []
            for i in range(5):
                before = _wal_frames(path)
                buf.append(user(f"plain {i}"))
                frames.append(_wal_frames(path) - before)
            written[name] = frames
    assert written["synced.db"] == written["never.db"], written
    assert written["never.db"] == [2] * 5, written  # the clustered row and the id index


def _age_memory(store: Store) -> None:
    with store.backend.write() as tx:
        tx.conn.execute("UPDATE memory SET updated_at = '2026-01-01T00:00:00.000Z'")


def test_memory_is_read_only_when_a_side_changed_it(tmp_path: Path) -> None:
    """Memory values and grants unchanged on both sides since the pair's last sync are
    not read (``kv_skipped``, both kinds); a value set, a value deleted, or a value
    another replica brought in makes the next sync read that kind, and it moves."""
    a = Store(str(tmp_path / "a.db"))
    for key in ("k1", "k2"):
        a.memory_set(None, "global", key, {"v": key})
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    a.backup(str(tmp_path / "c.db"))
    b, c = Store(str(tmp_path / "b.db")), Store(str(tmp_path / "c.db"))
    for store in (a, b, c):
        _age_memory(store)  # written long before the syncs below
    assert sync(a, b).kv_skipped == 0  # no mark yet: read
    assert sync(a, b).kv_skipped == 2
    a.memory_set(None, "global", "k3", 3)  # set here
    report = sync(a, b)
    assert (report.kv_skipped, report.memory_a_to_b) == (1, 1)
    assert b.memory_get(None, "global", "k3").value == 3
    b.memory_delete(None, "global", "k1")  # deleted there (the count tells)
    _age_memory(a)
    _age_memory(b)
    report = sync(a, b)
    assert (report.kv_skipped, report.memory_deleted_on_a) == (1, 1)
    assert a.memory_get(None, "global", "k1").found is False
    _age_memory(a)
    _age_memory(b)
    sync(a, b)
    c.memory_set(None, "global", "k2", "from c")
    with c.backend.write() as tx:  # set long ago, a day after the others: it wins
        tx.conn.execute("UPDATE memory SET updated_at = '2026-01-02T00:00:00.000Z'")
    sync(c, a)  # reaches a with its old stamp: same count, no recent write on a
    report = sync(a, b)  # but a's memory was last written by another sync
    assert (report.kv_skipped, report.memory_a_to_b) == (0, 1)
    assert b.memory_get(None, "global", "k2").value == "from c"

"""Sync v2 (issue 20): each promise a user's walk or the adversarial campaign broke.

One section per item of the issue; each test failed before its fix.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import Store, sync
from flowdrop_local.cli import cli
from flowdrop_local.sync.schema import schema_steps
from flowdrop_local.syncing import enable


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def pair(tmp_path: Path) -> tuple[Store, Store]:
    a = Store(str(tmp_path / "a.db"))
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    return a, Store(str(tmp_path / "b.db"))


def contents(store: Store) -> dict[tuple[str, str, str], list[tuple[str, Any]]]:
    return {
        (r.scope, r.scope_id, r.key): [
            (m.role, m.content) for m in store.buffer(r.scope, r.scope_id, r.key).messages()
        ]
        for r in store.buffers()
    }


# ------------------------------------------------- 1. an application's own scopes


def test_all_means_every_buffer_including_an_applications_scopes(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.buffer("chat", "ana", "k").append(user("from a"))
    b.buffer("notes", "", "k").append(user("from b"))
    report = sync(a, b, scopes="all")
    assert report.sent_a_to_b == 1 and report.sent_b_to_a == 1
    assert (
        contents(a)
        == contents(b)
        == {
            ("chat", "ana", "k"): [("user", "from a")],
            ("notes", "", "k"): [("user", "from b")],
        }
    )
    assert report.left_out == 0


def test_the_default_covers_every_scope_but_the_identity_ones(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.buffer("chat", "ana", "k").append(user("an app's scope"))
    a.buffer("user", "42", "k").append(user("an identity's"))
    report = sync(a, b)
    assert list(contents(b)) == [("chat", "ana", "k")]
    assert (report.buffers_left_out_a, report.buffers_left_out_b) == (1, 0)


@pytest.mark.parametrize(
    ("scope", "moved"),
    [
        ("chat", {("chat", "ana", "k"), ("chat", "bo", "k")}),
        ("chat:ana", {("chat", "ana", "k")}),
        (("chat", "ana"), {("chat", "ana", "k")}),
    ],
)
def test_an_applications_scope_can_be_named(
    tmp_path: Path, scope: object, moved: set[tuple[str, str, str]]
) -> None:
    a, b = pair(tmp_path)
    for owner in ("ana", "bo"):
        a.buffer("chat", owner, "k").append(user(f"{owner}'s"))
    a.buffer("global", "", "k").append(user("global"))
    report = sync(a, b, scopes=[scope])
    assert set(contents(b)) == moved
    assert report.buffers_left_out_a == 3 - len(moved)


def test_the_cli_says_what_its_scopes_left_out(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.buffer("user", "42", "k").append(user("private"))
    a.close()
    b.close()
    runner = CliRunner()
    out = runner.invoke(cli, ["sync", str(tmp_path / "a.db"), str(tmp_path / "b.db")])
    assert out.exit_code == 0, out.output
    assert "left out by the scopes: 1 buffer(s)" in out.output
    out = runner.invoke(
        cli, ["sync", str(tmp_path / "a.db"), str(tmp_path / "b.db"), "--scope", "all", "--full"]
    )
    assert out.exit_code == 0, out.output
    assert "left out" not in out.output
    out = runner.invoke(
        cli, ["sync", str(tmp_path / "a.db"), str(tmp_path / "b.db"), "--scope", "chat", "--json"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["left_out"] == 2  # user 42's buffer, on both sides now


# ------------------------------ 2. conversations: titles, metadata and deletes travel


def _named(store: Store) -> dict[tuple[str, str, str], tuple[str, dict[str, Any]]]:
    page = store.conversations(limit=100)
    return {(c.scope, c.scope_id, c.key): (c.title, c.metadata) for c in page.items}


def test_a_conversation_sync_creates_keeps_its_title_and_metadata(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    chat = a.buffer("global", "", "k")
    chat.append(user("hello"))
    chat.set_title("Trip to Lisbon")
    chat.update_metadata({"pinned": True})
    empty = a.buffer("global", "", "empty")
    empty.set_title("Named, no messages yet")
    report = sync(a, b)
    assert (
        _named(b)
        == _named(a)
        == {
            ("global", "", "k"): ("Trip to Lisbon", {"pinned": True}),
            ("global", "", "empty"): ("Named, no messages yet", {}),
        }
    )
    assert report.conversations_named_on_b == 2
    assert sync(a, b).moved == 0


def test_the_last_rename_wins_on_both_sides(tmp_path: Path) -> None:
    import time

    a, b = pair(tmp_path)
    a.buffer("global", "", "k").append(user("q"))
    sync(a, b)
    a.buffer("global", "", "k").set_title("first, on a")
    time.sleep(0.01)
    b.buffer("global", "", "k").set_title("later, on b")
    sync(a, b)
    assert _named(a) == _named(b) == {("global", "", "k"): ("later, on b", {})}


def test_a_title_set_before_enable_travels(tmp_path: Path) -> None:
    a = Store(str(tmp_path / "a.db"))
    a.buffer("global", "", "k").append(user("q"))
    a.buffer("global", "", "k").set_title("old title")
    b = Store(str(tmp_path / "b.db"))
    sync(a, b)
    assert _named(b) == {("global", "", "k"): ("old title", {})}


def test_a_deleted_conversation_is_deleted_on_the_other_side_and_stays_deleted(
    tmp_path: Path,
) -> None:
    """It used to stay on the other store and come back, empty and untitled, on the
    store that deleted it, at the top of conversations()."""
    a, b = pair(tmp_path)
    a.buffer("global", "", "k").append([user("q"), user("r")])
    a.buffer("global", "", "k").set_title("to delete")
    a.buffer("global", "", "other").append(user("stays"))
    sync(a, b)
    a.buffer("global", "", "k").delete()
    report = sync(a, b)
    assert report.conversations_deleted_on_b == 1
    for _ in range(2):
        sync(a, b)
        for store in (a, b):
            assert list(_named(store)) == [("global", "", "other")], store.path
            assert store.check() == []


def test_a_conversation_written_to_after_its_deletion_elsewhere_survives(tmp_path: Path) -> None:
    import time

    a, b = pair(tmp_path)
    a.buffer("global", "", "k").append([user("old one"), user("old two")])
    sync(a, b)
    a.buffer("global", "", "k").delete()
    time.sleep(0.01)
    b.buffer("global", "", "k").clear()  # b goes on with the conversation: written later
    b.buffer("global", "", "k").append(user("new, on b"))
    sync(a, b)
    sync(a, b)
    for store in (a, b):
        assert contents(store).get(("global", "", "k")) == [("user", "new, on b")], store.path


def test_copy_and_a_full_export_carry_titles_and_metadata(tmp_path: Path) -> None:
    a = Store(str(tmp_path / "a.db"))
    a.buffer("global", "", "k").append(user("q"))
    a.buffer("global", "", "k").set_title("named")
    a.buffer("user", "7", "notes").update_metadata({"color": "blue"})
    records = list(a.export(full=True))
    assert {
        (r["scope"], r["key"], r["title"]) for r in records if r.get("record") == "conversation"
    } == {("global", "k", "named"), ("user", "notes", "")}
    a.close()
    out = CliRunner().invoke(cli, ["copy", str(tmp_path / "a.db"), str(tmp_path / "c.db")])
    assert out.exit_code == 0, out.output
    c = Store(str(tmp_path / "c.db"))
    assert _named(c) == {
        ("global", "", "k"): ("named", {}),
        ("user", "7", "notes"): ("", {"color": "blue"}),
    }
    renamed = [
        {
            "record": "conversation",
            "scope": "global",
            "scope_id": "",
            "key": "k",
            "title": "other",
            "metadata": {},
        }
    ]
    with pytest.raises(Exception, match="another title"):
        c.import_records(renamed)
    c.import_records(renamed, replace=True)
    assert _named(c)[("global", "", "k")] == ("other", {})


# ------------------------------------- 3. deletions are recorded when they happen

ADDRESS = ("global", "", "k")


def _pop(store: Store, late: str) -> None:
    store.buffer(*ADDRESS).pop()


def _remove(store: Store, late: str) -> None:
    from flowdrop_local import engine
    from flowdrop_local.plans import run_plan

    with store.backend.write() as tx:
        assert run_plan(engine.remove_message(late), tx)


def _window(store: Store, late: str) -> None:
    """A window of one evicts the oldest (late among them)."""
    store.buffer(*ADDRESS, window=1).append(user("evicts it"))


def _clear(store: Store, late: str) -> None:
    store.buffer(*ADDRESS).clear()


def _delete_buffer(store: Store, late: str) -> None:
    store.buffer(*ADDRESS).delete()


def _import_replace(store: Store, late: str) -> None:
    kept = [r for r in store.export() if r["id"] != late]
    store.import_records(kept, replace=True)


DELETE_PATHS = [_pop, _remove, _window, _clear, _delete_buffer, _import_replace]


@pytest.mark.parametrize("delete", DELETE_PATHS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("where", ["original", "copy"])
def test_a_message_written_after_the_last_sync_and_backed_up_can_be_deleted(
    tmp_path: Path, delete: Any, where: str
) -> None:
    """Written after enable, copied with backup, deleted on one copy by any path:
    the next sync deletes it on the other too (it used to restore it on both, as the
    deletion was inferred from what the buffer held at the last sync)."""
    a = Store(str(tmp_path / "a.db"))
    a.buffer(*ADDRESS).append(user("written before enable"))
    enable(a)
    late = a.buffer(*ADDRESS).append(user("written after enable")).message_ids[0]
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    delete(a if where == "original" else b, late)
    sync(a, b, "all")
    sync(a, b, "all")
    for store in (a, b):
        held = [m.id for m in store.buffer(*ADDRESS).messages()]
        assert late not in held, store.path
        assert store.check() == []


def test_a_deletion_is_recorded_in_the_deleting_transaction(tmp_path: Path) -> None:
    """A pop on a store that syncs writes its tombstone with it (no sync needed), and
    a store that never synced has no sync tables at all."""
    import sqlite3

    a = Store(str(tmp_path / "a.db"))
    a.buffer(*ADDRESS).append([user("q"), user("gone")])
    enable(a)
    gone = a.buffer(*ADDRESS).messages()[-1].id
    a.buffer(*ADDRESS).pop()
    conn = sqlite3.connect(a.path)
    assert conn.execute("SELECT id FROM flowdrop_sync_tombstones").fetchall() == [(gone,)]
    plain = Store(str(tmp_path / "plain.db"))
    plain.buffer(*ADDRESS).append([user("q"), user("r")])
    plain.buffer(*ADDRESS).pop()
    conn = sqlite3.connect(plain.path)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert not any(name.startswith("flowdrop_sync") for name in names)


def test_postgresql_records_deletions_when_they_happen(tmp_path: Path, postgresql_url: str) -> None:
    """The same on PostgreSQL (persistent triggers), through a sync with SQLite."""
    server = Store(postgresql_url)
    enable(server)
    late = server.buffer(*ADDRESS).append(user("on the server")).message_ids[0]
    laptop = Store(str(tmp_path / "laptop.db"))
    sync(server, laptop, "all")
    server.buffer(*ADDRESS).append(user("after the sync"))
    server.buffer(*ADDRESS).pop()  # "after the sync"
    _remove(server, late)
    assert server.check() == []
    sync(server, laptop, "all")
    assert contents(laptop).get(ADDRESS, []) == []
    server.close()


# -------------------------------- 3. a sync killed between its commits brings nothing back

KILL_AT_SECOND_COMMIT = """
import os, signal, sys
from flowdrop_local import Store, sync
first, last = Store(sys.argv[1]), Store(sys.argv[2])
# The sync commits the last-locked side first. "between": killed at the first-locked
# side's COMMIT (the other side committed); "before": at the last-locked side's
# (neither did); "after": once both committed.
where = sys.argv[3] if len(sys.argv) > 3 else "between"
def trace(sql):
    if sql.strip().upper() == "COMMIT":
        os.kill(os.getpid(), signal.SIGKILL)
watched = {"between": first, "before": last}.get(where)
if watched is not None:
    watched.backend.connection().set_trace_callback(trace)
sync(first, last, "all")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(
    "kills",
    [
        ("between", "between"),
        ("before", "between", "between"),
        ("between", "before", "after", "between"),
    ],
    ids="-".join,
)
def test_syncs_killed_at_each_commit_boundary_never_resurrect_a_deletion(
    tmp_path: Path, kills: tuple[str, ...]
) -> None:
    """Syncs killed with SIGKILL before, between and after their two commits, several
    in a row, then a normal one: the popped message stays deleted on both."""
    _killed_syncs(tmp_path, kills)


def test_syncs_killed_between_their_commits_never_resurrect_a_deletion(tmp_path: Path) -> None:
    """Two syncs of everything that each die between their two commits, then a normal
    one: the message the committing side popped stays deleted on both (it used to
    record the other side's receipt before that side committed, then compact)."""
    _killed_syncs(tmp_path, ("between", "between"))


def _killed_syncs(tmp_path: Path, kills: tuple[str, ...]) -> None:
    import os
    import signal
    import subprocess
    import sys

    from flowdrop_local.syncing import replica_id

    a, b = pair(tmp_path)
    address = ("global", "", "k")
    a.buffer(*address).append([user("q"), {"role": "assistant", "content": "doomed"}])
    sync(a, b, "all")
    # sync locks in replica-id order and commits the last-locked side first
    first, last = sorted([a, b], key=lambda s: str(replica_id(s)))
    last.buffer(*address).pop()
    paths = (first.path, last.path)
    first.close()
    last.close()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for where in kills:
        done = subprocess.run(
            [sys.executable, "-c", KILL_AT_SECOND_COMMIT, *paths, where], env=env, timeout=120
        )
        assert done.returncode == -signal.SIGKILL
    first, last = Store(paths[0]), Store(paths[1])
    if "after" not in kills:
        assert contents(first)[address][-1] == ("assistant", "doomed")  # rolled back
    sync(first, last, "all")
    sync(first, last, "all")
    for store in (first, last):
        assert contents(store)[address] == [("user", "q")], store.path
        assert store.check() == []


# ------------------------------------------------------------ 8. a peer is untrusted input


def _tamper(path: str, sql: str, *params: object) -> None:
    """Change a store's file behind the library, as a hostile peer's owner could."""
    import sqlite3

    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql, params)
    conn.close()


def _rekey_last(path: str, position: str) -> None:
    """Give a buffer's last message another position key (deleted and put back)."""
    import sqlite3

    conn = sqlite3.connect(path)
    cols = "buffer_id, position, id, role, content, content_parts, metadata, created_at, tally"
    with conn:
        row = conn.execute(f"SELECT {cols} FROM messages ORDER BY position DESC LIMIT 1").fetchone()
        conn.execute("DELETE FROM messages WHERE id = ?", (row[2],))
        conn.execute(
            f"INSERT INTO messages ({cols}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row[0], position, *row[2:]),
        )
    conn.close()


def _everything(store: Store) -> object:
    from .conftest import snapshot

    return snapshot(store.path)


@pytest.mark.parametrize(
    ("position", "problem"),
    [
        ("b0", "malformed position key"),
        ("zz", "malformed position key"),
        ("a1" + "V" * 4000, "position key of 4,002 characters"),
    ],
)
def test_a_peers_bad_position_key_is_refused(tmp_path: Path, position: str, problem: str) -> None:
    from flowdrop_local import SyncRefused

    a, b = pair(tmp_path)
    b.buffer("global", "", "k").append(user("from b"))
    b.close()
    _rekey_last(b.path, position)
    b = Store(b.path)
    before = (_everything(a), _everything(b))
    with pytest.raises(SyncRefused, match=problem):
        sync(a, b)
    assert (_everything(a), _everything(b)) == before
    a.buffer("global", "", "k2").append(user("a still appends"))


def test_a_forged_healed_mark_on_a_real_result_is_refused(tmp_path: Path) -> None:
    from flowdrop_local import SyncRefused

    a, b = pair(tmp_path)
    b.buffer("global", "", "k").append(
        [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "the real result"},
        ]
    )
    b.close()
    _tamper(
        b.path,
        "UPDATE messages SET metadata = json_set(metadata, '$.healed', json('true')) "
        "WHERE role = 'tool'",
    )
    b = Store(b.path)
    before = (_everything(a), _everything(b))
    with pytest.raises(SyncRefused, match="marked healed but is no placeholder"):
        sync(a, b)
    assert (_everything(a), _everything(b)) == before
    assert a.check() == []


def test_a_tombstone_deletes_only_what_the_receiver_holds_in_the_synced_scopes(
    tmp_path: Path,
) -> None:
    """A peer that syncs only the default scopes names a user's message id in a global
    tombstone. The receiver judges the tombstone by its own row (a user buffer) and
    neither deletes the message nor keeps the tombstone, so a later sync of
    everything with a third copy deletes it nowhere."""
    a, evil = pair(tmp_path)
    a.backup(str(tmp_path / "c.db"))
    c = Store(str(tmp_path / "c.db"))
    private = a.buffer("user", "42", "notes").append(user("mine")).message_ids[0]
    sync(a, c, "all")
    evil.close()
    _tamper(
        evil.path,
        "INSERT INTO flowdrop_sync_tombstones (id, scope, scope_id, key, seq, deleted_at) "
        "VALUES (?, 'global', '', 'k', (SELECT coalesce(max(seq), 0) + 1 FROM "
        "flowdrop_sync_tombstones), '2026-01-01T00:00:00.000Z')",
        private,
    )
    evil = Store(evil.path)
    report = sync(a, evil)  # the default scopes: global, not user
    sync(a, c, "all")
    sync(c, a, "all")
    for store in (a, c):
        assert [m.content for m in store.buffer("user", "42", "notes").messages()] == ["mine"]
    assert report.tombstones_refused == 1


def test_a_forged_retirement_does_not_cut_honest_replicas_apart(tmp_path: Path) -> None:
    from flowdrop_local.syncing import peers, replica_id

    a, b = pair(tmp_path)
    b.backup(str(tmp_path / "c.db"))
    c = Store(str(tmp_path / "c.db"))
    sync(a, c, "all")
    evil = Store(str(tmp_path / "evil.db"))
    enable(evil)
    evil.close()
    _tamper(evil.path, "INSERT INTO flowdrop_sync_retired (peer) VALUES (?)", replica_id(c))
    evil = Store(evil.path)
    sync(a, evil, "all")
    assert replica_id(c) in peers(a)
    a.buffer("global", "", "k").append(user("still friends"))
    sync(a, c, "all")  # no ReplicaRetired
    assert ("global", "", "k") in contents(c)


def test_a_stamp_far_ahead_does_not_win_for_ever(tmp_path: Path) -> None:
    """A viewer grant stamped in the year 9999 on a peer: a revoke made after the
    sync still wins (stamps are clamped to the stores' clocks plus the bound)."""
    from flowdrop_local.access import Principal

    a, b = pair(tmp_path)
    admin = Principal("owner", admin=True)
    session = a.sessions(admin).create(workflow_id="w", name="s")
    sync(a, b, "all")
    b.sessions(admin).grant(session.id, "eve")
    b.close()
    _tamper(b.path, "UPDATE session_viewers SET granted_at = '9999-12-31T00:00:00.000Z'")
    b = Store(b.path)
    sync(a, b, "all")
    assert "eve" in a.sessions(admin).viewers(session.id)
    a.sessions(admin).revoke(session.id, "eve")
    sync(a, b, "all")
    for store in (a, b):
        assert "eve" not in store.sessions(admin).viewers(session.id), store.path


# ---------------------------------- 6. PostgreSQL: a server many laptops sync with


def test_a_memory_write_committed_on_the_server_during_a_sync_survives_it(
    tmp_path: Path, postgresql_url: str
) -> None:
    """The sync read the server's value, a client of the server wrote a newer one and
    committed, then the sync wrote the laptop's older value over it (a lost update).
    Now a sync holds the server's memory, sessions and grants for its duration: the
    client's write waits for it, then lands."""
    import threading
    import time

    from flowdrop_local.access import ExecutionContext

    ctx = ExecutionContext(workflow_id="w")
    server = Store(postgresql_url)
    laptop = Store(str(tmp_path / "laptop.db"))
    server.memory_set(ctx, "workflow", "k", "oldest")
    sync(server, laptop)
    time.sleep(0.01)
    laptop.memory_set(ctx, "workflow", "k", "from the laptop")
    done: list[str] = []

    def client() -> None:
        with Store(postgresql_url) as other:
            time.sleep(0.01)
            other.memory_set(ctx, "workflow", "k", "newest, on the server")
        done.append("written")

    writer = threading.Thread(target=client)

    def trace(sql: str) -> None:  # the laptop's memory is read after the server's
        if "updated_at FROM memory" in sql and not writer.is_alive() and not done:
            writer.start()
            writer.join(timeout=1.0)  # with the fix it waits for the sync's commit

    laptop.backend.connection().set_trace_callback(trace)
    sync(server, laptop)
    laptop.backend.connection().set_trace_callback(None)
    writer.join()
    sync(server, laptop)
    for store in (server, laptop):
        assert store.memory_get(ctx, "workflow", "k").value == "newest, on the server"
    server.close()
    laptop.close()


SYNC_LOOP = """
import sys, time
from flowdrop_local import Store, sync
from flowdrop_local.access import ExecutionContext
url, path, tag, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
laptop = Store(path)
end = time.monotonic() + seconds
n = 0
ctx = ExecutionContext(workflow_id="w")
while time.monotonic() < end:
    laptop.buffer("global", "", tag).append({"role": "user", "content": f"{tag} {n}"})
    laptop.buffer("global", "", "shared").append({"role": "user", "content": f"{tag} {n}"})
    laptop.memory_set(ctx, "workflow", tag, n)
    laptop.memory_set(ctx, "workflow", "shared", f"{tag} {n}")
    with Store(url) as server:
        sync(laptop, server, "all")
        server.buffer("global", "", tag).append({"role": "user", "content": "popped"})
        server.buffer("global", "", tag).pop()
    n += 1
print(n, flush=True)
"""


def test_three_laptops_syncing_with_one_server_at_once(tmp_path: Path, postgresql_url: str) -> None:
    """Three processes append and sync with one PostgreSQL server for a minute:
    no error (deadlocks and serialization failures are retried inside), and a round
    of syncs afterwards leaves all four holding the same history."""
    import os
    import subprocess
    import sys

    Store(postgresql_url).close()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    paths = [str(tmp_path / f"laptop{n}.db") for n in range(3)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", SYNC_LOOP, postgresql_url, path, f"l{n}", "60"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, path in enumerate(paths)
    ]
    counts = []
    for child in children:
        out, err = child.communicate(timeout=240)
        assert child.returncode == 0, err
        counts.append(int(out.strip()))
    assert min(counts) > 0
    server = Store(postgresql_url)
    laptops = [Store(path) for path in paths]
    for _ in range(2):
        for laptop in laptops:
            sync(laptop, server, "all")
    expected = contents(server)
    assert len(expected[("global", "", "shared")]) == sum(counts)
    for laptop in laptops:
        assert contents(laptop) == expected
        assert laptop.check() == []
    assert server.check() == []


# ------------------------------------------------------------- 7. silent divergence


@pytest.mark.parametrize("differs", ["memory", "grant", "title"])
def test_a_hand_copy_that_differs_only_in_memory_grants_or_titles_is_refused(
    tmp_path: Path, differs: str
) -> None:
    """A file copied with cp keeps the replica id. Its messages match the original,
    its memory (or a grant, or a title) does not: that is two stores with one id,
    refused with ReplicaConflict, not a no-op for ever."""
    import shutil

    from flowdrop_local import ReplicaConflict
    from flowdrop_local.access import ExecutionContext, Principal

    a = Store(str(tmp_path / "a.db"))
    a.buffer("global", "", "k").append(user("q"))
    admin = Principal("owner", admin=True)
    session = a.sessions(admin).create(workflow_id="w", name="s")
    enable(a)
    a.close()
    shutil.copy(tmp_path / "a.db", tmp_path / "copy.db")
    a, copy = Store(str(tmp_path / "a.db")), Store(str(tmp_path / "copy.db"))
    if differs == "memory":
        copy.memory_set(ExecutionContext(workflow_id="w"), "workflow", "k", "only here")
    elif differs == "grant":
        copy.sessions(admin).grant(session.id, "eve")
    else:
        copy.buffer("global", "", "k").set_title("only here")
    with pytest.raises(ReplicaConflict):
        sync(a, copy, "all")


def test_memory_restored_by_an_import_is_read_by_the_next_sync(tmp_path: Path) -> None:
    """import_records(replace=True) writes memory with its old stamps; an incremental
    sync took the kind as unchanged and left the stores different."""
    from flowdrop_local.access import ExecutionContext

    ctx = ExecutionContext(workflow_id="w")
    a, b = pair(tmp_path)
    a.memory_set(ctx, "workflow", "k", "v1")
    sync(a, b)
    saved = [  # a backup taken an hour ago: its stamps are older than the sync's margin
        {**r, "updated_at": "2026-01-01T00:00:00.000Z"}
        for r in a.export(full=True)
        if r.get("record") == "memory"
    ]
    a.memory_set(ctx, "workflow", "k", "v2")
    sync(a, b)
    for store in (a, b):  # hours pass: the values are older than the sync's margin
        _tamper(store.path, "UPDATE memory SET updated_at = '2026-01-01T01:00:00.000Z'")
    b.import_records(saved, replace=True)  # b restores v1 (stamped when v1 was set)
    assert b.memory_get(ctx, "workflow", "k").value == "v1"
    report = sync(a, b)
    assert report.kv_skipped == 1  # the grants were not touched
    assert a.memory_get(ctx, "workflow", "k").value == b.memory_get(ctx, "workflow", "k").value


# ------------------------------------------------- 5. field merges against the pair's base


def test_a_session_field_merges_against_the_pairs_own_base(tmp_path: Path) -> None:
    """a stops a session and syncs with c; b only grants a viewer; sync(a, b) used to
    make the session active again on both (each side's base was its row at its last
    sync with anyone: a's was c's sync, so no common base, and b's later row won)."""
    import time

    from flowdrop_local.access import Principal

    admin = Principal("owner", admin=True)
    a, b = pair(tmp_path)
    session = a.sessions(admin).create(workflow_id="w", name="s")
    a.backup(str(tmp_path / "c.db"))
    c = Store(str(tmp_path / "c.db"))
    for x, y in ((a, b), (a, c), (b, c)):
        sync(x, y, "all")
    a.sessions(admin).stop(session.id)
    sync(a, c, "all")
    time.sleep(0.01)
    b.sessions(admin).grant(session.id, "eve")
    sync(a, b, "all")
    for store in (a, b):
        held = store.sessions(admin).get(session.id)
        assert held.status == "stopped", store.path
        assert "eve" in store.sessions(admin).viewers(session.id)


# ------------------------------------------------ 4. the order of shared messages


def _order(store: Store) -> list[str]:
    return [m.id for m in store.buffer(*ADDRESS).messages()]


def _assert_shared_order(stores: list[Store]) -> None:
    """Messages two replicas both hold stand in the same order on both."""
    orders = [_order(s) for s in stores]
    for i, x in enumerate(orders):
        for y in orders[i + 1 :]:
            shared = set(x) & set(y)
            assert [m for m in x if m in shared] == [m for m in y if m in shared]


def _three(tmp_path: Path, count: int = 3) -> list[Store]:
    a = Store(str(tmp_path / "r0.db"))
    a.buffer(*ADDRESS).append(user("start"))
    enable(a)
    for n in range(1, count):
        a.backup(str(tmp_path / f"r{n}.db"))
    return [a, *(Store(str(tmp_path / f"r{n}.db")) for n in range(1, count))]


def _apply(stores: list[Store], op: str, x: int, y: int, c: int, n: int) -> None:
    buffer = stores[x].buffer(*ADDRESS)
    if op == "user":
        buffer.append(user(f"u{n}"))
    elif op == "call":
        buffer.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{c}"}]})
    elif op == "result":
        buffer.append({"role": "tool", "tool_call_id": f"c{c}", "content": f"r{n}"})
    elif op == "said":
        buffer.append({"role": "assistant", "content": f"s{n}"})
    elif op == "pop":
        buffer.pop()
    elif op == "sync" and x != y:
        sync(stores[x], stores[y])
        assert _order(stores[x]) == _order(stores[y])
        _assert_shared_order(stores)


def test_a_result_answered_in_its_calls_tool_run_does_not_reorder_a_third_replica(
    tmp_path: Path,
) -> None:
    """Found by a three-replica random run (the issue's six appends): replica 1 holds
    a result before its call, syncs with 2, then with 0, which holds the call and a
    user turn. The merge moved the result into the call's tool run, so 0 and 1 held
    the result before 1's user turn while 2 held it after: two replicas ordering the
    messages they share apart. Now a new row answers the call there and the result's
    own row goes; 2 drops it at its next merge."""
    stores = _three(tmp_path)
    script = [
        ("user", 0, 0, 0),
        ("user", 1, 0, 0),
        ("call", 0, 0, 0),
        ("result", 1, 0, 0),
        ("sync", 1, 2, 0),
        ("sync", 0, 1, 0),
    ]
    for n, step in enumerate(script):
        _apply(stores, *step, n)
    for x, y in ((2, 0), (1, 2), (0, 1)):
        sync(stores[x], stores[y])
        _assert_shared_order(stores)
    assert _order(stores[0]) == _order(stores[1]) == _order(stores[2])
    for store in stores:
        assert store.check() == []


def test_five_replicas_order_two_blocks_alike_whatever_the_syncs_order(tmp_path: Path) -> None:
    """Found by review 9: q on all five; replica 0 appends U, replica 4 S, then 0 R.
    Blocks used to be ordered by their first id, and a block is what one replica
    holds between two shared messages: 0-1, 4-3, 1-4, 0-2, 2-3, 0-1 left 0 and 1
    with q U S R and 2 and 3 with q U R S, for ever. Now each message's link (the
    message it followed where it was written, rules.order) decides, on every replica."""
    stores = _three(tmp_path, 5)
    script = [
        ("user", 0, 0, 0),
        ("said", 4, 0, 0),
        ("sync", 0, 1, 0),
        ("sync", 4, 3, 0),
        ("sync", 1, 4, 0),
        ("said", 0, 0, 0),
        ("sync", 0, 2, 0),
        ("sync", 2, 3, 0),
        ("sync", 0, 1, 0),
    ]
    for n, step in enumerate(script):
        _apply(stores, *step, n)
    _assert_shared_order(stores)
    for x, y in ((0, 1), (1, 2), (2, 3), (3, 4), (0, 4)):
        sync(stores[x], stores[y])
        _assert_shared_order(stores)
    assert len({tuple(_order(store)) for store in stores}) == 1
    for store in stores:
        assert store.check() == []


@settings(
    max_examples=int(os.environ.get("FLOWDROP_SHARED_ORDER_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    st.integers(3, 5),
    st.lists(
        st.tuples(
            st.sampled_from(["user", "call", "result", "said", "pop", "sync", "sync", "sync"]),
            st.integers(0, 4),
            st.integers(0, 4),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=24,
    ),
)
def test_replicas_never_order_shared_messages_apart(
    tmp_path_factory: pytest.TempPathFactory, count: int, script: list[tuple[str, int, int, int]]
) -> None:
    """Three to five replicas: results before and after their calls, re-declared
    calls, user turns, pops, syncs in random pairs: after every sync the pair reads
    alike and every two replicas order the messages they share alike; rounds of
    syncs leave all the same and check() clean."""
    stores = _three(tmp_path_factory.mktemp("order"), count)
    for n, (op, x, y, c) in enumerate(script):
        _apply(stores, op, x % count, y % count, c, n)
    for _ in range(3):
        for x in range(count):
            sync(stores[x], stores[(x + 1) % count])
            _assert_shared_order(stores)
    assert len({tuple(_order(store)) for store in stores}) == 1
    for store in stores:
        assert store.check() == []
        store.close()


def test_a_clock_that_ran_ahead_and_was_set_right_still_finds_what_changed(
    tmp_path: Path,
) -> None:
    """A store whose clock ran an hour ahead at the pair's last sync, then was set
    right: what it writes now is stamped by the store's clock (never behind its
    newest stamp), so an incremental sync finds it, without reading everything.
    (Real clock steps, in processes with their own clocks: test_sync_clocks.py.)"""
    a, b = pair(tmp_path)
    a.buffer("global", "", "k").append(user("q"))
    a.buffer("global", "", "other").append(user("left alone"))
    sync(a, b)
    ahead = "2099-01-01T00:00:00.000Z"  # far ahead, then set right (now)
    _tamper(a.path, "UPDATE buffers SET updated_at = ?", ahead)
    _tamper(a.path, "UPDATE flowdrop_sync_marks SET since = ?", ahead)
    a.buffer("global", "", "k").append({"role": "assistant", "content": "written after"})
    a.memory_set(None, "global", "note", "set after")
    report = sync(a, b)
    assert contents(a) == contents(b)
    assert b.memory_get(None, "global", "note").value == "set after"
    assert report.buffers_read <= 2  # the two buffers stamped near the mark, no more
    again = sync(a, b, full=True)
    assert again.moved == 0


# ------------------------------------- found by a fresh-eyes review of the changes above


def test_an_append_made_after_the_other_side_deleted_the_conversation_survives(
    tmp_path: Path,
) -> None:
    """An append moves buffers.updated_at at most once a minute: the conversation's
    version is also dated by its last message, so a turn written after the other
    side's deletion keeps the conversation (it was lost with it)."""
    import time

    a, b = pair(tmp_path)
    b.buffer(*ADDRESS).append(user("m1"))
    sync(a, b)
    time.sleep(0.05)
    a.buffer(*ADDRESS).delete()
    time.sleep(0.05)
    b.buffer(*ADDRESS).append(user("m2, after the delete"))
    sync(a, b)
    for store in (a, b):
        assert contents(store)[ADDRESS] == [("user", "m2, after the delete")], store.path


def test_an_escaped_healed_key_is_still_a_healed_mark(tmp_path: Path) -> None:
    """JSON may spell a key with escapes (\\u0068ealed): the check reads the JSON."""
    from flowdrop_local import SyncRefused

    a, b = pair(tmp_path)
    b.buffer(*ADDRESS).append(
        [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "real"},
        ]
    )
    b.close()
    _tamper(
        b.path,
        """UPDATE messages SET metadata = '{"tool_call_id":"c1","\\u0068ealed":true}' """
        "WHERE role = 'tool'",
    )
    b = Store(b.path)
    with pytest.raises(SyncRefused, match="healed"):
        sync(a, b)
    assert a.check() == []


def test_a_peers_conversation_name_is_checked_as_set_title_checks_one(tmp_path: Path) -> None:
    from flowdrop_local import SyncRefused

    a, b = pair(tmp_path)
    b.buffer(*ADDRESS).append(user("q"))
    b.close()
    _tamper(b.path, "UPDATE buffers SET title = ?", "x" * 5000)
    b = Store(b.path)
    before = (_everything(a), _everything(b))
    with pytest.raises(SyncRefused, match="title"):
        sync(a, b)
    assert (_everything(a), _everything(b)) == before


def test_a_peers_acknowledgement_is_bounded_by_what_was_given(tmp_path: Path) -> None:
    """A peer claiming to have received change 2**63 - 1 gets acknowledged only as
    far as this store has numbered: its next deletion is still numbered in order."""
    import sqlite3

    from flowdrop_local.syncing import replica_id

    a, b = pair(tmp_path)
    a.buffer(*ADDRESS).append([user("q"), user("r")])
    sync(a, b, "all")
    b.close()
    _tamper(
        b.path,
        "UPDATE flowdrop_sync_peers SET received = ? WHERE peer = ?",
        2**63 - 1,
        replica_id(a),
    )
    b = Store(b.path)
    sync(a, b, "all")
    a.buffer(*ADDRESS).pop()
    conn = sqlite3.connect(a.path)
    seqs = [r[0] for r in conn.execute("SELECT seq FROM flowdrop_sync_tombstones")]
    acked = [r[0] for r in conn.execute("SELECT acked FROM flowdrop_sync_acks")]
    assert all(isinstance(n, int) and n < 1000 for n in seqs + acked), (seqs, acked)


def test_a_conversation_the_sync_makes_keeps_its_created_at(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    a.buffer(*ADDRESS).set_title("named")
    sync(a, b)
    assert a.buffer(*ADDRESS).info().created_at == b.buffer(*ADDRESS).info().created_at


# ------------------------------------ connections older than the first sync; schema steps


def test_a_connection_opened_before_the_first_sync_records_renames_and_deletions(
    tmp_path: Path,
) -> None:
    """A Store opened before its file's first sync (by another Store) had no
    triggers: its renames and conversation deletions were never recorded, so the
    peer kept its title and brought the conversation back. A write now makes them
    once it sees sync's tables."""
    early = Store(str(tmp_path / "a.db"))
    early.buffer("global", "", "named").append(user("q"))
    early.buffer("global", "", "doomed").append(user("q"))
    a = Store(str(tmp_path / "a.db"))
    enable(a)  # by the other Store: the early one is already open
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    sync(a, b)
    early.buffer("global", "", "named").set_title("renamed by the early connection")
    early.buffer("global", "", "doomed").delete()
    report = sync(a, b)
    assert report.conversations_named_on_b == 1
    assert report.conversations_deleted_on_b == 1
    assert b.buffer("global", "", "named").info().title == "renamed by the early connection"
    assert [r.key for r in b.buffers()] == ["named"]
    assert sync(a, b).moved == 0
    assert [r.key for r in a.buffers()] == ["named"]


def _refuse_ddl(store: Store) -> None:
    """From now on this store's connection may create nothing in the file."""
    import sqlite3

    creates = {
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_CREATE_TRIGGER,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_ALTER_TABLE,
    }

    def authorizer(action: int, *_: object) -> int:
        return sqlite3.SQLITE_DENY if action in creates else sqlite3.SQLITE_OK

    store.backend.connection().set_authorizer(authorizer)


def test_a_sync_of_current_stores_runs_no_ddl(tmp_path: Path) -> None:
    """Sync's schema is numbered steps a store takes once: a later sync creates
    nothing (SQLite refuses every CREATE in the main file on both connections)."""
    a, b = pair(tmp_path)
    sync(a, b)
    _refuse_ddl(a)
    _refuse_ddl(b)
    a.buffer("global", "", "k").append(user("after"))
    assert sync(a, b).sent_a_to_b == 1


def test_a_store_synced_before_schema_steps_takes_them(tmp_path: Path) -> None:
    """A store synced by a release without steps (no flowdrop_sync_schema, one of
    sync's tables missing) takes step 1: what is missing is made, nothing lost."""
    a, b = pair(tmp_path)
    a.buffer("global", "", "k").append(user("q"))
    sync(a, b)
    _tamper(a.path, "DROP TABLE flowdrop_sync_schema")
    _tamper(a.path, "DROP TABLE flowdrop_sync_hlc")
    a.buffer("global", "", "k").append(user("more"))
    assert sync(a, b).sent_a_to_b == 1
    assert contents(a) == contents(b)
    import sqlite3

    conn = sqlite3.connect(a.path)
    try:
        steps = len(schema_steps(postgresql=False))
        assert conn.execute("SELECT step FROM flowdrop_sync_schema").fetchall() == [(steps,)]
        assert conn.execute("SELECT count(*) FROM flowdrop_sync_hlc").fetchone() is not None
    finally:
        conn.close()


def test_postgresql_a_sync_of_current_stores_runs_no_ddl(
    tmp_path: Path, postgresql_url: str
) -> None:
    """On the server, an event trigger refuses every DDL command once the first sync
    is done: later syncs (and appends, pops, renames) still work."""
    import psycopg

    server = Store(postgresql_url)
    laptop = Store(str(tmp_path / "laptop.db"))
    server.buffer("global", "", "k").append(user("q"))
    sync(laptop, server)
    admin = psycopg.connect(postgresql_url, autocommit=True)
    # Sync's trigger functions run with the search path the library pins (issue 21).
    pinned = admin.execute(
        "SELECT p.proname, p.proconfig FROM pg_catalog.pg_proc AS p "
        "WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace "
        "AND p.proname LIKE 'flowdrop_sync_%' ORDER BY 1"
    ).fetchall()
    assert [name for name, _ in pinned] == [
        "flowdrop_sync_buffer_deleted",
        "flowdrop_sync_conversation_changed",
        "flowdrop_sync_message_deleted",
    ]
    assert all(any(c.startswith("search_path=") for c in config or []) for _, config in pinned)
    admin.execute(
        "CREATE FUNCTION public.flowdrop_test_no_ddl() RETURNS event_trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'DDL during a sync: %', tg_tag; END $$"
    )
    admin.execute(
        "CREATE EVENT TRIGGER flowdrop_test_no_ddl ON ddl_command_start "
        "EXECUTE FUNCTION public.flowdrop_test_no_ddl()"
    )
    try:
        with psycopg.connect(postgresql_url) as other, pytest.raises(psycopg.Error, match="DDL"):
            other.execute("CREATE TABLE flowdrop_test_probe (a int)")  # the trigger works
        server.buffer("global", "", "k").append(user("from the server"))
        server.buffer("global", "", "k").set_title("named")
        laptop.buffer("global", "", "k").append({"role": "assistant", "content": "a"})
        report = sync(laptop, server)
        assert report.sent_a_to_b == 1 and report.sent_b_to_a == 1
        assert contents(laptop) == contents(server)
    finally:
        admin.execute("DROP EVENT TRIGGER flowdrop_test_no_ddl")
        admin.execute("DROP FUNCTION public.flowdrop_test_no_ddl()")
        admin.close()
        laptop.close()
        server.close()


def test_a_conversation_deleted_behind_the_library_is_deleted_on_the_peer(
    tmp_path: Path,
) -> None:
    """A conversation deleted by plain SQL (no trigger saw it) is found gone by the
    next sync, which deletes it on the peer too instead of making it again, empty,
    on the side that deleted it."""
    a, b = pair(tmp_path)
    a.buffer("global", "", "kept").append(user("q"))
    a.buffer("global", "", "doomed").append(user("q"))
    a.buffer("global", "", "doomed").set_title("doomed")
    sync(a, b)
    import sqlite3

    conn = sqlite3.connect(a.path)
    with conn:  # as a user's own SQL would, its messages going with it
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM buffers WHERE key = 'doomed'")
    conn.close()
    report = sync(a, b)
    assert report.conversations_deleted_on_b == 1
    assert [r.key for r in a.buffers()] == [r.key for r in b.buffers()] == ["kept"]
    assert sync(a, b).moved == 0
    assert [r.key for r in a.buffers()] == ["kept"]


# ------------------------------- hostile peers, from the second fresh-eyes review


def _forge(path: str, *statements: tuple[str, tuple[object, ...]]) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    with conn:
        for sql, params in statements:
            conn.execute(sql, params)
    conn.close()


def _last_id_bytes(store: Store, key: str = "k") -> bytes:
    import uuid

    return uuid.UUID(store.buffer("global", "", key).messages()[-1].id).bytes


@pytest.mark.parametrize(
    ("forgery", "problem"),
    [
        pytest.param(
            ("UPDATE messages SET metadata = '{\"tool_calls\": [1, 2]}' WHERE id = ?",),
            "not a message an import takes",
            id="tool calls that are not objects",
        ),
        pytest.param(
            ("UPDATE messages SET content = '[1, null, \"x\"]', content_parts = 1 WHERE id = ?",),
            "not a message an import takes",
            id="content parts that are not objects",
        ),
        pytest.param(
            ("UPDATE buffers SET key = ' ' WHERE key = 'k'",),
            "address an import refuses",
            id="a blank conversation key",
        ),
        pytest.param(
            (
                "INSERT INTO memory (scope, scope_id, key, value) "
                "VALUES ('bogus scope', '', 'k', '1')",
            ),
            "address an import refuses",
            id="memory in a scope memory has not",
        ),
        pytest.param(
            ("INSERT OR REPLACE INTO flowdrop_sync_versions VALUES (?, 'f', 9223372036854775806)",),
            "edit generation",
            id="an edit generation at the edge of 64 bits",
        ),
    ],
)
def test_a_peers_row_an_import_refuses_is_refused(
    tmp_path: Path, forgery: tuple[str], problem: str
) -> None:
    """Every row from a peer passes the checks an import makes: a message's tool
    calls and content parts, a conversation's address, a memory value's scope, and
    the counts sync keeps (an edit generation near 2**63 made every later sync of the
    honest store overflow). Refused with SyncRefused, neither side changed."""
    import uuid

    from flowdrop_local import SyncRefused

    a, b = pair(tmp_path)
    b.buffer("global", "", "k").append({"role": "assistant", "content": "from b"})
    sync(a, b)
    last = _last_id_bytes(b)
    b.buffer("global", "", "k").append({"role": "assistant", "content": "more from b"})
    newest = _last_id_bytes(b)
    b.close()
    sql = forgery[0]
    params: tuple[object, ...] = ()
    if "flowdrop_sync_versions" in sql:
        params = (str(uuid.UUID(bytes=last)),)
        _forge(b.path, ("UPDATE messages SET content = 'forged' WHERE id = ?", (last,)))
    elif "?" in sql:
        params = (newest,)
    _forge(b.path, (sql, params))
    b = Store(b.path)
    before = (_everything(a), _everything(b))
    with pytest.raises(SyncRefused, match=problem):
        sync(a, b, "all", full=True)
    assert (_everything(a), _everything(b)) == before


def test_a_peer_cannot_hand_a_session_to_another_owner(tmp_path: Path) -> None:
    """No API changes a session's owner: a peer file that names another owner is
    refused (before, the session moved to mallory on the honest store)."""
    from flowdrop_local import Principal, SyncRefused

    a, b = pair(tmp_path)
    sid = a.sessions(Principal("u1")).create("wf").id
    a.sessions(Principal("u1")).drive(sid, [user("my secrets")])
    sync(a, b, "all")
    b.close()
    _forge(b.path, ("UPDATE sessions SET owner_id = 'mallory' WHERE id = ?", (sid,)))
    b = Store(b.path)
    with pytest.raises(SyncRefused, match="owner never changes"):
        sync(a, b, "all")
    assert [m.content for m in a.sessions(Principal("u1")).messages(sid)] == ["my secrets"]


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("conversation", 2**62, "conversation number"),
        ("name", "x" * 10, None),
    ],
)
def test_a_peers_session_row_the_api_could_not_write_is_refused(
    tmp_path: Path, column: str, value: object, problem: str | None
) -> None:
    from flowdrop_local import Principal, SyncRefused

    a, b = pair(tmp_path)
    sid = a.sessions(Principal("u1")).create("wf").id
    sync(a, b, "all")
    b.close()
    _forge(b.path, (f"UPDATE sessions SET {column} = ? WHERE id = ?", (value, sid)))
    b = Store(b.path)
    if problem is None:  # a change the API could make: it travels
        sync(a, b, "all")
        assert a.sessions(Principal("u1")).get(sid).name == value
        return
    with pytest.raises(SyncRefused, match=problem):
        sync(a, b, "all")


def test_a_store_stamped_in_the_year_9999_still_syncs(tmp_path: Path) -> None:
    """A store whose buffers are stamped 9999-12-31T23:59:59.999Z (a clock gone
    wild, or a damaged file): the next stamp would be past what SQLite's strftime
    writes, and every later sync failed, reported as SyncIdConflict. The store's
    clock now stays at that last instant."""
    a, b = pair(tmp_path)
    a.buffer("global", "", "g").append(user("q"))
    sync(a, b, "all")
    b.close()
    _forge(b.path, ("UPDATE buffers SET updated_at = '9999-12-31T23:59:59.999Z'", ()))
    b = Store(b.path)
    sync(a, b, "all")
    a.buffer("global", "", "g").append(user("after"))
    assert sync(a, b, "all").sent_a_to_b == 1
    b.buffer("global", "", "g").append({"role": "assistant", "content": "on b"})
    assert sync(a, b, "all").sent_b_to_a == 1
    assert contents(a) == contents(b)


def test_a_conflict_is_kept_on_every_replica_it_reaches(tmp_path: Path) -> None:
    """MEM-1 across three replicas: X answers c1, Y copies X's answer, Z answers c1
    otherwise; sync(Y, Z) keeps one answer and records the other. When X then loses
    its own answer to the pair's merge, the record is on X too (before: only on the
    pair whose merge dropped it)."""
    from flowdrop_local.syncing import conflicts

    k = ("global", "", "k")
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f"}]}
    x = Store(str(tmp_path / "x.db"))
    x.buffer(*k).append([user("q"), call])
    enable(x)
    x.backup(str(tmp_path / "y.db"))
    x.backup(str(tmp_path / "z.db"))
    y, z = Store(str(tmp_path / "y.db")), Store(str(tmp_path / "z.db"))
    z.buffer(*k).append({"role": "tool", "tool_call_id": "c1", "content": "Z's answer"})
    x.buffer(*k).append({"role": "tool", "tool_call_id": "c1", "content": "X's answer"})
    sync(x, y, "all")
    sync(y, z, "all")
    sync(x, y, "all")
    held = {m.content for m in x.buffer(*k).messages()}
    kept = "X's answer" if "X's answer" in held else "Z's answer"
    dropped = "Z's answer" if kept == "X's answer" else "X's answer"
    for store in (x, y, z):
        assert dropped in [c["message"].get("content") for c in conflicts(store)]


def test_a_damaged_stamp_does_not_become_the_stores_clock(tmp_path: Path) -> None:
    """A buffer stamp that is not a time ('not a time' sorts after every date) was
    the newest stamp, so the store's clock, and every buffer written after took it
    (found by a review): only stamps that sort as times count."""
    a, b = pair(tmp_path)
    a.buffer("global", "", "damaged").append(user("q"))
    _forge(a.path, ("UPDATE buffers SET updated_at = 'not a time' WHERE key = 'damaged'", ()))
    a.buffer("global", "", "other").append(user("q"))
    a.buffer("global", "", "other").set_title("renamed")
    a.buffer("global", "", "damaged").append(user("repaired"))
    import datetime

    for info in a.conversations().items:
        datetime.datetime.fromisoformat(info.updated_at.replace("Z", "+00:00"))
    sync(a, b)
    assert sync(a, b, full=True).moved == 0


def _clock_ahead(store: Store, edits: int = 1500) -> None:
    """Move the store's clock ahead of the wall clock, by a second or so: every edit
    stamps its buffer strictly after the store's newest stamp (1 ms later), faster
    than the wall clock moves. The buffer is in a user scope, which the syncs below
    (default scopes) leave out, so only this store's clock runs ahead."""
    y = store.buffer("user", "ana", "busy")
    y.append({"role": "user", "content": "0"})
    for _ in range(edits):
        y.append({"role": "user", "content": "x"})
        y.pop()


@pytest.mark.parametrize("writer", ["the deleting store", "the other store"])
def test_a_conversation_written_after_its_deletion_arrived_survives(
    tmp_path: Path, target: str, writer: str
) -> None:
    """Campaign four: a conversation made again after the writer held its deletion was
    stamped with the writer's clock, never above the deletion's stamp, so when the
    deleting store's clock ran ahead (or both stamps fell in one millisecond) the older
    deletion won the next sync and deleted what was written after it, on both sides.
    Now a conversation made again is stamped after the deletion it replaces (SQLite's
    trigger; PostgreSQL's, schema step 5)."""
    a = Store(tmp_path / "a.db")
    b = Store(target)
    x = ("chat", "ana", "trip")
    a.buffer(*x).append({"role": "user", "content": "Plan a trip."})
    sync(a, b)
    _clock_ahead(a)
    a.buffer(*x).delete()
    sync(a, b)
    assert a.buffer(*x).count() == b.buffer(*x).count() == 0
    later = a if writer == "the deleting store" else b
    later.buffer(*x).append(
        [{"role": "user", "content": "Lisbon, then."}, {"role": "assistant", "content": "Done."}]
    )
    sync(a, b)
    for store in (a, b):
        assert [m["content"] for m in store.buffer(*x).read()] == ["Lisbon, then.", "Done."]
        assert store.check() == []
    assert sync(a, b, full=True).moved == 0
    a.close()
    b.close()


@pytest.mark.parametrize("when", ["after the deletion", "before the deletion"])
def test_a_turn_the_deleting_side_never_saw_keeps_the_conversation(
    tmp_path: Path, target: str, when: str
) -> None:
    """Campaign five: a conversation's deletion was judged against the other side's
    append by their stamps, taken from two clocks (the deleting store's runs ahead
    after a burst of edits), so a turn written after the deletion on a store that had
    not received it was deleted with the conversation; and a turn written on a stale
    copy before it went too. A deletion now deletes what the deleting side held
    (its tombstones): a turn it never saw keeps the conversation, on both sides,
    whatever the clocks say."""
    import time

    a = Store(tmp_path / "a.db")
    b = Store(target)
    x = ("chat", "ana", "trip")
    a.buffer(*x).append({"role": "user", "content": "Plan a trip."})
    a.buffer(*x).set_title("Trip")
    sync(a, b)
    if when == "before the deletion":
        b.buffer(*x).append({"role": "user", "content": "Lisbon, then."})
        time.sleep(0.01)
    _clock_ahead(a)
    a.buffer(*x).delete()
    if when == "after the deletion":
        time.sleep(0.01)
        b.buffer(*x).append({"role": "user", "content": "Lisbon, then."})
    sync(a, b)
    for store in (a, b):
        assert [m["content"] for m in store.buffer(*x).read()] == ["Lisbon, then."], store.path
        assert store.buffer(*x).info().title == "Trip"
        assert store.check() == []
    assert sync(a, b, full=True).moved == 0
    a.close()
    b.close()


def test_a_tool_result_alone_does_not_keep_a_deleted_conversation(tmp_path: Path) -> None:
    """A result the deleting side never saw, answering a call it deleted, is not a
    turn: the conversation goes on both sides and does not come back."""
    a, b = pair(tmp_path)
    x = ("global", "", "k")
    a.buffer(*x).append(
        [user("q"), {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}]
    )
    sync(a, b)
    b.buffer(*x).append({"role": "tool", "tool_call_id": "c1", "content": "late"})
    a.buffer(*x).delete()
    report = sync(a, b)
    assert report.conversations_deleted_on_b == 1
    for _ in range(2):
        sync(a, b)
        for store in (a, b):
            assert x not in contents(store), store.path
            assert store.check() == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pairs=st.lists(st.sampled_from([(0, 1), (0, 2), (1, 2)]), min_size=4, max_size=8))
def test_three_replicas_keep_every_turn_the_deleter_never_saw(
    tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[int, int]]
) -> None:
    """Three copies: the first deletes a conversation all three held, the second
    wrote a turn the first never saw, the third holds only what was deleted. In any
    order of syncs the turn survives, alone, and every copy ends the same."""
    root = tmp_path_factory.mktemp("three")
    first = Store(root / "0.db")
    enable(first)
    x = ("global", "", "k")
    first.buffer(*x).append([user("old one"), user("old two")])
    for n in (1, 2):
        first.backup(str(root / f"{n}.db"))
    stores = [first, Store(root / "1.db"), Store(root / "2.db")]
    stores[1].buffer(*x).append(user("new, never seen by the first"))
    _clock_ahead(first, edits=200)
    first.buffer(*x).delete()
    for i, j in [*pairs, (0, 1), (1, 2), (0, 2), (0, 1)]:
        sync(stores[i], stores[j])
    for store in stores:
        assert contents(store).get(x) == [("user", "new, never seen by the first")], store.path
        assert store.check() == []
        store.close()


def test_a_store_opened_before_another_enabled_sync_records_its_deletions(
    tmp_path: Path,
) -> None:
    """A connection that wrote before sync was enabled on another connection to its
    file records its deletions from its next write on: the first one (another
    connection committed) and the ones after its own appends (nobody else did)."""
    path = tmp_path / "a.db"
    with Store(path) as first:
        buf = first.buffer("global", "", "k")
        for text in ("0", "1", "2", "3"):
            buf.append(user(text))  # written while the file does not sync
        with Store(path) as other:
            enable(other)
            other.backup(str(tmp_path / "copy.db"))
        buf.pop()  # the first write since the other connection enabled sync
        buf.append(user("4"))
        buf.pop()  # writes in a row by this connection alone
        buf.pop()
        with Store(tmp_path / "copy.db") as copy:
            sync(first, copy)
            kept = [m["content"] for m in copy.buffer("global", "", "k").read()]
    assert kept == ["0", "1"]


def test_a_write_whose_arming_failed_leaves_the_next_write_to_arm(tmp_path: Path) -> None:
    """A write that saw another connection's commit (sync enabled) and failed while
    it armed the triggers leaves the next write to arm them, although that one sees
    no commit since: a message it appends, backed up, then deleted, stays deleted."""
    path = tmp_path / "a.db"
    with Store(path) as first:
        buf = first.buffer("global", "", "k")
        for text in ("0", "1"):
            buf.append(user(text))  # written while the file does not sync
        with Store(path) as other:
            enable(other)
        conn = first.db.conn

        def no_temp_triggers(action: int, *_: object) -> int:
            return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_CREATE_TEMP_TRIGGER else 0

        conn.set_authorizer(no_temp_triggers)
        with pytest.raises(sqlite3.DatabaseError):
            buf.append(user("never"))  # the first write since the other commit: not armed
        conn.set_authorizer(None)
        buf.append(user("2"))  # written after the last sync ...
        with Store(path, read_only=True) as reader:
            reader.backup(str(tmp_path / "copy.db"))  # ... and backed up (no commit here)
        buf.pop()
        with Store(tmp_path / "copy.db") as copy:
            sync(first, copy)
            kept = [m["content"] for m in copy.buffer("global", "", "k").read()]
    assert kept == ["0", "1"]

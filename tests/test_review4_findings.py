"""Review 4 of offline sync (incremental sync): each test is one confirmed finding of
a fresh-eyes review, failing before its fix. Real SQLite files, a real SIGKILLed
subprocess; no mocks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from flowdrop_local import Principal, Store, sync
from flowdrop_local.sync.schema import content_md5
from flowdrop_local.syncing import enable, replica_id

from .test_sync import OWNER, K, said, texts, user


def contents(store: Store, address: tuple[str, str, str]) -> list[object]:
    return [m.content for m in store.buffer(*address).messages()]


def test_a_buffer_deleted_and_made_again_with_the_same_summary_is_not_missed(
    tmp_path: Path,
) -> None:
    """A sync records a's buffer (row id, ``updated_at``, its one message's position
    and tally). a then deletes the buffer and makes it again with one other message:
    SQLite gives the new row the same row id, the first position and tally are the
    same, and ``updated_at`` can be the same millisecond (found by review with a
    burst of pops pushing ``updated_at`` ahead of the clock; set here directly, so
    the test does not depend on timing). Expected: the next sync sends the new
    message and deletes the old one on b. Before the fix (the summary without the
    last row's id) the incremental sync trusted the recorded digest and moved
    nothing."""
    x = ("global", "", "x")
    a = Store(str(tmp_path / "a.db"))
    a.buffer(*x).append(user("q0"))
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    sync(a, b)
    buf = a.buffer(*x)
    recorded = str(buf.info().updated_at)
    buf.delete()
    buf.append(user("made again"))
    with a.backend.write() as tx:  # the same millisecond as the recorded summary's
        tx.conn.execute("UPDATE buffers SET updated_at = ?", (recorded,))
    assert [m.position for m in buf.messages()] == [m.position for m in b.buffer(*x).messages()]
    sync(a, b)
    assert contents(b, x) == contents(a, x) == ["made again"]
    assert sync(a, b, full=True).moved == 0


def test_an_edit_of_the_received_version_is_not_reverted_by_a_stale_replica(
    tmp_path: Path,
) -> None:
    """Three replicas of a session. An admin edits message q on a (v1); a syncs b
    (b takes v1: a one-sided edit). An admin then edits q on b again (v2, an edit
    of v1: nothing concurrent). b syncs c (c takes v2). c syncs a: each side holds
    the version it held at its own last sync (a: v1, c: v2), so the one-sided rule
    does not apply and the lower fingerprint wins (v1, chosen lower here) with an
    'edit' conflict; the next a-b sync spreads v1 to b. Expected: v2, the last
    edit, everywhere and no conflict (v1 -> v2 is a sequential edit). Actual: v2 is
    reverted on every replica and recorded as a conflict."""
    owner, admin = Principal(OWNER), Principal("root", admin=True)
    a = Store(str(tmp_path / "a.db"))
    sid = a.sessions(owner).create("wf").id
    a.sessions(owner).drive(sid, [user("q"), said("answer")])
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    a.backup(str(tmp_path / "c.db"))
    b, c = Store(str(tmp_path / "b.db")), Store(str(tmp_path / "c.db"))
    (target,) = [m for m in a.sessions(owner).messages(sid) if m.content == "q"]
    v2 = "second edit"
    v1 = next(  # the stale version has the lower fingerprint: it would win a tie-break
        f"first edit {i}"
        for i in range(1000)
        if content_md5(f"first edit {i}", "{}", 0) < content_md5(v2, "{}", 0)
    )
    a.sessions(admin).update_message(target.id, v1)
    assert sync(a, b, "session").edited == 1
    b.sessions(admin).update_message(target.id, v2)
    assert sync(b, c, "session").edited == 1
    sync(c, a, "session")
    sync(a, b, "session")
    for store in (a, b, c):
        assert [m.content for m in store.sessions(owner).messages(sid)] == [v2, "answer"]


def test_a_backup_of_a_backup_never_brings_back_a_compacted_deletion(tmp_path: Path) -> None:
    """a is enabled and backed up to b; b and a sync everything; b is backed up to c
    (c is registered as b's peer, not a's). a pops "two" and syncs everything with b:
    b received the tombstone and a's only known peer is b, so a compacts it in that
    sync. c (still holding "two", never synced) syncs everything with a: a no longer
    knows "two" was deleted and takes it back; then a-b sends it to b too, although b
    still holds the tombstone for it (b keeps it for c). Expected: "two" stays
    deleted everywhere (a store holding a tombstone never takes the id back, or a
    does not compact while a peer of its peer may still hold it). Actual: "two" is
    back on a and b."""
    a = Store(str(tmp_path / "a.db"))
    a.buffer(*K).append([user("q"), said("one"), said("two")])
    enable(a)
    a.backup(str(tmp_path / "b.db"))
    b = Store(str(tmp_path / "b.db"))
    sync(a, b, "all")
    b.backup(str(tmp_path / "c.db"))
    c = Store(str(tmp_path / "c.db"))
    a.buffer(*K).pop()
    sync(a, b, "all")
    sync(c, a, "all")
    sync(a, b, "all")
    sync(b, c, "all")
    for store in (a, b, c):
        assert texts(store) == [("user", "q"), ("assistant", "one")]


def test_a_crash_between_the_two_commits_loses_no_later_tombstone(tmp_path: Path) -> None:
    """p, q and c are synced copies. q pops x1's "two". sync(p, q) is SIGKILLed
    after q committed and before p did (the sync commits the side that locked last
    first). q's committed high-water mark of p's tombstones counts the number p gave,
    inside the rolled-back transaction, to q's x1 tombstone; p, rolled back, gives
    that number again later. c pops x2's "two"; p syncs c (p takes c's tombstone, with
    the number q thinks it already has), then p syncs q: q skips it and sends x2's
    "two" back to p; a later p-c sync sends it to c, which holds its own tombstone
    for it. Expected: after a round of syncs x1 and x2 read [q, one] on all three.
    Actual: x2's "two", deleted on c, is back on p and c (and goes round)."""
    x1, x2 = ("global", "", "x1"), ("global", "", "x2")
    origin = Store(str(tmp_path / "o.db"))
    for address in (x1, x2):
        origin.buffer(*address).append([user("q"), said("one"), said("two")])
    enable(origin)
    for name in ("p", "q", "c"):
        origin.backup(str(tmp_path / f"{name}.db"))
    origin.close()
    p, q, c = (Store(str(tmp_path / f"{name}.db")) for name in "pqc")
    for x, y in [(p, q), (q, c), (p, c)]:
        sync(x, y, "all")
    # sync takes its locks in replica-id order and commits the last-locked side first
    first, last = sorted([p, q], key=lambda s: str(replica_id(s)))
    last.buffer(*x1).pop()
    first.close()
    last.close()
    code = textwrap.dedent(
        f"""
        import os, signal
        from flowdrop_local import Store, sync
        first, last = Store({first.path!r}), Store({last.path!r})
        def trace(sql):  # the first side's COMMIT: the other side has committed
            if sql.strip().upper() == "COMMIT":
                os.kill(os.getpid(), signal.SIGKILL)
        first.backend.connection().set_trace_callback(trace)
        sync(first, last, "all")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=120)
    assert done.returncode == -signal.SIGKILL
    first, last = Store(first.path), Store(last.path)
    assert contents(first, x1)[-1] == "two"  # rolled back
    assert contents(last, x1)[-1] == "one"  # committed
    c.buffer(*x2).pop()
    for x, y in [(first, c), (first, last), (last, c), (first, c), (first, last)]:
        sync(x, y, "all")
    for store in (first, last, c):
        assert store.check() == []
        assert contents(store, x1) == contents(store, x2) == ["q", "one"]


def test_a_result_replacing_a_placeholder_is_ordered_alike_on_every_replica(
    tmp_path: Path,
) -> None:
    """Found by test_sync.py::test_three_replicas_converge. Replica 2 declares call c0
    and says "ok"; 1 and 2 sync. 1 appends c0's real result (at its end, after "ok");
    2 appends two user turns (healing c0: a placeholder right after the call). 0 takes
    1's history. 1 and 2 sync: the real result replaces the placeholder. Before the
    fix the merge moved the result's row into the placeholder's slot (a new
    position), so 0 (holding it at its old position) and 1 disagreed on the order
    and merged to a history with the result after the user turns, while 2 kept it
    after the call. Now the placeholder's row takes the result's content in place
    (as an append does) and no row moves: all three read the same."""
    x = ("global", "", "x")
    first = Store(str(tmp_path / "0.db"))
    enable(first)
    first.backup(str(tmp_path / "1.db"))
    first.backup(str(tmp_path / "2.db"))
    one, two = Store(str(tmp_path / "1.db")), Store(str(tmp_path / "2.db"))
    two.buffer(*x).append(
        [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "name": "f"}]},
            said("ok"),
        ]
    )
    sync(one, two)
    one.buffer(*x).append({"role": "tool", "tool_call_id": "c0", "content": "real"})
    two.buffer(*x).append([user("hi"), user("again")])
    stores = [first, one, two]
    for i, j in [(0, 1), (1, 2), (0, 1)]:
        sync(stores[i], stores[j])
    expected = ["", "real", "ok", "hi", "again"]
    for store in stores:
        assert store.check() == []
        assert contents(store, x) == expected
    positions = {tuple(m.position for m in s.buffer(*x).messages()) for s in stores}
    assert len(positions) == 1

"""The async API: the sync API's results and errors, awaited, on both backends.

Each test runs its own event loop (``asyncio.run``): no plugin needed. ``target``
(conftest) is a SQLite file or a fresh PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from flowdrop_local import (
    AsyncStore,
    ExecutionContext,
    FlowdropError,
    InvalidAddress,
    InvalidArgument,
    InvalidMessage,
    InvalidValue,
    MessageIdTaken,
    MessageNotFound,
    ServerUnreachable,
    Store,
    StoreClosed,
    UnsupportedOperation,
)
from flowdrop_local.engine import new_message_id

log = logging.getLogger(__name__)

CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f"}]}
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather?"},
    CALL,
    {"role": "user", "content": "never mind"},  # heals c1
    {"role": "tool", "tool_call_id": "c1", "content": "rain"},  # replaces the placeholder
    {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},  # MEM-2: dropped
]


def _without_ids(result: Any) -> tuple[Any, ...]:
    return (
        result.count,
        result.appended,
        len(result.message_ids),
        len(result.healed_ids),
        len(result.replaced_ids),
        result.dropped,
        result.evicted,
    )


# ----------------------------------------------------------------- the same API


def test_every_call_gives_what_the_sync_api_gives(target: str) -> None:
    """The same operations on a sync and an async buffer of one store give equal results."""

    async def script(store: AsyncStore) -> dict[str, Any]:
        buf = store.buffer("session", "s1", "async", window=5)
        out: dict[str, Any] = {"appends": []}
        for message in HISTORY:
            out["appends"].append(_without_ids(await buf.append(message)))
        out["empty batch"] = _without_ids(await buf.append([]))
        last = (await buf.messages())[-1].id
        out["read"] = await buf.read()
        out["read 2"] = await buf.read(limit=2)
        out["read before"] = await buf.read(limit=2, before=last)
        out["messages"] = [(m.role, m.content, m.metadata) for m in await buf.messages(limit=3)]
        out["count"] = await buf.count()
        out["chat"] = await buf.to_openai_chat(limit=2)
        out["responses"] = await buf.to_openai_responses()
        out["anthropic"] = await buf.to_anthropic(limit=3)
        out["pop"] = await buf.pop()
        out["clear"] = await buf.clear()
        out["pop empty"] = await buf.pop()
        out["memory"] = [
            await store.memory_set(None, "global", "k", {"v": 1}),
            await store.memory_get(None, "global", "k"),
            await store.memory_delete(None, "global", "k"),
            await store.memory_get(None, "global", "k", "default"),
        ]
        return out

    def sync_script(store: Store) -> dict[str, Any]:
        buf = store.buffer("session", "s1", "sync", window=5)
        out: dict[str, Any] = {"appends": [_without_ids(buf.append(m)) for m in HISTORY]}
        out["empty batch"] = _without_ids(buf.append([]))
        last = buf.messages()[-1].id
        out["read"] = buf.read()
        out["read 2"] = buf.read(limit=2)
        out["read before"] = buf.read(limit=2, before=last)
        out["messages"] = [(m.role, m.content, m.metadata) for m in buf.messages(limit=3)]
        out["count"] = buf.count()
        out["chat"] = buf.to_openai_chat(limit=2)
        out["responses"] = buf.to_openai_responses()
        out["anthropic"] = buf.to_anthropic(limit=3)
        out["pop"] = buf.pop()
        out["clear"] = buf.clear()
        out["pop empty"] = buf.pop()
        out["memory"] = [
            store.memory_set(None, "global", "k", {"v": 1}),
            store.memory_get(None, "global", "k"),
            store.memory_delete(None, "global", "k"),
            store.memory_get(None, "global", "k", "default"),
        ]
        return out

    async def main() -> dict[str, Any]:
        async with AsyncStore(target) as store:
            return await script(store)

    got = asyncio.run(main())
    with Store(target) as store:
        expected = sync_script(store)
    assert got == expected
    assert got["appends"][3][3] == 1 and got["appends"][4][4] == 1  # healed, then replaced


def test_buffers_check_and_export_match_the_sync_store(target: str) -> None:
    """``buffers()``, ``check()`` and ``export()`` (both formats, one buffer) as the sync ones."""
    with Store(target) as store:
        store.buffer("session", "s1", "a").append(HISTORY)
        store.buffer("user", "u1", "b").append({"role": "user", "content": "hi"})
        store.memory_set(ExecutionContext(user_id="u1"), "user", "k", [1, 2])
        expected = (
            store.buffers(),
            store.check(),
            list(store.export()),
            list(store.export(full=True)),
            list(store.export(("user", "u1", "b"))),
        )

    async def main() -> tuple[Any, ...]:
        async with AsyncStore(target) as store:
            return (
                await store.buffers(),
                await store.check(),
                [r async for r in store.export()],
                [r async for r in store.export(full=True)],
                [r async for r in store.export(("user", "u1", "b"))],
            )

    assert asyncio.run(main()) == expected


def test_an_export_left_early_releases_its_snapshot(target: str) -> None:
    """Breaking out of ``async for`` ends the export; the store goes on working."""

    async def main() -> None:
        async with AsyncStore(target) as store:
            buf = store.buffer("session", "s1", "chat")
            await buf.append([{"role": "user", "content": str(i)} for i in range(600)])
            for _ in range(12):  # more than the pool's 8 connections, if any were kept
                records = store.export()
                async for _record in records:
                    break
                await records.aclose()  # type: ignore[attr-defined]
            assert await buf.count() == 600
            assert await store.check() == []

    asyncio.run(main())


def test_an_export_left_early_ends_its_snapshot_before_the_connection_goes_back(
    postgresql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``aclose()`` of an export left early ends its transaction (and cursor) itself
    before the connection returns to the pool: the pool finds it idle, never rolls
    it back, and no cleanup of the export runs later on a connection lent again."""

    async def main() -> None:
        async with AsyncStore(postgresql_url) as store:
            buf = store.buffer("session", "s1", "chat")
            await buf.append([{"role": "user", "content": str(i)} for i in range(600)])
            records = store.export()
            async for _record in records:
                break
            await records.aclose()  # type: ignore[attr-defined]
            assert await buf.count() == 600

    with caplog.at_level(logging.WARNING, logger="psycopg.pool"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"] == []


# ----------------------------------------------------------------------- errors

Call = Callable[[AsyncStore], Awaitable[Any]]


def _buf(store: AsyncStore) -> Any:
    return store.buffer("session", "s1", "chat")


async def _export(store: AsyncStore, address: Any) -> None:
    async for _ in store.export(address):
        pass


@pytest.mark.parametrize(
    ("call", "error", "what"),
    [
        (lambda s: _buf(s).append(42), InvalidMessage, "an int is not a message"),
        (lambda s: _buf(s).append({"role": "bot"}), InvalidMessage, "unknown role"),
        (lambda s: _buf(s).append({"role": "user", "id": "x"}), InvalidMessage, "a bad id"),
        (lambda s: _buf(s).read(limit=-1), InvalidArgument, "a negative limit"),
        (lambda s: _buf(s).read(before=5), InvalidArgument, "before not a string"),
        (lambda s: _buf(s).read(before=new_message_id()), MessageNotFound, "an unknown id"),
        (lambda s: _buf(s).messages(limit="3"), InvalidArgument, "a limit as text"),
        (lambda s: _buf(s).to_openai_chat(limit=-2), InvalidArgument, "a negative window"),
        (lambda s: _export(s, ("a",)), InvalidAddress, "an address of one part"),
        (lambda s: s.memory_set(None, "global", "k", {1, 2}), InvalidValue, "a set is no JSON"),
        (lambda s: s.memory_get(None, "global", " "), InvalidAddress, "a blank memory key"),
        (lambda s: s.memory_get(None, "nowhere", "k"), InvalidAddress, "an unknown scope"),
    ],
)
def test_bad_input_raises_what_the_sync_api_raises(
    target: str, call: Call, error: type[Exception], what: str
) -> None:
    """Each bad call gets the sync API's error type; nothing is written."""

    async def main() -> None:
        async with AsyncStore(target) as store:
            with pytest.raises(error):
                await call(store)
            assert await store.buffers() == [], what

    asyncio.run(main())


@pytest.mark.parametrize(
    ("address", "what"),
    [
        (("", "1", "k"), "a blank scope"),
        (("session", "1", " "), "a blank key"),
        (("session", "1", 5), "a key that is not a string"),
        (("User", "1", "k"), "a scope name in the wrong case"),
    ],
)
def test_a_bad_address_is_refused_at_the_call(target: str, address: Any, what: str) -> None:
    """``store.buffer`` checks the address at once, without I/O: InvalidAddress, as Store."""
    with Store(target) as sync, pytest.raises(InvalidAddress):
        sync.buffer(*address)

    async def main() -> None:
        async with AsyncStore(target) as store:
            with pytest.raises(InvalidAddress):
                store.buffer(*address)

    asyncio.run(main())
    assert what


def test_a_refused_identity_scope_drops_turns_without_io(target: str) -> None:
    """A ``user`` buffer without a user reads empty and reports ``count=0`` (MEM-7, MEM-14)."""

    async def main() -> None:
        async with AsyncStore(target) as store:
            buf = store.buffer_for(ExecutionContext(), "user", "notes")
            assert buf.refused
            result = await buf.append({"role": "user", "content": "hi"})
            assert (result.count, result.appended) == (0, 0)
            assert (await buf.read(), await buf.count(), await buf.pop()) == ([], 0, None)
            with pytest.raises(InvalidMessage):
                await buf.append({"role": "nobody"})
            assert await store.buffers() == []
            read = await store.memory_get(ExecutionContext(user_id="0"), "user", "k", "d")
            assert (read.value, read.found, read.resolved_scope_id) == ("d", False, "")

    asyncio.run(main())


def test_a_closed_or_unopened_store_raises_store_closed(target: str) -> None:
    """Before ``open`` and after ``close`` every call raises StoreClosed; close is idempotent."""

    async def main() -> None:
        store = AsyncStore(target)
        with pytest.raises(StoreClosed, match="not open yet"):
            store.buffer("session", "s1", "chat")
        await store
        buf = store.buffer("session", "s1", "chat")
        await buf.append({"role": "user", "content": "hi"})
        await store.close()
        await store.close()
        for call in (buf.count(), buf.append({"role": "user", "content": "x"}), store.check()):
            with pytest.raises(StoreClosed):
                await call
        with pytest.raises(StoreClosed):
            store.export()
        with pytest.raises(StoreClosed):
            await store.open()

    asyncio.run(main())
    with Store(target) as sync:
        assert sync.buffer("session", "s1", "chat").count() == 1


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"lock_warning_after": 0}, InvalidArgument),
        ({"lock_warning_after": "5"}, InvalidArgument),
    ],
)
def test_bad_options_are_refused_at_once(options: dict[str, Any], error: type[Exception]) -> None:
    """Options are checked by the constructor, as Store's are."""
    with pytest.raises(error):
        AsyncStore(":memory:", **options)


def test_sqlite_only_settings_on_postgresql_say_what_to_use(postgresql_url: str) -> None:
    """``durability=`` and ``read_only=`` on PostgreSQL: UnsupportedOperation, as Store."""

    async def main() -> None:
        for options in ({"durability": "full"}, {"read_only": True}):
            with pytest.raises(UnsupportedOperation):
                await AsyncStore(postgresql_url, **options)  # type: ignore[arg-type]

    asyncio.run(main())


def test_an_unreachable_server_is_a_typed_error_without_the_password() -> None:
    """ServerUnreachable (issue 21 D), and the password is nowhere in the message."""

    async def main() -> None:
        with pytest.raises(ServerUnreachable) as raised:
            await AsyncStore("postgresql://me:s3cret@127.0.0.1:1/db?connect_timeout=2")
        assert "s3cret" not in str(raised.value)

    asyncio.run(main())


def test_run_sync_reaches_the_rest_of_the_sync_api_on_the_worker(tmp_path: Any) -> None:
    """SQLite: ``run_sync`` runs sync-only work (sessions, backup) in turn with the calls."""

    async def main() -> None:
        async with AsyncStore(tmp_path / "chat.db") as store:
            await store.buffer("session", "s1", "chat").append({"role": "user", "content": "hi"})
            worker = await store.run_sync(lambda s: threading.current_thread().name)
            await store.run_sync(lambda s: s.backup(str(tmp_path / "copy.db")))
        assert worker.startswith("flowdrop-async-store")
        with Store(tmp_path / "copy.db") as copy:
            assert copy.buffer("session", "s1", "chat").count() == 1

    asyncio.run(main())


def test_run_sync_on_postgresql_is_unsupported(postgresql_url: str) -> None:
    async def main() -> None:
        async with AsyncStore(postgresql_url) as store:
            with pytest.raises(UnsupportedOperation):
                await store.run_sync(lambda s: None)

    asyncio.run(main())


# ---------------------------------------------------------- PostgreSQL specifics


def test_an_application_pool_is_used_and_left_open(postgresql_url: str) -> None:
    """An ``AsyncConnectionPool`` the application owns works, and stays open after close."""
    import psycopg_pool

    async def main() -> None:
        pool: Any = psycopg_pool.AsyncConnectionPool(
            postgresql_url, min_size=1, max_size=2, open=False, kwargs={"autocommit": True}
        )
        await pool.open()
        async with AsyncStore(pool) as store:
            assert repr(store) == "<AsyncStore 'a psycopg pool' (postgresql)>"
            await store.buffer("session", "s1", "chat").append({"role": "user", "content": "hi"})
        async with pool.connection() as conn:
            assert (await (await conn.execute("SELECT count(*) FROM messages")).fetchone()) == (1,)
        await pool.close()

    asyncio.run(main())


def test_a_pool_with_no_connection_free_is_a_typed_error(postgresql_url: str) -> None:
    """An export holds the pool's only connection: the next call says why it cannot start."""
    import psycopg_pool

    async def main() -> None:
        pool: Any = psycopg_pool.AsyncConnectionPool(
            postgresql_url, min_size=1, max_size=1, timeout=0.5, open=False,
            kwargs={"autocommit": True},
        )
        await pool.open()
        async with AsyncStore(pool) as store:
            await store.buffer("session", "s1", "chat").append({"role": "user", "content": "hi"})
            records = store.export()
            await records.__anext__()
            with pytest.raises(FlowdropError, match="no connection to a psycopg pool came free"):
                await store.buffer("session", "s1", "chat").count()
            await records.aclose()  # type: ignore[attr-defined]
            assert await store.buffer("session", "s1", "chat").count() == 1
        await pool.close()

    asyncio.run(main())


def test_an_append_waiting_for_its_buffer_warns_once_and_goes_on(
    postgresql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync writer holds the buffer's row lock: the async append warns, waits, then appends."""
    with Store(postgresql_url) as sync:
        sync.buffer("session", "s1", "chat").append({"role": "user", "content": "first"})
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with Store(postgresql_url) as sync, sync.backend.write() as tx:
            tx.one("lock_buffer", (1,))
            locked.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    locked.wait(10)

    async def main() -> Any:
        async with AsyncStore(postgresql_url, lock_warning_after=0.2) as store:
            task = asyncio.ensure_future(
                store.buffer("session", "s1", "chat").append({"role": "user", "content": "next"})
            )
            await asyncio.sleep(0.6)
            assert not task.done()  # MEM-12: it waits, it does not fail
            release.set()
            return await task

    with caplog.at_level(logging.WARNING, logger="flowdrop_local"):
        result = asyncio.run(main())
    holder.join()
    assert result.count == 2
    assert len([r for r in caplog.records if "still waiting" in r.getMessage()]) == 1


# ------------------------------------------------------------------ concurrency


async def _ticker(stop: asyncio.Event, lags: list[float]) -> None:
    """Sleeps 1 ms at a time and records how late it wakes: the loop's responsiveness."""
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - started - 0.001)


def _concurrent_appends(target: str, tasks: int, appends: int, buffers: int) -> dict[str, float]:
    async def worker(store: AsyncStore, n: int, answers: list[Any]) -> None:
        buf = store.buffer("session", f"s{n % buffers}", "chat")
        for i in range(appends):
            answers.append((n, i, await buf.append({"role": "user", "content": f"{n}:{i}"})))

    async def main() -> dict[str, float]:
        async with AsyncStore(target) as store:
            # A full collection of this process's heap (pytest, hypothesis, the Agents
            # SDK: whatever the suite imported) stops every thread for 40-70 ms, whatever
            # the loop runs. Freezing what exists keeps it out: the appends' own garbage
            # is still collected, and measured.
            gc.freeze()
            stop, lags = asyncio.Event(), []
            ticker = asyncio.ensure_future(_ticker(stop, lags))
            await asyncio.sleep(0.01)
            answers: list[Any] = []
            started = time.perf_counter()
            await asyncio.gather(*(worker(store, n, answers) for n in range(tasks)))
            elapsed = time.perf_counter() - started
            stop.set()
            await ticker
            gc.unfreeze()
            # Every call answered once, nothing lost, each buffer's turns in task order.
            assert sorted((n, i) for n, i, _ in answers) == [
                (n, i) for n in range(tasks) for i in range(appends)
            ]
            ids = [r.message_ids[0] for _, _, r in answers]
            assert len(set(ids)) == tasks * appends
            for b in range(buffers):
                rows = await store.buffer("session", f"s{b}", "chat").read()
                contents = [m["content"] for m in rows]
                assert len(contents) == tasks // buffers * appends
                for n in range(b, tasks, buffers):
                    mine = [c for c in contents if c.startswith(f"{n}:")]
                    assert mine == [f"{n}:{i}" for i in range(appends)]
            assert await store.check() == []
            return {"seconds": elapsed, "worst lag ms": max(lags) * 1000, "ticks": len(lags)}

    return asyncio.run(main())


def test_fifty_tasks_on_sqlite_lose_nothing_and_never_stall_the_loop(tmp_path: Any) -> None:
    """50 tasks x 100 appends on 10 buffers: all stored once; a 1 ms ticker is never 50 ms late.

    On a shared machine the OS may leave the whole process unscheduled for tens of
    milliseconds: up to three runs (each checked in full), and one must keep the
    ticker's worst lag under 50 ms. Normally the first does, at about 5 ms.
    """
    runs = []
    for attempt in range(3):
        figures = _concurrent_appends(str(tmp_path / f"chat{attempt}.db"), 50, 100, 10)
        runs.append(figures)
        if figures["worst lag ms"] < 50:
            break
    log.warning("sqlite 50x100 appends: %s", runs)
    assert runs[-1]["worst lag ms"] < 50, runs


def test_fifty_tasks_on_postgresql_lose_nothing(postgresql_url: str) -> None:
    """50 tasks x 20 appends on 10 buffers, natively async: all stored once, in task order."""
    figures = _concurrent_appends(postgresql_url, 50, 20, 10)
    log.warning("postgresql 50x20 appends: %s", figures)


def test_sqlite_calls_run_in_the_order_they_were_made(tmp_path: Any) -> None:
    """Tasks started one after another without awaiting: their appends land in that order."""

    async def main() -> list[str]:
        async with AsyncStore(tmp_path / "chat.db") as store:
            buf = store.buffer("session", "s1", "chat")
            calls = [buf.append({"role": "user", "content": str(i)}) for i in range(200)]
            tasks = [asyncio.ensure_future(call) for call in calls]
            await asyncio.gather(*tasks)
            return [m["content"] for m in await buf.read()]

    assert asyncio.run(main()) == [str(i) for i in range(200)]


# ------------------------------------------------------------------ cancellation


def _cancel_and_retry(target: str, turns: int, seed: int) -> dict[str, int]:
    """Each turn: start an append with ids, cancel it at a random point, retry it whole."""
    rng = random.Random(seed)

    async def main() -> dict[str, int]:
        outcomes = {"cancelled, not stored": 0, "cancelled, stored": 0, "finished": 0}
        async with AsyncStore(target) as store:
            buf = store.buffer("session", "s1", "chat")
            for turn in range(turns):
                batch = [
                    {"role": "user", "content": f"q{turn}", "id": new_message_id()},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"id": f"c{turn}"}],
                        "id": new_message_id(),
                    },
                ]
                task = asyncio.ensure_future(buf.append(batch))
                for _ in range(rng.randrange(6)):  # cancel after 0-5 trips round the loop
                    await asyncio.sleep(0)
                point = rng.random()
                if point < 0.4:
                    await asyncio.sleep(rng.uniform(0, 0.003))
                elif point < 0.55:
                    # Block the loop while the append runs: it can commit, but its answer
                    # cannot reach the task before the cancel does ("cancelled, stored"
                    # on a machine of any speed, where the worker thread commits it).
                    await asyncio.sleep(0)
                    time.sleep(0.05)
                task.cancel()
                try:
                    await task
                    outcomes["finished"] += 1
                except asyncio.CancelledError:
                    retry = await buf.append(batch)
                    key = "cancelled, stored" if retry.dropped == 2 else "cancelled, not stored"
                    assert retry.dropped in (0, 2)  # whole or absent, never half
                    outcomes[key] += 1
            # Each user turn once, each followed by its call (and its placeholder, healed by
            # the next turn): nothing twice, nothing lost.
            rows = await buf.read()
            users = [m["content"] for m in rows if m["role"] == "user"]
            assert users == [f"q{t}" for t in range(turns)]
            assert len(rows) == 3 * turns - 1
            assert await store.check() == []
            more = await buf.append({"role": "user", "content": "still usable"})
            assert more.appended == 1
        return outcomes

    return asyncio.run(main())


def test_a_cancelled_append_on_sqlite_is_whole_or_absent_and_a_retry_is_safe(
    tmp_path: Any,
) -> None:
    """300 appends cancelled at random points, each retried with its ids: every turn once."""
    outcomes = _cancel_and_retry(str(tmp_path / "chat.db"), 300, seed=12)
    log.warning("sqlite cancellation outcomes: %s", outcomes)
    assert outcomes["cancelled, stored"] and outcomes["cancelled, not stored"], outcomes


def test_a_cancelled_append_on_postgresql_is_whole_or_absent_and_a_retry_is_safe(
    postgresql_url: str,
) -> None:
    """150 appends cancelled at random points (mid-pipeline too), retried: every turn once."""
    outcomes = _cancel_and_retry(postgresql_url, 150, seed=12)
    log.warning("postgresql cancellation outcomes: %s", outcomes)
    assert outcomes["cancelled, not stored"], outcomes


def test_a_retry_after_a_lost_answer_with_an_id_of_another_buffer_is_refused(
    target: str,
) -> None:
    """Ids are store-wide: reusing one in another buffer is MessageIdTaken, nothing written."""

    async def main() -> None:
        async with AsyncStore(target) as store:
            taken = new_message_id()
            await store.buffer("session", "s1", "a").append(
                {"role": "user", "content": "x", "id": taken}
            )
            with pytest.raises(MessageIdTaken):
                await store.buffer("session", "s1", "b").append(
                    {"role": "user", "content": "y", "id": taken}
                )
            assert [b.key for b in await store.buffers()] == ["a"]

    asyncio.run(main())


# ------------------------------------------------------------------ docs


def test_readme_async_example_runs(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' "Async" code runs as written, against a file in a temporary folder."""
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    text = (docs / "async.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert match is not None
    monkeypatch.chdir(tmp_path)
    exec(compile(match.group(1), "docs/async.md", "exec"), {"__name__": "readme"})
    with Store(tmp_path / "chat.db") as store:
        assert store.memory_get(None, "global", "greeting").value == "hi"
        assert store.buffers() == []  # the example clears its buffer at the end

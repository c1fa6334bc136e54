"""AsyncBuffer is the whole Buffer, awaited: the same names, parameters and results.

The signature test reads both classes with ``inspect``: a public method added to
``Buffer`` without an async twin (or with other parameters) fails it, unless it is
one of the exclusions below, each with its reason. The behaviour tests run the
conversation methods (info, titles, metadata, delete, fork, ``messages(before=)``)
on both backends and compare them with the sync API on the same data, errors
included.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

from flowdrop_local import (
    AsyncBuffer,
    AsyncStore,
    Buffer,
    BufferInfo,
    ExecutionContext,
    Store,
)
from flowdrop_local.engine import new_message_id

# Public names of Buffer that AsyncBuffer does not have, and why.
EXCLUDED: dict[str, str] = {
    "backend": "the sync backend; an async handle reaches the database through its AsyncStore",
    "db": "the deprecated name of backend (one release)",
    "existing_id": "takes a sync transaction (Tx): a building block of the *_in variants",
    "forget_row": "the sync handle's cached row id, reset by the handles after a failed write",
}
# Name patterns excluded, and why.
EXCLUDED_SUFFIXES: dict[str, str] = {
    "_plan": "a plan builder: what the async twin drives on PostgreSQL, not an operation",
    "_in": "runs inside a caller's open sync transaction (Tx); async code has none to give",
}


def _public_names() -> set[str]:
    """Every public name of a Buffer: class members and instance attributes."""
    instance = Buffer(None, "session", "s", "k")  # type: ignore[arg-type]  # no I/O here
    return {name for name in {*dir(Buffer), *vars(instance)} if not name.startswith("_")}


def _excluded(name: str) -> bool:
    return name in EXCLUDED or any(name.endswith(suffix) for suffix in EXCLUDED_SUFFIXES)


def _as_async(annotation: Any) -> Any:
    """A sync result annotation as the twin's: a Buffer result is an AsyncBuffer."""
    return "AsyncBuffer" if annotation == "Buffer" else annotation


def test_the_exclusions_name_real_members() -> None:
    """Each exclusion still names something of Buffer (a stale one would hide nothing)."""
    names = _public_names()
    assert set(EXCLUDED) <= names
    for suffix in EXCLUDED_SUFFIXES:
        assert any(name.endswith(suffix) for name in names), suffix


def test_every_public_buffer_member_has_an_async_twin() -> None:
    """Same name; a method's twin is a coroutine function with an equal signature (the
    parameters' names, kinds, defaults and annotations; the result, ``Buffer`` read as
    ``AsyncBuffer``); an attribute or property is a property of the twin, no I/O."""
    missing, different, not_async, not_property = [], [], [], []
    for name in sorted(_public_names()):
        if _excluded(name):
            continue
        twin = inspect.getattr_static(AsyncBuffer, name, None)
        if twin is None:
            missing.append(name)
            continue
        original = inspect.getattr_static(Buffer, name, None)
        if not callable(original):  # a property, a class attribute or an instance one
            if not isinstance(twin, property):
                not_property.append(name)
            continue
        if not inspect.iscoroutinefunction(twin):
            not_async.append(name)  # every public Buffer method reads or writes
        sync_signature = inspect.signature(original)
        expected = sync_signature.replace(
            return_annotation=_as_async(sync_signature.return_annotation)
        )
        if inspect.signature(twin) != expected:
            different.append(f"{name}: {inspect.signature(twin)} != {expected}")
    assert missing == [], f"Buffer methods without an AsyncBuffer twin: {missing}"
    assert different == [], different
    assert not_async == [], f"twins that are not coroutine functions: {not_async}"
    assert not_property == [], f"attributes whose twin is no property: {not_property}"


def test_the_twins_cover_the_conversation_methods() -> None:
    """The check above sees the methods this issue added (it does not pass vacuously)."""
    names = _public_names()
    for name in ("info", "set_title", "update_metadata", "delete", "fork", "messages"):
        assert name in names and not _excluded(name)
        assert inspect.iscoroutinefunction(getattr(AsyncBuffer, name))
    assert "before" in inspect.signature(AsyncBuffer.messages).parameters


# ------------------------------------------------------------------ behaviour

HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    {"role": "assistant", "content": "it rains"},
    {"role": "user", "content": "thanks"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "name": "g"}]},
    {"role": "tool", "tool_call_id": "c2", "content": "done"},
]


def _info(info: BufferInfo) -> tuple[Any, ...]:
    """An info without its address and timestamps (two buffers written apart)."""
    assert isinstance(info, BufferInfo)
    return (info.title, info.metadata, info.count, info.created_at is None)


def _messages(messages: list[Any]) -> list[tuple[Any, ...]]:
    return [(m.position, m.role, m.content, m.metadata) for m in messages]


def _outcome(call: Callable[[], Any]) -> Any:
    """What a sync call gives: its result, or its error's type and text."""
    try:
        return ("ok", call())
    except Exception as error:
        return ("raised", type(error), str(error))


async def _outcome_async(call: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return ("ok", await call())
    except Exception as error:
        return ("raised", type(error), str(error))


def _sync_script(store: Store, key: str) -> dict[str, Any]:
    buf = store.buffer("session", "s1", key)
    out: dict[str, Any] = {"info empty": _info(buf.info())}
    buf.append(HISTORY)
    ids = [m.id for m in buf.messages()]
    out["info"] = _info(buf.info())
    out["before"] = _messages(buf.messages(before=ids[5]))
    out["before 2"] = _messages(buf.messages(2, before=ids[5]))
    out["before first"] = _messages(buf.messages(before=ids[0]))
    out["title"] = _info(buf.set_title("Weather"))
    out["title again"] = _info(buf.set_title(""))
    out["metadata"] = _info(buf.update_metadata({"a": 1, "b": [1, 2], "c": {"d": None}}))
    out["metadata merge"] = _info(buf.update_metadata({"a": None, "e": "é"}))
    out["metadata none"] = _info(buf.update_metadata({}))
    progress: list[tuple[int, int]] = []
    fork = buf.fork(
        at=ids[2], to=("session", "s1", f"{key}-fork"), progress=lambda *p: progress.append(p)
    )
    assert type(fork) is Buffer
    out["fork"] = (fork.address, fork.window, progress)
    out["fork read"] = fork.read()
    out["fork info"] = _info(fork.info())
    out["fork then append"] = fork.append({"role": "user", "content": "go on"}).count
    out["fork read after"] = fork.read()  # the unanswered call c1 was healed
    out["source after fork"] = _messages(buf.messages())
    out["delete fork"] = fork.delete()
    out["fork info after delete"] = _info(fork.info())
    out["delete"] = buf.delete()
    out["delete again"] = buf.delete()
    out["info after delete"] = _info(buf.info())
    out["append after delete"] = buf.append({"role": "user", "content": "again"}).count
    out["buffers"] = [ref.key for ref in store.buffers()]
    return out


async def _async_script(store: AsyncStore, key: str) -> dict[str, Any]:
    buf = store.buffer("session", "s1", key)
    out: dict[str, Any] = {"info empty": _info(await buf.info())}
    await buf.append(HISTORY)
    ids = [m.id for m in await buf.messages()]
    out["info"] = _info(await buf.info())
    out["before"] = _messages(await buf.messages(before=ids[5]))
    out["before 2"] = _messages(await buf.messages(2, before=ids[5]))
    out["before first"] = _messages(await buf.messages(before=ids[0]))
    out["title"] = _info(await buf.set_title("Weather"))
    out["title again"] = _info(await buf.set_title(""))
    out["metadata"] = _info(await buf.update_metadata({"a": 1, "b": [1, 2], "c": {"d": None}}))
    out["metadata merge"] = _info(await buf.update_metadata({"a": None, "e": "é"}))
    out["metadata none"] = _info(await buf.update_metadata({}))
    progress: list[tuple[int, int]] = []
    fork = await buf.fork(
        at=ids[2], to=("session", "s1", f"{key}-fork"), progress=lambda *p: progress.append(p)
    )
    assert type(fork) is AsyncBuffer
    out["fork"] = (fork.address, fork.window, progress)
    out["fork read"] = await fork.read()
    out["fork info"] = _info(await fork.info())
    out["fork then append"] = (await fork.append({"role": "user", "content": "go on"})).count
    out["fork read after"] = await fork.read()
    out["source after fork"] = _messages(await buf.messages())
    out["delete fork"] = await fork.delete()
    out["fork info after delete"] = _info(await fork.info())
    out["delete"] = await buf.delete()
    out["delete again"] = await buf.delete()
    out["info after delete"] = _info(await buf.info())
    out["append after delete"] = (await buf.append({"role": "user", "content": "again"})).count
    out["buffers"] = [ref.key for ref in await store.buffers()]
    return out


def test_conversation_methods_give_what_the_sync_api_gives(target: str) -> None:
    """The same script, sync and async, on one store: equal results at every step."""

    async def main() -> dict[str, Any]:
        async with AsyncStore(target) as store:
            return await _async_script(store, "k")

    got = asyncio.run(main())
    with Store(target) as store:
        store.buffer("session", "s1", "k").delete()  # the async run's buffer, out of the way
        expected = _sync_script(store, "k")
    assert got == expected
    assert len(got["fork read"]) == 3 and got["fork"][2] == [(3, 3)]
    assert got["fork read after"][3]["metadata"].get("healed") is True  # MEM-3 in the fork
    assert got["metadata merge"][1] == {"b": [1, 2], "c": {"d": None}, "e": "é"}


def test_async_results_equal_a_sync_read_of_the_same_buffer(target: str) -> None:
    """What the async methods return is what the sync API then reads, timestamps and all."""

    async def main() -> tuple[Any, ...]:
        async with AsyncStore(target) as store:
            buf = store.buffer("chat", "u1", "main")
            await buf.append(HISTORY)
            titled = await buf.set_title("Plans")
            changed = await buf.update_metadata({"pinned": True})
            last = (await buf.messages())[-1].id
            page = await buf.messages(3, before=last)
            info = await buf.info()
            fork = await buf.fork(at=last, to=("chat", "u1", "copy"))
            return titled, changed, page, info, await fork.info(), last

    titled, changed, page, info, fork_info, last = asyncio.run(main())
    with Store(target) as store:
        buf = store.buffer("chat", "u1", "main")
        assert info == buf.info() == changed
        assert attrs.evolve(titled, metadata={"pinned": True}) == changed
        assert page == buf.messages(3, before=last)
        assert fork_info == store.buffer("chat", "u1", "copy").info()
        assert fork_info.count == len(HISTORY) and fork_info.title == ""
        assert store.check() == []


LONE = "\ud800"
OTHER = ("session", "s1", "other")
UNKNOWN = new_message_id()  # an id no buffer holds


def _error_calls(buf: Any, ids: list[str]) -> list[tuple[str, Callable[[], Any]]]:
    """Bad calls, the same on a sync and an async buffer (the async ones give awaitables)."""
    return [
        ("title not text", lambda: buf.set_title(5)),
        ("title too long", lambda: buf.set_title("x" * 1001)),
        ("title with NUL", lambda: buf.set_title("a\x00b")),
        ("title lone surrogate", lambda: buf.set_title(LONE)),
        ("metadata not a mapping", lambda: buf.update_metadata([("a", 1)])),
        ("metadata key not text", lambda: buf.update_metadata({1: "a"})),
        ("metadata not JSON", lambda: buf.update_metadata({"a": {1, 2}})),
        ("metadata NaN", lambda: buf.update_metadata({"a": float("nan")})),
        ("metadata too large", lambda: buf.update_metadata({"a": "x" * 1_000_001})),
        ("messages before not text", lambda: buf.messages(before=5)),
        ("messages before unknown", lambda: buf.messages(before=UNKNOWN)),
        ("messages before not an id", lambda: buf.messages(before="nope")),
        ("messages bad limit", lambda: buf.messages(-1, before=ids[1])),
        ("fork at unknown", lambda: buf.fork(at=UNKNOWN, to=OTHER)),
        ("fork at not text", lambda: buf.fork(at=3, to=OTHER)),
        ("fork at lone surrogate", lambda: buf.fork(at=LONE, to=OTHER)),
        ("fork into itself", lambda: buf.fork(at=ids[0], to=buf.address)),
        ("fork into a non-empty buffer", lambda: buf.fork(at=ids[0], to=("session", "s1", "full"))),
        ("fork to a bad address", lambda: buf.fork(at=ids[0], to=("session", "s1"))),
        ("fork to a blank key", lambda: buf.fork(at=ids[0], to=("session", "s1", " "))),
        ("fork to a look-alike scope", lambda: buf.fork(at=ids[0], to=("User", "1", "k"))),
        ("fork to a key not text", lambda: buf.fork(at=ids[0], to=("session", "s1", 5))),
        ("fork to a refused scope", lambda: buf.fork(at=ids[0], to=("user", "", "k"))),
    ]


def test_bad_calls_raise_what_the_sync_api_raises_and_write_nothing(target: str) -> None:
    """Each bad call: the sync error's type and text; the database is left as it was."""
    with Store(target) as store:
        store.buffer("session", "s1", "full").append({"role": "user", "content": "taken"})
        buf = store.buffer("session", "s1", "k")
        buf.append(HISTORY[:3])
        ids = [m.id for m in buf.messages()]
        before = list(store.export(full=True))
        expected = [(what, _outcome(call)) for what, call in _error_calls(buf, ids)]
        assert list(store.export(full=True)) == before

    async def main() -> list[Any]:
        async with AsyncStore(target) as store:
            buf = store.buffer("session", "s1", "k")
            return [(what, await _outcome_async(call)) for what, call in _error_calls(buf, ids)]

    got = asyncio.run(main())
    assert got == expected
    assert all(outcome[0] == "raised" for _, outcome in expected), expected
    with Store(target) as store:
        assert list(store.export(full=True)) == before


def _refused_calls(buf: Any) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("info", lambda: buf.info()),
        ("title", lambda: buf.set_title("t")),
        ("bad title", lambda: buf.set_title(5)),
        ("metadata", lambda: buf.update_metadata({"a": 1})),
        ("delete", lambda: buf.delete()),
        ("fork", lambda: buf.fork(at=UNKNOWN, to=OTHER)),
        ("messages before", lambda: buf.messages(before=UNKNOWN)),
        ("count", lambda: buf.count()),
    ]


def test_a_refused_buffer_behaves_as_the_sync_one_without_io(target: str) -> None:
    """MEM-7: a refused identity scope's buffer has an empty info, drops titles and
    metadata, deletes nothing and has nothing to fork; as the sync one, unstored."""
    with Store(target) as store:
        store.buffer("user", "u1", "notes").append({"role": "user", "content": "mine"})
        refused = store.buffer_for(ExecutionContext(), "user", "notes")
        assert refused.refused
        expected = [(what, _outcome(call)) for what, call in _refused_calls(refused)]
        before = list(store.export(full=True))

    async def main() -> list[Any]:
        async with AsyncStore(target) as store:
            buf = store.buffer_for(ExecutionContext(), "user", "notes")
            assert buf.refused
            return [(what, await _outcome_async(call)) for what, call in _refused_calls(buf)]

    got = asyncio.run(main())
    assert got == expected
    assert dict(got)["delete"] == ("ok", 0)
    with Store(target) as store:
        assert list(store.export(full=True)) == before  # the user's own buffer untouched


def test_a_fork_holding_a_title_but_no_message_is_forked_into(target: str) -> None:
    """A target with a row but no message (a title) is no obstacle, sync or async."""

    async def main() -> tuple[BufferInfo, list[dict[str, Any]]]:
        async with AsyncStore(target) as store:
            src = store.buffer("session", "s1", "src")
            await src.append(HISTORY[:2])
            await store.buffer("session", "s1", "named").set_title("kept")
            at = (await src.messages())[-1].id
            fork = await src.fork(at=at, to=("session", "s1", "named"))
            return await fork.info(), await fork.read()

    info, rows = asyncio.run(main())
    with Store(target) as store:
        src = store.buffer("session", "s1", "src2")
        src.append(HISTORY[:2])
        store.buffer("session", "s1", "named2").set_title("kept")
        fork = src.fork(at=src.messages()[-1].id, to=("session", "s1", "named2"))
        assert _info(info) == _info(fork.info()) and info.title == "kept"
        assert rows == fork.read()


def test_a_failed_append_forgets_the_row_then_the_handle_still_works(target: str) -> None:
    """After an append that fails in its transaction (an id of another buffer), the async
    handle looks its row up again (``forget_row``); deleting and appending go on."""
    from flowdrop_local import MessageIdTaken

    async def main() -> tuple[int, int, BufferInfo]:
        async with AsyncStore(target) as store:
            one, two = store.buffer("session", "s1", "one"), store.buffer("session", "s1", "two")
            taken = new_message_id()
            await one.append({"role": "user", "content": "a", "id": taken})
            await two.set_title("two")
            await two.delete()  # the row goes; the handle's hint is dropped with it
            with pytest.raises(MessageIdTaken):
                await two.append({"role": "user", "content": "b", "id": taken})
            count = (await two.append({"role": "user", "content": "c"})).count
            deleted = await two.delete()
            return count, deleted, await two.info()

    count, deleted, info = asyncio.run(main())
    assert (count, deleted, info) == (1, 1, BufferInfo("session", "s1", "two"))

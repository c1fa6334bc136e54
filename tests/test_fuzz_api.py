"""Hostile arguments to every public library function and method (issue 10 B).

Each example picks one public callable (Store, Buffer, Sessions, memory, the
providers' exporters and validators, positions, the rule helpers) and calls it
with arguments drawn from wrong types, huge ints, lone surrogates, NUL, deep and
strange structures, mixed with a few real ids so that some calls reach real rows.
The only exception allowed out is a FlowdropError, and a call that raises one
leaves every table as it was. A call that is accepted leaves a file that passes
``check()``. Import, export and backup are fuzzed by their own helper's tests.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowdrop_local as fl
from flowdrop_local import (
    ExecutionContext,
    FlowdropError,
    Message,
    Principal,
    Store,
    access,
    positions,
    providers,
    rules,
)
from flowdrop_local.viewer.catalog import Catalog

from .conftest import snapshot


class Huge(int):
    """An int whose str() and repr() raise ValueError (too many digits), as 10**5000's do;
    only Hypothesis's pretty-printer gets a short spelling, for its failure report."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"Huge({'-' if self < 0 else ''}10**5000)")


HUGE = Huge(10**5000)


class Hostile:
    """An object whose comparison, hashing, truth and repr all raise."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __hash__(self) -> int:
        raise RuntimeError("hash")

    def __bool__(self) -> bool:
        raise RuntimeError("bool")

    def __repr__(self) -> str:
        raise RuntimeError("repr")

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("Hostile()")


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


# Module-level, built once: two distinct but equal deep values (comparing them recurses).
DEEP_A, DEEP_B = _deep(3_000), _deep(3_000)
REAL: dict[str, str] = {}  # filled by the fixture: a real session id and message id

SPECIALS: list[Any] = [
    HUGE,
    Huge(-HUGE),
    2**63,
    -(2**63) - 1,
    2**64,
    -1,
    0,
    float("nan"),
    float("inf"),
    "",
    " ",
    "\x00",
    "\ud800",
    "a\udfffb",
    "user\u200b",
    "u\u0455er",
    "global",
    "user",
    "session",
    "workflow",
    "chat",
    "a0",
    "Zz",
    "\U0001f600",
    b"bytes",
    bytearray(b"x"),
    DEEP_A,
    {"d": DEEP_B},
    {"role": "user", "content": DEEP_A, "metadata": {"content": DEEP_B}},
    {"role": "tool", "tool_call_id": DEEP_A, "metadata": {"tool_call_id": DEEP_B}},
    Hostile(),
    object(),
    ExecutionContext(user_id="alice"),
    ExecutionContext(user_id=0),
    Principal("alice"),
    Principal(None, admin=True),
    Message("m", "a0", "user", "hi", {}, "2024-01-01T00:00:00.000Z"),
    {"role": "user", "content": "hi"},
    {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "r"},
    [{"role": "user", "content": "hi"}],
]


def _special(index: int) -> Any:
    return SPECIALS[index]


SPECIAL = st.integers(0, len(SPECIALS) - 1).map(_special)  # no repr of the values
REAL_IDS = st.sampled_from(["session", "message"]).map(lambda which: REAL.get(which, ""))
scalars = st.one_of(
    SPECIAL,
    REAL_IDS,
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12),
    st.binary(max_size=6),
)
hostile = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), children, max_size=3),
        st.dictionaries(
            st.sampled_from(["role", "content", "metadata", "tool_calls", "tool_call_id", "type"]),
            children,
            max_size=4,
        ),
        st.frozensets(st.integers(), max_size=2),
    ),
    max_leaves=8,
)

Target = Callable[[Store, list[Any]], object]
ADMIN = Principal("root", admin=True)


def _hook_round_trip(store: Store, a: list[Any]) -> None:
    store.add_access_hook(a[0])
    store.remove_access_hook(a[0])


def _aio(store: Store, call: Callable[[fl.AsyncStore], Any], **options: Any) -> object:
    """Run ``call`` on an AsyncStore of the same file, on an event loop of its own."""

    async def main() -> object:
        async with fl.AsyncStore(store.path, **options) as async_store:
            return await call(async_store)

    return asyncio.run(main())


# name -> (number of hostile arguments, the call, whether it may write).
TARGETS: dict[str, tuple[int, Target, bool]] = {
    # Store
    "Store.buffer": (4, lambda s, a: s.buffer(a[0], a[1], a[2], window=a[3]).read(), False),
    "Store.buffer_for": (4, lambda s, a: s.buffer_for(a[0], a[1], a[2], window=a[3]).read(), False),
    "Store.memory_get": (4, lambda s, a: s.memory_get(a[0], a[1], a[2], a[3]), False),
    "Store.memory_set": (4, lambda s, a: s.memory_set(a[0], a[1], a[2], a[3]), True),
    "Store.memory_delete": (3, lambda s, a: s.memory_delete(a[0], a[1], a[2]), True),
    "Store.sessions": (1, lambda s, a: s.sessions(a[0]).list(), False),
    "Store.access_hooks": (1, _hook_round_trip, False),
    "Store.buffers": (0, lambda s, a: s.buffers(), False),
    "Store.check": (0, lambda s, a: s.check(), False),
    # Buffer
    "Buffer.read": (2, lambda s, a: s.buffer("s", "", "k").read(a[0], before=a[1]), False),
    "Buffer.messages": (1, lambda s, a: s.buffer("s", "", "k").messages(a[0]), False),
    "Buffer.append": (2, lambda s, a: s.buffer("s", "", "k", window=a[1]).append(a[0]), True),
    "Buffer.to_openai_chat": (1, lambda s, a: s.buffer("s", "", "k").to_openai_chat(a[0]), False),
    "Buffer.to_openai_responses": (
        1,
        lambda s, a: s.buffer("s", "", "k").to_openai_responses(a[0]),
        False,
    ),
    "Buffer.to_anthropic": (1, lambda s, a: s.buffer("s", "", "k").to_anthropic(a[0]), False),
    "Buffer(user).append": (2, lambda s, a: s.buffer("user", a[1], "k").append(a[0]), True),
    # Sessions, as an admin (reaches every row) and as alice
    "Sessions.create": (
        4,
        lambda s, a: s.sessions(ADMIN).create(a[0], name=a[1], metadata=a[2], owner=a[3]),
        True,
    ),
    "Sessions.get": (1, lambda s, a: s.sessions(Principal("alice")).get(a[0]), False),
    "Sessions.list": (1, lambda s, a: s.sessions(ADMIN).list(workflow_id=a[0]), False),
    "Sessions.read": (
        3,
        lambda s, a: s.sessions(ADMIN).read(a[0], a[1], conversation=a[2]),
        False,
    ),
    "Sessions.messages": (
        3,
        lambda s, a: s.sessions(Principal("alice")).messages(a[0], a[1], conversation=a[2]),
        False,
    ),
    "Sessions.drive": (2, lambda s, a: s.sessions(ADMIN).drive(a[0], a[1]), True),
    "Sessions.context": (1, lambda s, a: s.sessions(ADMIN).context(a[0]), False),
    "Sessions.stop": (1, lambda s, a: s.sessions(Principal("bob")).stop(a[0]), True),
    "Sessions.reset": (1, lambda s, a: s.sessions(Principal("bob")).reset(a[0]), True),
    "Sessions.grant": (2, lambda s, a: s.sessions(ADMIN).grant(a[0], a[1]), True),
    "Sessions.revoke": (2, lambda s, a: s.sessions(Principal("alice")).revoke(a[0], a[1]), True),
    "Sessions.viewers": (1, lambda s, a: s.sessions(ADMIN).viewers(a[0]), False),
    "Sessions.update_message": (2, lambda s, a: s.sessions(ADMIN).update_message(a[0], a[1]), True),
    "Sessions.delete_message": (
        1,
        lambda s, a: s.sessions(Principal("bob")).delete_message(a[0]),
        True,
    ),
    # The async API (on SQLite the worker runs the sync methods: these reach what runs
    # on the event loop's side, and the round trip)
    "AsyncStore": (
        2,
        lambda s, a: _aio(s, lambda st: st.buffers(), lock_warning_after=a[0], durability=a[1]),
        False,
    ),
    "AsyncStore.buffer": (
        4,
        lambda s, a: _aio(s, lambda st: st.buffer(a[0], a[1], a[2], window=a[3]).read()),
        False,
    ),
    "AsyncBuffer.append": (
        2,
        lambda s, a: _aio(s, lambda st: st.buffer("s", "", "k", window=a[1]).append(a[0])),
        True,
    ),
    "AsyncBuffer.read": (
        2,
        lambda s, a: _aio(s, lambda st: st.buffer("s", "", "k").read(a[0], before=a[1])),
        False,
    ),
    # Identity, contexts, principals
    "Principal": (2, lambda s, a: Principal(a[0], admin=a[1]).identity, False),
    "ExecutionContext": (2, lambda s, a: ExecutionContext(user_id=a[0], node_id=a[1]), False),
    "ExecutionContext.from_dict": (1, lambda s, a: ExecutionContext.from_dict(a[0]), False),
    "resolve_scope": (2, lambda s, a: access.resolve_scope(a[0], a[1]), False),
    "usable_identity": (1, lambda s, a: access.usable_identity(a[0]), False),
}

# Pure functions outside this change's files that still let a built-in error out for
# hostile input (found by this test; for example to_anthropic(5) -> TypeError,
# key_between(10**5000, None) -> ValueError from repr, text_to_message(10**5000) ->
# ValueError, normalize(5) -> TypeError). Their owners move them into TARGETS once
# fixed; the coverage test below counts them as known.
NOT_YET_TYPED: dict[str, tuple[int, Target, bool]] = {
    # Providers: exporters, importers, validators
    "to_openai_chat": (2, lambda s, a: providers.to_openai_chat(a[0], limit=a[1]), False),
    "to_openai_responses": (2, lambda s, a: providers.to_openai_responses(a[0], limit=a[1]), False),
    "to_anthropic": (2, lambda s, a: providers.to_anthropic(a[0], limit=a[1]), False),
    "from_openai_chat": (1, lambda s, a: providers.from_openai_chat(a[0]), False),
    "from_anthropic": (1, lambda s, a: providers.from_anthropic(a[0]), False),
    "validate_openai_chat": (1, lambda s, a: providers.validate_openai_chat(a[0]), False),
    "validate_openai_responses": (1, lambda s, a: providers.validate_openai_responses(a[0]), False),
    "validate_anthropic": (1, lambda s, a: providers.validate_anthropic(a[0]), False),
    # Positions and the pure rules
    "key_between": (2, lambda s, a: positions.key_between(a[0], a[1]), False),
    "keys_between": (3, lambda s, a: positions.keys_between(a[0], a[1], a[2]), False),
    "normalize": (1, lambda s, a: rules.normalize(a[0]), False),
    "validate_pairing": (1, lambda s, a: rules.validate_pairing(a[0]), False),
    "assemble": (2, lambda s, a: rules.assemble(a[0], a[1]), False),
    "text_to_message": (1, lambda s, a: rules.text_to_message(a[0]), False),
    "call_id_of": (1, lambda s, a: rules.call_id_of(a[0]), False),
    "last_turns": (2, lambda s, a: providers.last_turns(a[0], a[1]), False),
    "read_last_turns": (2, lambda s, a: providers.read_last_turns(lambda n: a[0], a[1]), False),
    "item_to_message": (1, lambda s, a: providers.item_to_message(a[0]), False),
    "message_to_items": (1, lambda s, a: providers.message_to_items(a[0]), False),
    "is_valid_key": (1, lambda s, a: positions.is_valid_key(a[0]), False),
    "validate_key": (1, lambda s, a: positions.validate_key(a[0]), False),
}


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A file with a session (alice owns it, bob views it), a turn, a pending call, memory."""
    path = tmp_path_factory.mktemp("fuzz-api") / "api.db"
    with Store(path) as store:
        alice = store.sessions(Principal("alice"))
        session = alice.create("wf")
        alice.grant(session.id, "bob")
        turn = alice.drive(
            session.id,
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "name": "f"}]},
            ],
        )
        store.buffer("s", "", "k").append({"role": "user", "content": "hello"})
        store.memory_set(None, "global", "k", {"v": 1})
        REAL["session"], REAL["message"] = session.id, turn.result.message_ids[0]
    yield path
    REAL.clear()


SPENT: list[float] = []


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(name=st.sampled_from(sorted(TARGETS)), data=st.data())
def test_hostile_arguments_raise_only_typed_errors(fuzz_path: Path, name: str, data: Any) -> None:
    """Any arguments to any public callable: a FlowdropError with no change, or a sound file."""
    started = time.monotonic()
    arity, call, writes = TARGETS[name]
    args = [data.draw(hostile, label=f"arg{i}") for i in range(arity)]
    with Store(fuzz_path) as store:
        before = snapshot(fuzz_path)
        try:
            call(store, args)
        except FlowdropError:
            assert snapshot(fuzz_path) == before, name
        else:
            if writes:
                assert store.check() == [], name
            else:
                assert snapshot(fuzz_path) == before, name
    SPENT.append(time.monotonic() - started)


def test_the_fuzz_reaches_every_public_callable() -> None:
    """Every name exported by flowdrop_local, or by its public modules of rules,
    providers, scopes and keys, that can be called is fuzzed (or left to the
    import/export helper), so a new public function cannot slip past."""
    fuzzed = {name.split(".")[0].split("(")[0] for name in TARGETS}
    # import/export/backup: fuzzed by the portability tests; sync's bad input (scopes,
    # stores) by test_sync.py::test_bad_scopes_are_refused.
    elsewhere = {"Store", "sync"}
    records = {  # records and errors: built by the library, not called with user input
        "AccessDenied",
        "AccessRequest",
        "AppendResult",
        "BufferInfo",
        "BufferRef",
        "ImportReport",
        "MemoryRead",
        "MemoryWrite",
        "Message",
        "Page",
        "RefusedBuffer",
        "ScopeResolution",
        "SearchHit",
        "Session",
        "SyncReport",
        "Turn",
        "ToolCall",
        "Violation",
    }
    callables = {
        name
        for module in (fl, rules, providers, access, positions)
        for name in module.__all__
        if callable(getattr(module, name))
        and not (
            isinstance(getattr(module, name), type) and issubclass(getattr(module, name), Exception)
        )
    }
    not_yet = set(NOT_YET_TYPED)
    assert callables - fuzzed - not_yet - elsewhere - records == set()


# ------------------------------------------------------------- input classes (issue 21 D)
# Each class of input goes to every place that takes it, one call per case, so a new
# escape names its call: a lone surrogate everywhere a string goes, a huge or unusual
# number everywhere a number goes, and rows a damaged file holds under every read.

SURROGATE = "x\ud800y"


def _backup(store: Store, target: str) -> None:
    store.backup(target)


async def _async_memory(store: fl.AsyncStore, key: str, value: object) -> object:
    return await store.memory_set(None, "global", key, value)


# name -> call(store, value): every parameter that takes text.
TEXT_PLACES: dict[str, Callable[[Store, Any], object]] = {
    "Store(path)": lambda s, v: Store(Path(s.path).parent / f"{v}.db").close(),
    "Store(path, create=False)": lambda s, v: Store(f"{v}.db", create=False),
    "Store(path, read_only)": lambda s, v: Store(f"{v}.db", read_only=True),
    "AsyncStore(path)": lambda s, v: _aio_at(f"{v}.db", lambda st: st.buffers()),
    "Store.backup": lambda s, v: _backup(s, str(Path(s.path).parent / f"{v}.db")),
    "Store.buffer scope": lambda s, v: s.buffer(v, "", "k").read(),
    "Store.buffer scope_id": lambda s, v: s.buffer("s", v, "k").append({"role": "user"}),
    "Store.buffer key": lambda s, v: s.buffer("s", "", v).read(),
    "Store.buffer user id": lambda s, v: s.buffer("user", v, "k").read(),
    "Store.buffer_for scope": lambda s, v: s.buffer_for(None, v, "k").read(),
    "Store.buffer_for key": lambda s, v: s.buffer_for(None, "global", v).read(),
    "ExecutionContext user_id": lambda s, v: s.buffer_for(
        ExecutionContext(user_id=v), "user", "k"
    ).read(),
    "Store.memory_set key": lambda s, v: s.memory_set(None, "global", v, 1),
    "Store.memory_set value": lambda s, v: s.memory_set(None, "global", "k", v),
    "Store.memory_set nested value": lambda s, v: s.memory_set(None, "global", "k", {v: [v]}),
    "Store.memory_get key": lambda s, v: s.memory_get(None, "global", v),
    "Store.memory_delete key": lambda s, v: s.memory_delete(None, "global", v),
    "Store.conversations scope": lambda s, v: s.conversations(scope=v),
    "Store.conversations scope_id": lambda s, v: s.conversations(scope="s", scope_id=v),
    "Store.conversations after": lambda s, v: s.conversations(after=v),
    "Store.search query": lambda s, v: s.search(v),
    "Store.search scope": lambda s, v: s.search("hello", scope=v),
    "Store.search key": lambda s, v: s.search("hello", key=v),
    "Store.export address": lambda s, v: list(s.export(("s", v, "k"))),
    "Store.import_jsonl line": lambda s, v: s.import_jsonl(
        ['{"scope": "t", "scope_id": "' + v + '", "key": "k", "role": "user", "content": "x"}']
    ),
    "Store.import_records scope_id": lambda s, v: s.import_records(
        [{"scope": "t", "scope_id": v, "key": "k", "role": "user", "content": "x"}]
    ),
    "Buffer.read before": lambda s, v: s.buffer("s", "", "k").read(before=v),
    "Buffer.messages before": lambda s, v: s.buffer("s", "", "k").messages(before=v),
    "Buffer.append content": lambda s, v: s.buffer("s", "", "k").append(
        {"role": "user", "content": v}
    ),
    "Buffer.append metadata": lambda s, v: s.buffer("s", "", "k").append(
        {"role": "user", "content": "x", "metadata": {v: v}}
    ),
    "Buffer.append id": lambda s, v: s.buffer("s", "", "k").append(
        {"role": "user", "content": "x", "id": v}
    ),
    "Buffer.set_title": lambda s, v: s.buffer("s", "", "k").set_title(v),
    "Buffer.update_metadata": lambda s, v: s.buffer("s", "", "k").update_metadata({v: v}),
    "Buffer.fork at": lambda s, v: s.buffer("s", "", "k").fork(at=v, to=("s", "", "fork")),
    "Buffer.fork to": lambda s, v: s.buffer("s", "", "k").fork(
        at=s.buffer("s", "", "k").messages()[0].id, to=("s", v, "fork")
    ),
    "Sessions.create workflow": lambda s, v: s.sessions(ADMIN).create(v),
    "Sessions.create name": lambda s, v: s.sessions(ADMIN).create("wf", name=v),
    "Sessions.create metadata": lambda s, v: s.sessions(ADMIN).create("wf", metadata={v: v}),
    "Sessions.create owner": lambda s, v: s.sessions(ADMIN).create("wf", owner=v),
    "Sessions.get": lambda s, v: s.sessions(ADMIN).get(v),
    "Sessions.list workflow": lambda s, v: s.sessions(ADMIN).list(workflow_id=v),
    "Sessions.grant viewer": lambda s, v: s.sessions(ADMIN).grant(REAL["session"], v),
    "Sessions.drive content": lambda s, v: s.sessions(ADMIN).drive(
        REAL["session"], {"role": "user", "content": v}
    ),
    "Sessions.update_message": lambda s, v: s.sessions(ADMIN).update_message(REAL["message"], v),
    "Sessions.delete_message": lambda s, v: s.sessions(ADMIN).delete_message(v),
    "Principal user_id": lambda s, v: s.sessions(Principal(v)).list(),
    "AsyncStore.memory_set key": lambda s, v: _aio(s, lambda st: _async_memory(st, v, 1)),
    "AsyncStore.buffer key": lambda s, v: _aio(s, lambda st: st.buffer("s", "", v).read()),
}


def _aio_at(path: str, call: Callable[[fl.AsyncStore], Any], **options: Any) -> object:
    async def main() -> object:
        async with fl.AsyncStore(path, **options) as async_store:
            return await call(async_store)

    return asyncio.run(main())


def _typed_or_sound(
    store: Store,
    path: Path,
    call: Callable[[], object],
    writes: bool,
    snap: Callable[[Path], object] = snapshot,
) -> None:
    """The contract of every case: a FlowdropError and no change, or a sound file."""
    before = snap(path)
    try:
        call()
    except FlowdropError:
        assert snap(path) == before
    else:
        if writes:
            assert store.check() == []


@pytest.mark.parametrize("name", sorted(TEXT_PLACES))
def test_a_lone_surrogate_anywhere_text_goes_is_a_typed_error(
    fuzz_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """``"x\\ud800y"`` (an undecodable byte in a path or argv, say) in each text parameter."""
    monkeypatch.chdir(tmp_path)  # relative paths land in the test's own folder
    with Store(fuzz_path) as store:
        _typed_or_sound(store, fuzz_path, lambda: TEXT_PLACES[name](store, SURROGATE), True)


NUMBERS: list[Any] = [HUGE, Huge(-HUGE), 10**400, 2**63, -(2**63) - 1, 1e308, float("inf"), 0]

# name -> call(store, value): every parameter that takes a number.
NUMBER_PLACES: dict[str, Callable[[Store, Any], object]] = {
    "Store lock_warning_after": lambda s, v: Store(s.path, lock_warning_after=v).close(),
    "Store lock_timeout": lambda s, v: Store(s.path, lock_timeout=v).close(),
    "AsyncStore lock_warning_after": lambda s, v: _aio(
        s, lambda st: st.buffers(), lock_warning_after=v
    ),
    "AsyncStore lock_timeout": lambda s, v: _aio(s, lambda st: st.buffers(), lock_timeout=v),
    "Store.buffer window": lambda s, v: s.buffer("s", "", "k", window=v).read(),
    "Buffer.read limit": lambda s, v: s.buffer("s", "", "k").read(v),
    "Buffer.messages limit": lambda s, v: s.buffer("s", "", "k").messages(v),
    "Buffer.to_openai_chat limit": lambda s, v: s.buffer("s", "", "k").to_openai_chat(v),
    "Store.conversations limit": lambda s, v: s.conversations(limit=v),
    "Store.search limit": lambda s, v: s.search("hello", limit=v),
    "Store.memory_set value": lambda s, v: s.memory_set(None, "global", "k", v),
    "Buffer.append metadata": lambda s, v: s.buffer("s", "", "k").append(
        {"role": "user", "content": "x", "metadata": {"n": v}}
    ),
    "Buffer.update_metadata": lambda s, v: s.buffer("s", "", "k").update_metadata({"n": v}),
    "Sessions.read limit": lambda s, v: s.sessions(ADMIN).read(REAL["session"], v),
    "Sessions.read conversation": lambda s, v: s.sessions(ADMIN).read(
        REAL["session"], conversation=v
    ),
    "Sessions.delete_conversation": lambda s, v: s.sessions(ADMIN).delete_conversation(
        REAL["session"], conversation=v
    ),
    "Sessions.create owner": lambda s, v: s.sessions(ADMIN).create("wf", owner=v),
    "Sessions.create metadata": lambda s, v: s.sessions(ADMIN).create("wf", metadata={"n": v}),
    "ExecutionContext user_id": lambda s, v: s.buffer_for(
        ExecutionContext(user_id=v), "user", "k"
    ).read(),
}


@pytest.fixture(scope="module")
def searchable_path(fuzz_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fuzz file with its search index (so a search reaches its limit)."""
    path = tmp_path_factory.mktemp("searchable") / "api.db"
    with Store(fuzz_path) as store:
        store.backup(path)
    with Store(path) as store:
        store.enable_search()
    return path


@pytest.mark.parametrize("name", sorted(NUMBER_PLACES))
def test_a_huge_number_anywhere_a_number_goes_is_a_typed_error(
    searchable_path: Path, name: str
) -> None:
    """``10**5000``, ``2**63``, ``1e308``, ``inf``, ``0`` in each numeric parameter."""
    for value in NUMBERS:
        with Store(searchable_path) as store:
            _typed_or_sound(
                store, searchable_path, functools.partial(NUMBER_PLACES[name], store, value), True
            )


# A damaged file: each JSON column of each table, in turn, holds text that is not
# JSON (written with the CHECKs off, as another program could). Every read of it is
# then a typed error naming the row (or a finding of check()), never a JSONDecodeError.
DAMAGE: dict[str, str] = {
    "message content": "UPDATE messages SET content = '{bad', content_parts = 1",
    "buffer metadata": "UPDATE buffers SET metadata = '{bad'",
    "session metadata": "UPDATE sessions SET metadata = '{bad'",
    "memory value": "UPDATE memory SET value = '{bad'",
    # TEXT that is not UTF-8 (Python's sqlite3 cannot decode it) in each kind of
    # column a read returns, and a buffer stamp that is not a time (issue 21 review, F3, F4)
    "buffer key not UTF-8": "UPDATE buffers SET key = CAST(X'80ff' AS TEXT)",
    "buffer title not UTF-8": "UPDATE buffers SET title = CAST(X'80ff' AS TEXT)",
    "buffer updated_at not UTF-8": "UPDATE buffers SET updated_at = CAST(X'80ff' AS TEXT)",
    "session name not UTF-8": "UPDATE sessions SET name = CAST(X'80ff' AS TEXT)",
    "session owner not UTF-8": "UPDATE sessions SET owner_id = CAST(X'80ff' AS TEXT)",
    "buffer updated_at not a time": "UPDATE buffers SET updated_at = 'not a time'",
}

READS: dict[str, Callable[[Store], object]] = {
    "Buffer.read": lambda s: s.buffer("s", "", "k").read(),
    "Buffer.messages": lambda s: s.buffer("s", "", "k").messages(),
    "Buffer.info": lambda s: s.buffer("s", "", "k").info(),
    "Buffer.to_openai_chat": lambda s: s.buffer("s", "", "k").to_openai_chat(),
    "Buffer.to_anthropic": lambda s: s.buffer("s", "", "k").to_anthropic(),
    "Buffer.set_title": lambda s: s.buffer("s", "", "k").set_title("t"),
    "Buffer.update_metadata": lambda s: s.buffer("s", "", "k").update_metadata({"a": 1}),
    "Buffer.fork": lambda s: [  # (none to fork at when the damage hid the buffer's key)
        s.buffer("s", "", "k").fork(at=m.id, to=("s", "", "fork"))
        for m in s.buffer("s", "", "k").messages()[:1]
    ],
    "Store.export": lambda s: list(s.export()),
    "Store.export full": lambda s: list(s.export(full=True)),
    "Store.conversations": lambda s: s.conversations(),
    "Store.buffers": lambda s: s.buffers(),
    "Store.search": lambda s: s.search("hello"),
    "Buffer.append": lambda s: s.buffer("s", "", "k").append({"role": "user", "content": "x"}),
    "Buffer.pop": lambda s: s.buffer("s", "", "k").pop(),
    "Buffer.delete": lambda s: s.buffer("s", "", "k").delete(),
    "Catalog.conversations": lambda s: Catalog(s).conversations(),
    "Store.enable_search": lambda s: s.enable_search(),
    "Store.memory_get": lambda s: s.memory_get(None, "global", "k"),
    "Sessions.get": lambda s: s.sessions(Principal("alice")).get(REAL["session"]),
    "Sessions.list": lambda s: s.sessions(Principal("alice")).list(),
    "Sessions.read": lambda s: s.sessions(Principal("alice")).read(REAL["session"]),
    "Sessions.messages": lambda s: s.sessions(Principal("alice")).messages(REAL["session"]),
    "Sessions.drive": lambda s: s.sessions(Principal("alice")).drive(
        REAL["session"], {"role": "user", "content": "x"}
    ),
    "Sessions.context": lambda s: s.sessions(Principal("alice")).context(REAL["session"]),
    "AsyncBuffer.read": lambda s: _aio(s, lambda st: st.buffer("s", "", "k").read()),
    "AsyncStore.memory_get": lambda s: _aio(s, lambda st: st.memory_get(None, "global", "k")),
}


@pytest.fixture(scope="module")
def damaged_paths(fuzz_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A copy of the fuzz file per kind of damage."""
    import sqlite3

    folder = tmp_path_factory.mktemp("damaged")
    made = {}
    for kind, statement in DAMAGE.items():
        path = folder / f"{kind.replace(' ', '-')}.db"
        with Store(fuzz_path) as store:
            store.backup(path)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute(statement)
        conn.close()
        made[kind] = path
    return made


@pytest.mark.parametrize("kind", sorted(DAMAGE))
@pytest.mark.parametrize("read", sorted(READS))
def test_a_damaged_row_under_every_read_is_a_typed_error(
    damaged_paths: dict[str, Path], kind: str, read: str
) -> None:
    path = damaged_paths[kind]
    with Store(path) as store:
        _typed_or_sound(store, path, lambda: READS[read](store), False, _raw_snapshot)


def _raw_snapshot(path: Path) -> object:
    """Every row of every table, TEXT as bytes (a damaged file's text may not be UTF-8)."""
    import sqlite3

    conn = sqlite3.connect(path)
    conn.text_factory = bytes
    try:
        names = [
            r[0].decode()
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        return {n: sorted(conn.execute(f'SELECT * FROM "{n}"').fetchall(), key=repr) for n in names}
    finally:
        conn.close()


def test_a_buffer_stamp_that_is_not_a_time_blocks_no_write(tmp_path: Path) -> None:
    """``buffers.updated_at`` of a damaged file read as no time: append raised TypeError
    (``now - None``), and every write to the conversation was blocked. Now each write
    works and check() names the buffer."""
    import sqlite3

    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("s", "", "k").append({"role": "user", "content": "a"})
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE buffers SET updated_at = 'not a time'")
    conn.close()
    with Store(path) as store:
        assert [(v.check, v.buffer) for v in store.check()] == [("timestamp", "s//k")]
        buffer = store.buffer("s", "", "k")
        assert buffer.append({"role": "user", "content": "b"}).count == 2
        assert buffer.pop() is not None
        buffer.delete()
        assert store.buffers() == []


def test_cli_prints_one_line_for_text_that_is_not_utf8(tmp_path: Path) -> None:
    """``buffers`` and ``sessions show`` printed a sqlite3.OperationalError traceback."""
    import sqlite3

    from click.testing import CliRunner

    from flowdrop_local.cli import cli

    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("s", "", "k").append({"role": "user", "content": "a"})
        session = store.sessions(Principal("ana")).create("wf")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE buffers SET key = CAST(X'80ff' AS TEXT)")
    conn.execute("UPDATE sessions SET name = CAST(X'80ff' AS TEXT)")
    conn.close()
    for args in (["buffers"], ["sessions", "show", "--as", "ana", session.id]):
        result = CliRunner().invoke(cli, ["--db", str(path), *args])
        assert result.exit_code == 2, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "not UTF-8" in lines[0] and "flowdrop-local check" in lines[0]


def test_postgresql_a_buffer_stamp_that_is_not_a_time_blocks_no_write(postgresql_url: str) -> None:
    """As on SQLite: a damaged ``buffers.updated_at`` on the server (written by hand)
    made every append to the conversation fail casting it to a time."""
    import psycopg

    with Store(postgresql_url) as store:
        store.buffer("s", "", "k").append({"role": "user", "content": "a"})
        store.buffer("s", "", "other").append({"role": "user", "content": "a"})
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute("UPDATE buffers SET updated_at = 'not a time' WHERE key = 'k'")
    with Store(postgresql_url) as store:
        buffer = store.buffer("s", "", "k")
        assert buffer.append({"role": "user", "content": "b"}).count == 2
        assert store.buffer("s", "", "other").append({"role": "user", "content": "b"}).count == 2
        assert buffer.pop() is not None
        buffer.delete()
        assert [b.key for b in store.buffers()] == ["other"]


def test_postgresql_a_memory_stamp_that_is_not_a_time_blocks_no_update(
    postgresql_url: str,
) -> None:
    import psycopg

    with Store(postgresql_url) as store:
        store.memory_set(None, "global", "k", 1)
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute("UPDATE memory SET updated_at = 'not a time'")
    with Store(postgresql_url) as store:
        assert store.memory_set(None, "global", "k", 2).ok
        assert store.memory_get(None, "global", "k").value == 2

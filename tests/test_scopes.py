"""Identity scopes: MEM-6 and MEM-13 refusal, decided once, and honoured by every consumer.

The spec examples are table-driven; the refusal property is checked with
hypothesis against a real file (its tables snapshotted before and after) and a
statement tracer on the store's own connection.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowdrop_local import (
    AccessDenied,
    Buffer,
    ExecutionContext,
    InvalidAddress,
    InvalidContext,
    InvalidMessage,
    InvalidValue,
    RefusedBuffer,
    Store,
)
from flowdrop_local._schema import SCHEMA_VERSION
from flowdrop_local.access import SCOPES, resolve_scope, usable_identity

from .conftest import snapshot, spec_examples

FIXTURES = Path(__file__).parent / "fixtures"
ACCESS_LOG = "flowdrop_local.access"
HELLO = {"role": "user", "content": "hello"}


@contextmanager
def traced(store: Store) -> Iterator[list[str]]:
    """Every SQL statement the store's connection executes inside the block."""
    statements: list[str] = []
    conn = store.backend.connection()
    conn.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        conn.set_trace_callback(None)


def refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == ACCESS_LOG and r.levelno == logging.WARNING]


# ------------------------------------------------------- a usable identity


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # usable: a positive int, or a trimmed, printable, non-zero string
        (7, "7"),
        ("7", "7"),
        (" 7\t", "7"),
        ("alice", "alice"),
        ("007", "007"),
        ("+7", "+7"),
        ("4f0c-uuid", "4f0c-uuid"),
        (10**30, str(10**30)),
        # nobody: the absent value and the owner-less record's zero (MEM-6)
        (None, None),
        (0, None),
        ("0", None),
        (" 0 ", None),
        ("00", None),
        ("-0", None),
        ("+0", None),
        ("\u0660", None),  # ARABIC-INDIC DIGIT ZERO: a zero in another script
        # not identifiers at all
        ("", None),
        ("   ", None),
        ("\n\t", None),
        (-1, None),
        ("-1", None),
        (False, None),
        (True, None),
        (7.0, None),
        (b"7", None),
        (["7"], None),
        ("a\x00b", None),
        ("\u200b", None),  # ZERO WIDTH SPACE: blank to the eye
        ("1" * 5000, "1" * 5000),  # longer than int() parses: still decided
        ("-" + "1" * 5000, None),
    ],
    ids=repr,
)
def test_usable_identity_is_defined_once(value: object, expected: str | None) -> None:
    """Usable: a positive int, or a trimmed printable string not spelling zero or less."""
    assert usable_identity(value) == expected


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.text(), st.floats(), st.binary()))
def test_usable_identity_is_canonical(value: object) -> None:
    """A usable identity is a non-blank trimmed string and its own canonical form."""
    found = usable_identity(value)
    if found is not None:
        assert found == found.strip() and found
        assert usable_identity(found) == found


# ------------------------------------------------------- MEM-6: spec examples

MEM6 = spec_examples("MEM-6")


@pytest.mark.parametrize("example", MEM6, ids=lambda e: e["title"])
def test_mem6_examples(store: Store, example: dict[str, Any]) -> None:
    """MEM-6: user_id 0 and "0" refuse the user scope; "7" resolves to bucket "7"."""
    context = ExecutionContext.from_dict(example["json"])
    resolution = resolve_scope(context, "user")
    buffer = store.buffer_for(context, "user", "chat")
    written = store.memory_set(context, "user", "pref", "x")
    if example["verdict"] == "refused":
        assert (resolution.refused, resolution.scope_id) == (True, "")
        assert buffer.refused and isinstance(buffer, RefusedBuffer)
        assert buffer.append(HELLO).count == 0
        assert not written.ok
        assert store.buffers() == []
    else:
        assert example["verdict"] == "resolved"
        assert (resolution.refused, resolution.scope_id) == (False, "7")
        assert not buffer.refused
        assert buffer.append(HELLO).count == 1
        assert written.ok and written.resolved_scope_id == "7"
        assert [(b.scope, b.scope_id) for b in store.buffers()] == [("user", "7")]


# ------------------------------------------------------- resolution table

CTX = ExecutionContext(
    user_id="u1",
    session_id="s1",
    workflow_id="w1",
    pipeline_id="p1",
    execution_id="e1",
    node_id="n1",
)
EMPTY = ExecutionContext()
REFUSED = None


@pytest.mark.parametrize(
    ("context", "scope", "expected"),
    [
        (CTX, "global", ""),
        (CTX, "workflow", "w1"),
        (CTX, "pipeline", "p1"),
        (CTX, "execution", "e1"),
        (CTX, "session", "s1"),
        (CTX, "user", "u1"),
        (ExecutionContext(user_id=42, session_id=" s9 "), "user", "42"),
        (ExecutionContext(user_id=42, session_id=" s9 "), "session", "s9"),
        # non-identity scopes with nothing to resolve to: their shared bucket ""
        (None, "global", ""),
        (None, "workflow", ""),
        (EMPTY, "pipeline", ""),
        (ExecutionContext(execution_id=0), "execution", ""),
        (ExecutionContext(workflow_id="  "), "workflow", ""),
        # identity scopes refuse (MEM-6 user, MEM-13 session)
        (None, "user", REFUSED),
        (None, "session", REFUSED),
        (EMPTY, "user", REFUSED),
        (EMPTY, "session", REFUSED),
        (ExecutionContext(user_id="0", session_id="s1"), "user", REFUSED),
        (ExecutionContext(user_id="7", session_id=0), "session", REFUSED),
        (ExecutionContext(user_id="7", session_id=""), "session", REFUSED),
        (ExecutionContext(user_id=True), "user", REFUSED),
        (ExecutionContext(session_id="  "), "session", REFUSED),
    ],
)
def test_resolution_table(
    context: ExecutionContext | None, scope: str, expected: str | None
) -> None:
    """Each scope resolves from its own context field; only user and session refuse."""
    resolution = resolve_scope(context, scope)
    assert resolution.scope == scope
    if expected is REFUSED:
        assert (resolution.refused, resolution.scope_id) == (True, "")
        assert resolution.reason
    else:
        assert (resolution.refused, resolution.scope_id) == (False, expected)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: resolve_scope(CTX, "tenant"), InvalidAddress),
        (lambda: resolve_scope(CTX, "User"), InvalidAddress),
        (lambda: resolve_scope({"user_id": "7"}, "user"), InvalidContext),  # type: ignore[arg-type]
        (lambda: ExecutionContext.from_dict({"user": "7"}), InvalidContext),
        (lambda: ExecutionContext.from_dict(["user_id"]), InvalidContext),  # type: ignore[arg-type]
    ],
    ids=["unknown-scope", "scope-case", "context-dict", "unknown-field", "not-a-mapping"],
)
def test_bad_scope_or_context_is_an_error_not_a_refusal(
    caplog: pytest.LogCaptureFixture, call: Any, error: type[Exception]
) -> None:
    """Malformed input raises its typed error and logs no refusal."""
    with pytest.raises(error):
        call()
    assert refusals(caplog) == []


def test_every_scope_is_in_the_table() -> None:
    """The six scopes of the spec, no more."""
    assert set(SCOPES) == {"global", "workflow", "pipeline", "execution", "session", "user"}


# ------------------------------------------------ store.buffer and buffer_for

UNUSABLE_IDS = [None, 0, "0", "", "   ", " 0 ", "00", "-3", False, True]


@pytest.mark.parametrize("scope", ["user", "session"])
@pytest.mark.parametrize("scope_id", UNUSABLE_IDS, ids=repr)
def test_store_buffer_refuses_identity_scopes_without_identity(
    file_store: Store, db_path: Path, scope: str, scope_id: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """store.buffer("user", "0", key) and friends give a refused buffer; nothing is written."""
    before = snapshot(db_path)
    with traced(file_store) as statements:
        buffer = file_store.buffer(scope, scope_id, "chat")
        result = buffer.append(HELLO)
        assert (buffer.refused, buffer.scope_id, buffer.read(), len(buffer)) == (True, "", [], 0)
        assert buffer.messages() == [] and buffer.clear() == 0
    assert statements == []
    assert (result.count, result.appended, result.appended_any) == (0, 0, False)
    assert snapshot(db_path) == before
    assert len(refusals(caplog)) == 1


def test_store_buffer_canonicalises_a_usable_identity(store: Store) -> None:
    """7, "7" and " 7 " are one user, so one bucket; other scopes keep their ids as given."""
    for scope_id in (7, "7", " 7 "):
        store.buffer("user", scope_id, "chat").append(HELLO)  # type: ignore[arg-type]
    assert [(b.scope_id, b.count) for b in store.buffers()] == [("7", 3)]
    assert store.buffer("workflow", " w ", "k").scope_id == " w "
    assert store.buffer("demo", "", "k").refused is False


def test_buffer_for_non_identity_scope_with_no_id_is_the_shared_bucket(store: Store) -> None:
    """A workflow-less context shares the workflow scope's "" bucket: not a refusal."""
    a = store.buffer_for(ExecutionContext(user_id="1"), "workflow", "notes")
    b = store.buffer_for(None, "workflow", "notes")
    a.append(HELLO)
    assert not b.refused and b.read() == a.read() and b.scope_id == ""
    assert store.buffer_for(None, "global", "notes").read() == []  # another scope, another bucket


def test_refused_buffer_reads_and_validates_like_a_buffer(store: Store) -> None:
    """A refused append still rejects malformed messages and bad limits (bad input is an error)."""
    buffer = store.buffer_for(None, "user", "chat")
    with pytest.raises(InvalidMessage):
        buffer.append({"role": "nobody"})
    with pytest.raises(ValueError, match="limit"):
        buffer.read(limit=-1)
    assert buffer.read(5, before="anything") == []
    assert isinstance(buffer, Buffer) and repr(buffer) == "<RefusedBuffer 'user' 'chat'>"
    with pytest.raises(InvalidAddress):
        store.buffer_for(None, "user", "  ")


def test_refused_buffer_fails_closed_on_any_storage_path(store: Store) -> None:
    """A path that would reach storage through a refused buffer raises instead of writing."""
    buffer = store.buffer_for(None, "session", "chat")
    with store.backend.write() as tx, pytest.raises(AccessDenied) as denied:
        buffer.append_in(tx, [])
    assert denied.value.error_code == "scope_refused"
    with pytest.raises(AccessDenied) as denied:
        buffer.backend.write()
    assert denied.value.error_code == "scope_refused"
    assert store.buffers() == []


# ----------------------------------------------------- exactly one warning


def test_each_refusal_logs_exactly_one_warning_naming_node_pipeline_workflow(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """MEM-7: one logging warning per refusal, even for identical repeats."""
    context = ExecutionContext(user_id="0", node_id="n-42", pipeline_id="p-7", workflow_id="wf-3")
    caplog.set_level(logging.WARNING, ACCESS_LOG)
    for expected in (1, 2, 3):
        store.buffer_for(context, "user", "chat").append(HELLO)
        assert len(refusals(caplog)) == expected
    store.memory_get(context, "user", "k")
    store.memory_set(context, "user", "k", 1)
    store.memory_delete(context, "user", "k")
    records = refusals(caplog)
    assert len(records) == 6
    for record in records:
        message = record.getMessage()
        assert "n-42" in message and "p-7" in message and "wf-3" in message
        assert (record.flowdrop_node, record.flowdrop_pipeline, record.flowdrop_workflow) == (  # type: ignore[attr-defined]
            "n-42",
            "p-7",
            "wf-3",
        )


def test_resolving_is_silent(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """No warning for a resolved identity scope, nor for a non-identity scope's "" bucket."""
    store.buffer_for(CTX, "user", "chat").append(HELLO)
    store.buffer_for(None, "global", "chat").append(HELLO)
    store.memory_get(None, "workflow", "k")
    assert refusals(caplog) == []


# --------------------------------------- property: a refused context writes nothing

_WS = st.text(alphabet=" \t\n\r", max_size=2)
UNUSABLE = st.one_of(
    st.none(),
    st.sampled_from([0, "0", False, True, b"7", 7.0, ["7"]]),
    st.integers(max_value=0),
    _WS,
    st.builds(lambda a, z, b: a + z + b, _WS, st.sampled_from(["0", "00", "-0", "+0", "-12"]), _WS),
    st.builds(lambda a, b: a + "\x00" + b, st.text(max_size=3), st.text(max_size=3)),
)
OTHER_ID = st.one_of(st.none(), st.sampled_from(["u1", "s1", 7, "0", ""]))
OPERATIONS = st.lists(
    st.sampled_from(["append", "raw-append", "set", "delete", "get", "read", "clear"]),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    scope=st.sampled_from(["user", "session"]),
    bad=UNUSABLE,
    other=OTHER_ID,
    node=st.one_of(st.none(), st.text(max_size=5)),
    operations=OPERATIONS,
)
def test_no_refused_context_ever_writes_a_row(
    seeded: tuple[Store, Path],
    scope: str,
    bad: Any,
    other: Any,
    node: str | None,
    operations: list[str],
) -> None:
    """MEM-7: whatever a refused context does, every table is unchanged and no SQL ran."""
    store, path = seeded
    assert usable_identity(bad) is None
    fields = (
        {"user_id": bad, "session_id": other}
        if scope == "user"
        else {"user_id": other, "session_id": bad}
    )
    context = ExecutionContext(**fields, workflow_id="w1", node_id=node)
    before = snapshot(path)
    with traced(store) as statements:
        for operation in operations:
            if operation == "append":
                assert store.buffer_for(context, scope, "chat").append(HELLO).count == 0
            elif operation == "raw-append":
                assert store.buffer(scope, bad, "chat").append(HELLO).appended == 0
            elif operation == "set":
                assert not store.memory_set(context, scope, "k", {"v": 1}).ok
            elif operation == "delete":
                assert not store.memory_delete(context, scope, "k").ok
            elif operation == "get":
                read = store.memory_get(context, scope, "k", "fallback")
                assert (read.value, read.found, read.resolved_scope_id) == ("fallback", False, "")
            elif operation == "read":
                assert store.buffer_for(context, scope, "chat").read() == []
            else:
                assert store.buffer_for(context, scope, "chat").clear() == 0
    assert statements == []
    assert snapshot(path) == before


@pytest.fixture
def seeded(db_path: Path) -> Iterator[tuple[Store, Path]]:
    """A file with data in the shared buckets a degraded scope would have hit."""
    with Store(db_path) as store:
        for scope_id in ("", "0"):
            for scope in ("global", "workflow"):
                store.buffer(scope, scope_id, "chat").append(HELLO)
        store.buffer("user", "u1", "chat").append(HELLO)
        store.memory_set(None, "global", "k", "shared")
        store.memory_set(ExecutionContext(user_id="u1", session_id="s1"), "user", "k", "mine")
        store.memory_set(ExecutionContext(user_id="u1", session_id="s1"), "session", "k", "ours")
        yield store, db_path


# ---------------------------------------------------- schema version 2


def _master(path: Path) -> list[tuple[str, str, str, str | None]]:
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
    finally:
        conn.close()


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_version_1_file_upgrades_to_the_fresh_schema(tmp_path: Path) -> None:
    """v1.db opens as the current version: the sqlite_master of a fresh file, messages intact."""
    old = tmp_path / "v1.db"
    shutil.copyfile(FIXTURES / "v1.db", old)
    columns = "buffer_id, position, role, content, content_parts, metadata, created_at"
    # Version 3 stores an id as its 16 bytes: compare them as hex digits.
    messages_sql = "SELECT {}, " + columns + " FROM messages ORDER BY buffer_id, position"
    buffers_sql = "SELECT id, scope, scope_id, key, created_at FROM buffers ORDER BY id"
    messages = _rows(old, messages_sql.format("upper(replace(id, '-', ''))"))
    buffers = _rows(old, buffers_sql)
    assert _rows(old, "PRAGMA user_version") == [(1,)] and messages
    with Store(old) as store:
        history = store.buffer("session", "s1", "chat").read()
        assert len(history) == 7 and history[-1]["content"] == [{"type": "text", "text": "Sunny."}]
        store.memory_set(ExecutionContext(user_id="42"), "user", "k", 1)  # the new tables work
    fresh = tmp_path / "fresh.db"
    Store(fresh).close()
    assert SCHEMA_VERSION == 3
    assert _rows(old, "PRAGMA user_version") == [(3,)]
    upgraded, created = set(_master(old)), set(_master(fresh))
    differing = sorted({entry[1] for entry in upgraded ^ created})
    assert not differing, f"upgraded and fresh files differ in: {differing}"
    assert _rows(old, messages_sql.format("hex(id)")) == messages
    assert _rows(old, buffers_sql) == buffers


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO buffers (scope, scope_id, key) VALUES ('user', '0', 'k')",
        "INSERT INTO buffers (scope, scope_id, key) VALUES ('session', ' ', 'k')",
        "INSERT INTO memory (scope, scope_id, key, value) VALUES ('user', '', 'k', '1')",
        "INSERT INTO memory (scope, scope_id, key, value) VALUES ('session', '0', 'k', '1')",
        "INSERT INTO sessions (id, workflow_id, owner_id) VALUES ('{uuid}', 'w', '0')",
        "INSERT INTO sessions (id, workflow_id, owner_id) VALUES ('{uuid}', 'w', '')",
    ],
)
def test_schema_backstops_the_shared_bucket_spellings(
    file_store: Store, db_path: Path, sql: str
) -> None:
    """A writer bypassing the library cannot put '' or '0' in an identity slot."""
    before = snapshot(db_path)
    with pytest.raises(sqlite3.IntegrityError):
        file_store.backend.connection().execute(
            sql.replace("{uuid}", "0" * 8 + "-0000-7000-8000-" + "0" * 12)
        )
    assert snapshot(db_path) == before


# ----------------------------------------- scope names are printable ASCII (issue 10 D)

LOOKALIKE_SCOPES = [
    "user\u200b",  # ZERO WIDTH SPACE after it
    "u\u0455er",  # CYRILLIC SMALL LETTER DZE: survives NFKC
    "u\u017fer",  # LATIN SMALL LETTER LONG S: NFKC makes it "user"
    "user\x00",  # NUL: survives NFKC
    "\u0455ession",
    "se\u0455\u0455ion",
    "user\n",
    "\tsession",
    "\uff55\uff53\uff45\uff52",  # FULLWIDTH "user": NFKC makes it "user"
    "us\u00e9r",
]


@pytest.mark.parametrize("scope", LOOKALIKE_SCOPES, ids=ascii)
def test_a_lookalike_of_an_identity_scope_is_refused(
    file_store: Store, db_path: Path, scope: str
) -> None:
    """Each look-alike of user/session gets InvalidAddress, never a shared bucket."""
    before = snapshot(db_path)
    with pytest.raises(InvalidAddress, match="printable ASCII"):
        file_store.buffer(scope, "7", "chat")
    assert snapshot(db_path) == before


@pytest.mark.parametrize(
    ("scope", "problem"),
    [
        ("caf\u00e9", "printable ASCII"),
        (" demo", "printable ASCII"),
        ("demo ", "printable ASCII"),
        ("de\x7fmo", "printable ASCII"),
        ("USER", "is not the identity scope 'user'"),
        ("Session", "is not the identity scope 'session'"),
    ],
    ids=ascii,
)
def test_scope_names_are_printable_ascii_without_surrounding_whitespace(
    store: Store, scope: str, problem: str
) -> None:
    """Any scope name, not only a look-alike: the rule is one, and says what is wrong."""
    with pytest.raises(InvalidAddress, match=problem):
        store.buffer(scope, "x", "chat")


def test_scope_ids_and_keys_stay_free_text(store: Store) -> None:
    """Only the scope name is restricted: ids and keys take any valid Unicode; SQLite
    stores NUL too, PostgreSQL text cannot, and refuses it with a typed error."""
    buffer = store.buffer(
        "my scope-1.0", "\u00fcn\u00efcode \u0455 id\x00", " \u043a\u043b\u044e\u0447 "
    )
    if store.backend.kind == "postgresql":
        with pytest.raises(InvalidValue, match="NUL"):
            buffer.append(HELLO)
        assert store.buffers() == []
        return
    buffer.append(HELLO)
    assert [(b.scope, b.scope_id, b.key) for b in store.buffers()] == [
        ("my scope-1.0", "\u00fcn\u00efcode \u0455 id\x00", " \u043a\u043b\u044e\u0447 ")
    ]

"""Key-value memory: the MEM-7 and MEM-13 read results, isolation per slot, and bad input."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import (
    ExecutionContext,
    InvalidAddress,
    InvalidValue,
    MemoryRead,
    Store,
)

from .conftest import snapshot, spec_examples
from .test_scopes import refusals, traced

KEY = "preference"
REFUSED_USER = [
    None,
    ExecutionContext(),
    ExecutionContext(user_id=0),
    ExecutionContext(user_id="0"),
]
REFUSED_SESSION = [
    None,
    ExecutionContext(user_id="7"),
    ExecutionContext(user_id="7", session_id=""),
]


def _seed_shared(store: Store) -> None:
    """Put "val" in the shared "" buckets a degraded scope would have read."""
    store.memory_set(None, "global", KEY, "val")
    store.memory_set(None, "workflow", KEY, "val")


# ----------------------------------------------------------- MEM-7 examples

MEM7 = spec_examples("MEM-7")
MEM13 = spec_examples("MEM-13")

# Each example with the contexts that must produce exactly its JSON.
CASES: list[tuple[str, dict[str, Any], ExecutionContext | None]] = [
    *((f"MEM-7[0] {ctx!r}", MEM7[0], ctx) for ctx in REFUSED_USER),
    ("MEM-7[1] global", MEM7[1], ExecutionContext(user_id="0")),
    ("MEM-7[1] global, no context", MEM7[1], None),
    *((f"MEM-13[0] {ctx!r}", MEM13[0], ctx) for ctx in REFUSED_SESSION),
]


@pytest.mark.parametrize(("name", "example", "context"), CASES, ids=[c[0] for c in CASES])
def test_spec_read_results(
    file_store: Store,
    db_path: Path,
    caplog: pytest.LogCaptureFixture,
    name: str,
    example: dict[str, Any],
    context: ExecutionContext | None,
) -> None:
    """MEM-7, MEM-13: refused reads give the fallback, found=false, ""; global reads the store."""
    _seed_shared(file_store)
    expected = example["json"]
    before = snapshot(db_path)
    with traced(file_store) as statements:
        read = file_store.memory_get(context, expected["scope"], KEY, default="fallback")
    assert read.to_dict() == expected
    if example["verdict"] == "refused":
        assert statements == []  # the storage backend is not called at all
        assert len(refusals(caplog)) == 1
    else:
        assert example["verdict"] == "resolved"
        assert statements and refusals(caplog) == []
    assert snapshot(db_path) == before


def test_refusal_and_shared_bucket_differ_only_in_found_and_value(store: Store) -> None:
    """MEM-7: both report resolved_scope_id "", which alone cannot tell them apart."""
    _seed_shared(store)
    refused = store.memory_get(ExecutionContext(), "user", KEY, "fallback")
    shared = store.memory_get(ExecutionContext(), "global", KEY, "fallback")
    assert refused.resolved_scope_id == shared.resolved_scope_id == ""
    assert (refused.found, refused.value) == (False, "fallback")
    assert (shared.found, shared.value) == (True, "val")


# ------------------------------------------------------ writes and deletes


@pytest.mark.parametrize(
    ("scope", "context"),
    [("user", c) for c in REFUSED_USER] + [("session", c) for c in REFUSED_SESSION],
)
def test_refused_write_and_delete_report_failure_and_touch_nothing(
    file_store: Store, db_path: Path, scope: str, context: ExecutionContext | None
) -> None:
    """MEM-7: a refused write and delete report ok=False, resolved id "", no SQL, no change."""
    _seed_shared(file_store)
    before = snapshot(db_path)
    with traced(file_store) as statements:
        written = file_store.memory_set(context, scope, KEY, "mine")
        deleted = file_store.memory_delete(context, scope, KEY)
    assert (written.ok, written.resolved_scope_id, written.existed) == (False, "", False)
    assert (deleted.ok, deleted.resolved_scope_id, deleted.existed) == (False, "", False)
    assert statements == []
    assert snapshot(db_path) == before


def test_round_trip_reports_what_it_did(store: Store) -> None:
    """set reports whether the key existed; delete whether it removed something; values are JSON."""
    ctx = ExecutionContext(user_id=7)
    assert store.memory_set(ctx, "user", KEY, {"tone": "brief"}).existed is False
    assert store.memory_set(ctx, "user", KEY, [1, "two", None]).existed is True
    assert store.memory_get(ctx, "user", KEY) == MemoryRead([1, "two", None], True, "user", "7")
    store.memory_set(ctx, "user", "nothing", None)
    assert store.memory_get(ctx, "user", "nothing", "dflt") == MemoryRead(None, True, "user", "7")
    deleted = store.memory_delete(ctx, "user", KEY)
    assert (deleted.ok, deleted.existed) == (True, True)
    assert store.memory_delete(ctx, "user", KEY).existed is False
    assert store.memory_get(ctx, "user", KEY, "dflt") == MemoryRead("dflt", False, "user", "7")


@pytest.mark.parametrize(
    ("scope", "a", "b"),
    [
        ("user", ExecutionContext(user_id="7"), ExecutionContext(user_id="8")),
        ("session", ExecutionContext(session_id="s1"), ExecutionContext(session_id="s2")),
        ("workflow", ExecutionContext(workflow_id="w1"), ExecutionContext(workflow_id="w2")),
        ("pipeline", ExecutionContext(pipeline_id="p1"), ExecutionContext(pipeline_id="p2")),
        ("execution", ExecutionContext(execution_id="e1"), ExecutionContext(execution_id="e2")),
    ],
)
def test_each_slot_is_its_own(
    store: Store, scope: str, a: ExecutionContext, b: ExecutionContext
) -> None:
    """Two ids of one scope never see each other's values, nor the global one."""
    store.memory_set(a, scope, KEY, "a")
    store.memory_set(None, "global", KEY, "g")
    assert store.memory_get(b, scope, KEY).found is False
    assert store.memory_get(a, scope, KEY).value == "a"
    assert store.memory_get(a, "global", KEY).value == "g"


def test_user_seven_as_int_and_string_is_one_slot(store: Store) -> None:
    """7 and "7" are one user (one canonical id)."""
    store.memory_set(ExecutionContext(user_id=7), "user", KEY, "x")
    assert store.memory_get(ExecutionContext(user_id=" 7 "), "user", KEY).value == "x"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.memory_set(None, "global", KEY, {1, 2}), InvalidValue),
        (lambda s: s.memory_set(None, "global", KEY, float("nan")), InvalidValue),
        (lambda s: s.memory_set(None, "global", KEY, "\ud800"), InvalidValue),
        (lambda s: s.memory_set(None, "global", KEY, object()), InvalidValue),
        (lambda s: s.memory_set(None, "global", "  ", 1), InvalidAddress),
        (lambda s: s.memory_set(None, "global", 7, 1), InvalidAddress),
        (lambda s: s.memory_set(None, "tenant", KEY, 1), InvalidAddress),
        (lambda s: s.memory_get(None, "global", "", 1), InvalidAddress),
        (lambda s: s.memory_delete(None, "nope", KEY), InvalidAddress),
        # bad input is an error even where the scope would refuse
        (lambda s: s.memory_set(None, "user", KEY, {1}), InvalidValue),
        (lambda s: s.memory_get(None, "user", " "), InvalidAddress),
    ],
    ids=[
        "set-value",
        "nan",
        "lone-surrogate",
        "object",
        "blank-key",
        "int-key",
        "unknown-scope",
        "get-blank-key",
        "delete-unknown-scope",
        "refused-bad-value",
        "refused-bad-key",
    ],
)
def test_bad_input_is_typed_and_changes_nothing(
    file_store: Store,
    db_path: Path,
    caplog: pytest.LogCaptureFixture,
    call: Any,
    error: type[Exception],
) -> None:
    """Each bad input raises its typed error, logs no refusal, and leaves the file unchanged."""
    caplog.set_level(logging.WARNING)
    _seed_shared(file_store)
    before = snapshot(db_path)
    with pytest.raises(error):
        call(file_store)
    assert snapshot(db_path) == before
    assert refusals(caplog) == []

"""The package root holds what an application calls (issue 22 C): the store and its
handles, their records, the sessions API, sync and the errors. The rule functions
and the provider formats live in their own public modules; their old root names
warn for one release."""

from __future__ import annotations

import importlib
import inspect
import warnings
from pathlib import Path

import pytest

import flowdrop_local
from flowdrop_local.errors import FlowdropError

MOVED = sorted(flowdrop_local._MOVED.items())


def test_the_root_is_what_an_application_calls() -> None:
    """60 names: classes (the store, handles, records, sessions API, 35 errors) and
    ``sync``; no rule function or provider format."""
    names = flowdrop_local.__all__
    assert len(names) == len(set(names)) == 60
    functions = [n for n in names if inspect.isfunction(getattr(flowdrop_local, n))]
    assert functions == ["sync"]
    errors = [
        n
        for n in names
        if inspect.isclass(c := getattr(flowdrop_local, n)) and issubclass(c, FlowdropError)
    ]
    assert len(errors) == 35
    assert not set(names) & set(flowdrop_local._MOVED)


@pytest.mark.parametrize(("name", "module"), MOVED, ids=[name for name, _ in MOVED])
def test_a_moved_name_warns_and_is_the_same_object(name: str, module: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"{module}.{name}"):
        old = getattr(flowdrop_local, name)
    assert old is getattr(importlib.import_module(module), name)
    assert name in importlib.import_module(module).__all__


def test_an_unknown_name_is_an_attribute_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no_such_name"):
            flowdrop_local.no_such_name  # noqa: B018


@pytest.mark.parametrize(
    ("old", "new"), [("window", "last_turns"), ("read_window", "read_last_turns")]
)
def test_the_payload_window_is_last_turns_and_the_old_names_warn(old: str, new: str) -> None:
    """``window`` is a buffer's eviction limit; the payload's window is ``last_turns``."""
    providers = importlib.import_module("flowdrop_local.providers")
    with pytest.warns(DeprecationWarning, match=f"providers.{old} is now {new}"):
        assert getattr(providers, old) is getattr(providers, new)
    assert new in providers.__all__ and old not in providers.__all__


def test_a_handles_backend_is_backend_and_db_warns(tmp_path: Path) -> None:
    """``Store.db`` is a sqlite-utils view; a handle's backend is ``backend`` (``db``
    warns for one release)."""
    with flowdrop_local.Store(tmp_path / "chat.db") as store:
        buf = store.buffer("global", "", "k")
        sessions = store.sessions(flowdrop_local.Principal("ana"))
        for handle in (buf, sessions):
            with pytest.warns(DeprecationWarning, match=r"\.db is now .*\.backend"):
                assert handle.db is handle.backend
        assert buf.backend is sessions.backend

"""The package root holds what an application calls (issue 22 C): the store and its
handles, their records, the sessions API, sync and the errors. The rule functions
and the provider formats live in their own public modules; their old root names
warn for one release."""

from __future__ import annotations

import importlib
import inspect
import warnings

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

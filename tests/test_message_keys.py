"""A misspelled top-level message key is kept in metadata, and a warning names it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from flowdrop_local import Store


@pytest.mark.parametrize(
    ("message", "key", "meant"),
    [
        ({"role": "user", "contnet": "hi"}, "contnet", "content"),
        ({"role": "user", "Content": "hi"}, "Content", "content"),
        ({"role": "assistant", "tool_call": [{"id": "c1"}]}, "tool_call", "tool_calls"),
        ({"role": "tool", "content": "42", "tool_call_ids": "c1"}, "tool_call_ids", "tool_call_id"),
        ({"role": "user", "content": "hi", "meta_data": {}}, "meta_data", "metadata"),
        ({"rolle": "x", "role": "user", "content": "hi"}, "rolle", "role"),
    ],
)
def test_a_key_like_a_field_is_warned(
    caplog: pytest.LogCaptureFixture, message: dict[str, Any], key: str, meant: str
) -> None:
    """The message is stored (as before) and one warning names the key and the field meant."""
    with Store(":memory:") as store, caplog.at_level(logging.WARNING, logger="flowdrop_local"):
        store.buffer("s", "1", "k").append(message)
        stored = store.buffer("s", "1", "k").read()[-1]
    assert stored["metadata"][key] == message[key]
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{key!r}" in record.getMessage() and f"did you mean {meant!r}" in record.getMessage()


# "id" is the message's own id now (tests/test_caller_ids.py), not a key kept in metadata.
@pytest.mark.parametrize("key", ["name", "refusal", "type", "audio", "function_call"])
def test_other_keys_are_kept_without_a_warning(caplog: pytest.LogCaptureFixture, key: str) -> None:
    """Keys that are not near a field (name, refusal, ...) move into metadata silently."""
    with Store(":memory:") as store, caplog.at_level(logging.WARNING, logger="flowdrop_local"):
        store.buffer("s", "1", "k").append({"role": "assistant", "content": "x", key: "v"})
    assert not caplog.records

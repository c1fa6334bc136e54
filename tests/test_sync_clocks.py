"""Sync with clocks that jump: real processes, each with its own clock.

Each replica lives on a "device": a child process (tests/workers/clocked.py) run
under libfaketime, whose clock (Python's and SQLite's alike) the test sets back and
forward by writing an offset to a file. What a sync must find is what changed
since the pair's last sync, however any clock moved in between: after every
incremental sync, a full sync finds nothing left to move.

libfaketime is Debian's ``faketime`` package; without it these tests skip, unless
``FLOWDROP_REQUIRE_FAKETIME`` is set (CI sets it, and .ci/run installs the package).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAKETIME = next(
    (
        path
        for path in (
            "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
            "/usr/lib/faketime/libfaketime.so.1",
        )
        if os.path.exists(path)
    ),
    None,
)
if FAKETIME is None:
    if os.environ.get("FLOWDROP_REQUIRE_FAKETIME"):
        raise RuntimeError("FLOWDROP_REQUIRE_FAKETIME is set but libfaketime is missing")
    pytest.skip("libfaketime (Debian's faketime) is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
HOUR = 3600


class Device:
    """A process with its own clock that runs library calls on stores by path."""

    def __init__(self, folder: Path, name: str) -> None:
        self.clock = folder / f"{name}.clock"
        self.set_clock(0)
        env = {
            **os.environ,
            "LD_PRELOAD": str(FAKETIME),
            "FAKETIME_TIMESTAMP_FILE": str(self.clock),
            "FAKETIME_NO_CACHE": "1",
            "PYTHONPATH": str(ROOT),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.workers.clocked"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
            text=True,
        )

    def set_clock(self, offset: int) -> None:
        """Set this device's clock ``offset`` seconds from the real time."""
        self.clock.write_text(f"{offset:+d}\n", encoding="utf-8")

    def __call__(self, op: str, **args: Any) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        if "error" in answer:
            raise AssertionError(f"{op} {args}: {answer['error']}")
        return answer["ok"]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Device]]:
    folder = tmp_path_factory.mktemp("clocks")
    started = [Device(folder, name) for name in ("a", "b", "c")]
    yield started
    for device in started:
        device.close()


def test_the_devices_clocks_move(devices: list[Device]) -> None:
    """The harness works: a device's clock follows its file, Python's and SQLite's."""
    device = devices[0]
    now = device("time")
    device.set_clock(-2 * HOUR)
    try:
        assert now - device("time") > HOUR
    finally:
        device.set_clock(0)
    assert abs(device("time") - now) < 60


def call(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "name": "f"}]}


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "content": "done", "tool_call_id": call_id}


# Each a change a device makes: (op, args); "k" is the conversation they touch.
PLAIN = {"role": "user", "content": "new"}
CHANGES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "plain append": [("append", {"key": "k", "messages": [PLAIN]})],
    "tool call": [("append", {"key": "k", "messages": [call("c9")]})],
    "tool result": [
        ("append", {"key": "k", "messages": [call("c9")]}),
        ("append", {"key": "k", "messages": [result("c9")]}),
    ],
    "new conversation": [("append", {"key": "fresh", "messages": [PLAIN]})],
    "pop": [("pop", {"key": "k"})],
    "title": [("title", {"key": "k", "title": "renamed"})],
    "delete conversation": [("delete", {"key": "k"})],
    "memory set": [("memory_set", {"key": "new", "value": 1})],
    "memory update": [("memory_set", {"key": "note", "value": "changed"})],
    "memory delete": [("memory_delete", {"key": "note"})],
}


def _fresh(folder: Path, names: str) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return [str(folder / f"{name}.db") for name in names]


def _converged(devices: list[Device], x: str, y: str) -> None:
    a = devices[0]
    assert a("contents", db=x) == a("contents", db=y)
    assert a("sync", a=x, b=y, full=True)["moved"] == 0
    assert a("check", db=x) == [] and a("check", db=y) == []


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize(
    "clocks",
    [
        pytest.param((0, HOUR, -2 * HOUR, 2 * HOUR), id="set back while writing"),
        pytest.param((0, 0, -20 * 60, 0), id="twenty minutes back while writing"),
        pytest.param((2 * HOUR, 2 * HOUR, 0, 3 * HOUR), id="ahead at the syncs"),
        pytest.param((0, 0, 0, -HOUR), id="set back at the sync"),
    ],
)
def test_a_change_made_under_any_clock_reaches_the_other_side(
    devices: list[Device], tmp_path: Path, change: str, clocks: tuple[int, int, int, int]
) -> None:
    """The writer's clock at each step: the two sides sync (``clocks[0]``) and sync
    again with nothing to move (``clocks[1]``), the writer makes the change
    (``clocks[2]``), they sync again (``clocks[3]``). What the change touched was
    last written hours before. The incremental sync moves the change (before:
    stamped by the wall clock, or not stamped at all, behind the pair's last mark
    less the margin, it was never looked at again)."""
    a, b = _fresh(tmp_path, "ab")
    writer = devices[1]
    try:
        writer.set_clock(clocks[0] - 3 * HOUR)  # written hours before the first sync
        writer("append", db=a, key="k", messages=[{"role": "user", "content": "q"}, call("c1")])
        writer("append", db=a, key="k", messages=[result("c1")])
        writer("append", db=a, key="other", messages=[{"role": "user", "content": "left"}])
        writer("memory_set", db=a, key="note", value="first")
        for clock in clocks[:2]:
            writer.set_clock(clock)
            writer("sync", a=a, b=b)
        writer.set_clock(clocks[2])
        for op, args in CHANGES[change]:
            writer(op, db=a, **args)
        writer.set_clock(clocks[3])
        report = writer("sync", a=a, b=b)
        assert report["moved"] > 0, f"{change}: the sync found nothing to move"
        _converged(devices, a, b)
    finally:
        writer.set_clock(0)


OFFSETS = st.sampled_from([-3 * HOUR, -HOUR, -11 * 60, -90, 0, 0, 90, 11 * 60, HOUR])
STEP = st.one_of(
    st.tuples(st.just("clock"), st.integers(0, 2), OFFSETS),
    st.tuples(st.just("change"), st.integers(0, 2), st.sampled_from(sorted(CHANGES))),
    st.tuples(st.just("sync"), st.integers(0, 2), st.integers(0, 2)),
)


@settings(
    max_examples=int(os.environ.get("FLOWDROP_CLOCK_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(STEP, min_size=6, max_size=30))
def test_three_devices_whose_clocks_jump_converge(
    devices: list[Device], tmp_path_factory: pytest.TempPathFactory, steps: list[Any]
) -> None:
    """Three replicas, each written by its own device, clocks set back and forward
    at random between changes and syncs of random pairs: after every incremental
    sync, the pair holds the same and a full sync finds nothing to move."""
    paths = _fresh(tmp_path_factory.mktemp("replicas"), "xyz")
    seed = [{"role": "user", "content": "q"}, call("c1")]
    devices[0]("append", db=paths[0], key="k", messages=seed)
    devices[0]("memory_set", db=paths[0], key="note", value="first")
    try:
        for kind, i, arg in steps:
            if kind == "clock":
                devices[i].set_clock(arg)
            elif kind == "change":
                for op, args in CHANGES[arg]:
                    if op == "append" and args["messages"][0]["role"] == "tool":
                        continue  # a result may not fit (its call popped); calls suffice
                    devices[i](op, db=paths[i], **args)
            elif i != arg:
                devices[i]("sync", a=paths[i], b=paths[arg])
                _converged(devices, paths[i], paths[arg])
    finally:
        for device in devices:
            device.set_clock(0)

"""Round trips on PostgreSQL, counted on the wire.

A small proxy sits between the store and the server on a Unix socket and holds
every answer of the server 0.1 s, so the wall time of an operation tells how many
times it waited for the server.
On a server every round trip costs more than the SQL, so: a plain append takes at
most two, healing adds none per healed call, and reading the last N takes one.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowdrop_local import Store

DELAY = 0.1  # seconds the proxy holds every answer of the server


class RoundTripCounter:
    """Forwards one Unix socket to another, holding each answer of the server ``DELAY`` s.

    A client that waits for an answer waits ``DELAY`` more each time, whatever it
    sends in between; so the wall time of a piece of work, divided by ``DELAY``,
    is the number of round trips it made (the local work takes a few ms).
    """

    def __init__(self, target: str, listen: str) -> None:
        self.target = target
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(listen)
        self._server.listen()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, DELAY), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, delay: float) -> None:
        held: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def forward() -> None:
            while (item := held.get()) is not None:
                due, data = item
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=forward, daemon=True).start()
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                held.put(None)  # type: ignore[arg-type]
                return
            held.put((time.monotonic() + delay, data))

    def close(self) -> None:
        self._closing = True
        self._server.close()


@pytest.fixture
def counted_url(postgresql_url: str, tmp_path: Path) -> Iterator[tuple[str, RoundTripCounter]]:
    """The test schema's URL, reached through the counting proxy."""
    parts = urllib.parse.urlsplit(postgresql_url)
    query = urllib.parse.parse_qs(parts.query)
    if "host" not in query or not query["host"][0].startswith("/"):
        pytest.skip("the round-trip proxy needs a server on a Unix socket")
    folder = query["host"][0]
    sockets = [name for name in os.listdir(folder) if name.startswith(".s.PGSQL.")]
    assert sockets, f"no PostgreSQL socket in {folder}"
    proxy_dir = tmp_path / "proxy"
    proxy_dir.mkdir()
    counter = RoundTripCounter(os.path.join(folder, sockets[0]), str(proxy_dir / sockets[0]))
    query["host"] = [str(proxy_dir)]
    url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query, doseq=True)))
    try:
        yield url, counter
    finally:
        counter.close()


def _counted(counter: RoundTripCounter, work: object) -> int:
    """How many round trips ``work`` made: its wall time in units of the proxy's delay."""
    assert callable(work)
    started = time.monotonic()
    work()
    return round((time.monotonic() - started) / DELAY)


def test_a_plain_append_takes_two_round_trips(counted_url: tuple[str, RoundTripCounter]) -> None:
    """Lock and state in one pipeline; insert, count and COMMIT in the other."""
    url, counter = counted_url
    with Store(url) as store:
        store.buffer("s", "", "k").append({"role": "user", "content": "warm up"})
        trips = [  # a fresh handle each time: found by its address, no id cached
            _counted(
                counter,
                lambda i=i: store.buffer("s", "", "k").append({"role": "user", "content": str(i)}),
            )
            for i in range(5)
        ]
    # Wall time only adds to a count (a loaded machine's local work): the fewest is it.
    assert min(trips) <= 2, trips


def test_healing_adds_no_round_trip_per_call(counted_url: tuple[str, RoundTripCounter]) -> None:
    """A user turn healing 1 call and one healing 10 calls take the same round trips
    (lock and state; the unanswered calls with the successor of their turn; the commit)."""
    url, counter = counted_url
    trips = []
    with Store(url) as store:
        warm = store.buffer("s", "", "warm")  # the heal's statements get prepared once
        warm.append({"role": "assistant", "tool_calls": [{"id": "w"}]})
        warm.append({"role": "user", "content": "heal"})
        for k in (1, 10):
            counts = []
            for attempt in range(3):  # the fewest of three: wall time only adds to a count
                buffer = store.buffer("s", "", f"k{k}-{attempt}")
                buffer.append({"role": "user", "content": "go"})
                buffer.append(
                    {"role": "assistant", "tool_calls": [{"id": f"c{i}"} for i in range(k)]}
                )
                counts.append(
                    _counted(
                        counter, lambda b=buffer: b.append({"role": "user", "content": "next"})
                    )
                )
                assert len(buffer.read()) == 3 + k
            trips.append(min(counts))
    assert trips[0] == trips[1] <= 3, trips


def test_reading_the_last_n_is_one_round_trip(counted_url: tuple[str, RoundTripCounter]) -> None:
    """read(limit=N) is one statement keyed by the address, sent outside a transaction."""
    url, counter = counted_url
    with Store(url) as store:
        store.buffer("s", "", "k").append([{"role": "user", "content": str(i)} for i in range(80)])
        store.buffer("s", "", "k").read(limit=50)  # warm up: the statement is prepared
        rows: list[object] = []
        trips = _counted(counter, lambda: rows.extend(store.buffer("s", "", "k").read(limit=50)))
        assert len(rows) == 50
        assert trips == 1, trips

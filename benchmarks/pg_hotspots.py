"""Where an operation's time goes on PostgreSQL: round trips, server time per statement.

Run at the end of ``python -m benchmarks --postgresql`` (:func:`diagnose`), on a
buffer pre-filled with the run's largest size, for flowdrop_local and raw psycopg:

* **Round trips**, from libpq's own protocol trace (``PQtrace``): each run of
  messages the client sends followed by the server's answers is one round trip.
  The table lists what each round trip carries and how long the client waited
  for it (first message sent to last answer read). What is left of the
  operation's traced wall time is the client's own work (Python, psycopg).
* **Server time per statement**, from ``auto_explain`` (loaded into the one
  session that runs the operation, ``log_analyze`` on, plans sent to the client
  as notices): the executor's time of each statement, triggers included.
  ``BEGIN``, ``SET`` and ``COMMIT`` have no plan; a ``COMMIT`` costs the WAL flush.

flowdrop_local runs on a ``psycopg_pool.ConnectionPool`` of one connection that
this module makes (``Store`` accepts a pool), so the traced connection is the one
the store uses.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import psycopg
import psycopg_pool

from .core import declaring_turn, fmt_ns, history
from .server import create_schema, drop_schema
from .systems.pg_flowdrop import ADDRESS
from .systems.pg_raw import INSERT, SCHEMA, SESSION, RawPsycopg

_BODY = "the user's next turn, long enough to look like a real one " * 3
_REPEAT = 30  # untraced repetitions for the wall-time median


@attrs.frozen
class Trip:
    """One round trip: the statements it carried and how long the client waited."""

    statements: tuple[str, ...]
    wait_ns: int


@contextlib.contextmanager
def _traced(conn: psycopg.Connection[Any]) -> Iterator[list[str]]:
    """The libpq trace lines of what ``conn`` sends and receives inside the block."""
    lines: list[str] = []
    with tempfile.NamedTemporaryFile("r", suffix=".trace", encoding="utf-8") as file:
        conn.pgconn.trace(os.open(file.name, os.O_WRONLY))
        try:
            yield lines
        finally:
            conn.pgconn.untrace()
            lines += file.read().splitlines()


def _ns(stamp: str) -> int:
    day, clock = stamp.split(" ")
    seconds = time.mktime(time.strptime(f"{day} {clock.split('.')[0]}", "%Y-%m-%d %H:%M:%S"))
    return int(seconds) * 1_000_000_000 + int(clock.split(".")[1].ljust(9, "0")[:9])


def _statement(line: str, names: dict[str, str]) -> str | None:
    """The SQL a Parse or Bind line runs, shortened; None for other messages."""
    fields = line.split("\t")
    kind = fields[3]
    if kind == "Query":
        return _short(fields[4].strip().strip('"'))
    if kind == "Parse":  # an unnamed statement: the SQL is right there
        name, sql = re.match(r'\s*"([^"]*)" "(.*)" \d+', fields[4], re.S).groups()  # type: ignore[union-attr]
        return None if name else _short(sql)
    if kind == "Bind":
        name = re.match(r'\s*"[^"]*" "([^"]*)"', fields[4]).group(1)  # type: ignore[union-attr]
        return _short(names[name]) if name else None
    return None


def _short(sql: str) -> str:
    sql = " ".join(sql.split())
    return sql if len(sql) <= 70 else sql[:67] + "..."


def _runs(statements: tuple[str, ...]) -> list[tuple[str, int]]:
    """Consecutive repeats of one statement as ``(sql, times)``."""
    runs: list[tuple[str, int]] = []
    for sql in statements:
        if runs and runs[-1][0] == sql:
            runs[-1] = (sql, runs[-1][1] + 1)
        else:
            runs.append((sql, 1))
    return runs


def _trips(lines: list[str], names: dict[str, str]) -> list[Trip]:
    """Split a trace into round trips: sent messages, then the answers to them."""
    trips: list[Trip] = []
    sent: list[str] = []
    first = last = 0
    direction = ""
    for line in lines:
        fields = line.split("\t")
        if len(fields) < 4:
            continue
        stamp, way = _ns(fields[0]), fields[1]
        if way == "F" and direction == "B":  # a new round trip begins
            trips.append(Trip(tuple(sent), last - first))
            sent = []
        if way == "F":
            if direction != "F":
                first = stamp
            statement = _statement(line, names)
            if statement is not None:
                sent.append(statement)
        else:
            last = stamp
        direction = way
    if direction == "B":
        trips.append(Trip(tuple(sent), last - first))
    return trips


def _prepared(conn: psycopg.Connection[Any]) -> dict[str, str]:
    rows = conn.execute("SELECT name, statement FROM pg_prepared_statements").fetchall()
    conn.rollback()
    return {name: statement for name, statement in rows}


def _explained(
    conn: psycopg.Connection[Any], op: Callable[[], object]
) -> list[tuple[str, float, str]]:
    """``op``'s statements, their executor milliseconds and plans, from auto_explain notices."""
    notes: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        notes.append(diag.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        op()
    finally:
        conn.remove_notice_handler(keep)
    found = []
    for note in notes:
        duration = re.search(r"duration: ([0-9.]+) ms", note)
        query = re.search(r"Query Text: (.*?)(?:\n[A-Z][a-z]+ [A-Z]|\n\S|$)", note, re.S)
        if duration and query:
            plan = note[note.index("\n") + 1 :] if "\n" in note else ""
            found.append((_short(query.group(1)), float(duration.group(1)), plan))
    return found


def _auto_explain(conn: psycopg.Connection[Any], on: bool) -> None:
    if on:
        conn.execute("LOAD 'auto_explain'")
    for name, value in (
        ("log_min_duration", "0" if on else "-1"),
        ("log_analyze", "on" if on else "off"),
        ("log_triggers", "on" if on else "off"),
        ("log_nested_statements", "off"),
        ("log_level", "notice"),
    ):
        conn.execute(f"SET auto_explain.{name} = {value}")
    conn.execute(f"SET client_min_messages = {'notice' if on else 'warning'}")
    conn.commit()


def _wall(op: Callable[[], object]) -> float:
    samples = []
    for _ in range(_REPEAT):
        started = time.perf_counter_ns()
        op()
        samples.append(time.perf_counter_ns() - started)
    return float(statistics.median(samples))


def _section(
    title: str, op: Callable[[], object], conn: psycopg.Connection[Any], note: str = ""
) -> list[str]:
    wall = _wall(op)
    with _traced(conn) as lines:
        started = time.perf_counter_ns()
        op()
        traced = time.perf_counter_ns() - started
    trips = _trips(lines, _prepared(conn))
    waited = sum(t.wait_ns for t in trips)
    out = [
        f"**{title}**: {fmt_ns(wall)} untraced (median of {_REPEAT}); {len(trips)} round "
        f"trip{'s' if len(trips) != 1 else ''}; traced {fmt_ns(traced)}, of which "
        f"{fmt_ns(waited)} waiting on the server and {fmt_ns(traced - waited)} in the client."
        + (f" {note}" if note else ""),
        "",
        "| round trip | carries | waited |",
        "|---:|---|---:|",
    ]
    for number, trip in enumerate(trips, 1):
        carried = "; ".join(
            f"`{sql}`" + (f" x{n}" if n > 1 else "") for sql, n in _runs(trip.statements)
        )
        out.append(f"| {number} | {carried or '(a Sync alone)'} | {fmt_ns(trip.wait_ns)} |")
    with contextlib.suppress(psycopg.Error):
        _auto_explain(conn, True)
        try:
            explained = _explained(conn, op)
        finally:
            _auto_explain(conn, False)
        if explained:
            out += ["", "| statement (auto_explain) | executor time (total) |", "|---|---:|"]
            merged: list[tuple[str, int, float]] = []  # consecutive repeats: one row
            for sql, ms, _plan in explained:
                if merged and merged[-1][0] == sql:
                    merged[-1] = (sql, merged[-1][1] + 1, merged[-1][2] + ms)
                else:
                    merged.append((sql, 1, ms))
            out += [
                f"| `{sql}`{f' x{n}' if n > 1 else ''} | {ms * 1000:.1f} µs |"
                for sql, n, ms in merged
            ]
            _sql, ms, plan = max(explained, key=lambda e: e[1])
            if ms >= 0.1:  # worth a look: the slowest statement's plan
                out += ["", "The slowest statement's plan:", "", "```", plan.rstrip(), "```"]
    return [*out, ""]


def diagnose(url: str, size: int) -> list[str]:
    """The markdown of the round-trip and per-statement tables (see the module docstring)."""
    from flowdrop_local import Store

    print(f"\n== PostgreSQL: round trips and statements at {size:,} messages", flush=True)
    messages = history(size)
    flowdrop_url = create_schema(url, "bench_diagnose_flowdrop")
    raw_url = create_schema(url, "bench_diagnose_raw")
    captured: list[psycopg.Connection[Any]] = []
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        flowdrop_url,
        min_size=1,
        max_size=1,
        kwargs={"autocommit": False},
        configure=captured.append,
        open=True,
    )
    store = Store(pool)
    raw = psycopg.connect(raw_url, autocommit=True)
    try:
        buffer = store.buffer(*ADDRESS)
        buffer.append(messages)
        raw.execute(SCHEMA)
        with raw.cursor().copy("COPY messages (session, body) FROM STDIN") as copy:
            for message in messages:
                copy.write_row((SESSION, message_json(message)))
        raw.execute("ANALYZE messages")
        del messages
        (conn,) = captured
        calls = iter(range(10**9))

        def heal() -> None:
            ids = [f"call_diag_{next(calls)}" for _ in range(10)]
            buffer.append(declaring_turn(ids))
            buffer.append({"role": "user", "content": _BODY})

        raw_system = RawPsycopg("server")
        raw_system.conn, raw_system.cursor = raw, raw.cursor()
        out = [
            f"### Where the time goes ({size:,} messages in the buffer)",
            "",
            "From `python -m benchmarks --postgresql` itself (`benchmarks/pg_hotspots.py`): "
            "round trips from libpq's protocol trace, executor time per statement from "
            "`auto_explain` with `log_analyze` (timing on, so a little above the untimed "
            "cost). A `COMMIT` has no plan: its cost, the WAL flush, is in its round trip's "
            "wait.",
            "",
            *_section(
                "flowdrop_local `append(message)`",
                lambda: buffer.append({"role": "user", "content": _BODY}),
                conn,
            ),
            *_section(
                "flowdrop_local healing append, k = 10",
                heal,
                conn,
                "Includes the untimed declaring append of the benchmark, traced here too.",
            ),
            *_section("flowdrop_local `read(limit=50)`", lambda: buffer.read(limit=50), conn),
            *_section(
                "raw psycopg `INSERT`",
                lambda: raw.execute(
                    INSERT, (SESSION, message_json({"role": "user"})), prepare=True
                ),
                raw,
            ),
            *_section("raw psycopg last 50", lambda: raw_system._last(raw_system.cursor, 50), raw),
        ]
    finally:
        store.close()
        pool.close()
        raw.close()
        drop_schema(url, "bench_diagnose_flowdrop")
        drop_schema(url, "bench_diagnose_raw")
    for line in out:
        print(line)
    return out


def message_json(message: dict[str, Any]) -> str:
    """The raw system's row body."""
    import json

    return json.dumps(message)

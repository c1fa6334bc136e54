"""The PostgreSQL section of the suite: ``python -m benchmarks --postgresql [--quick]``.

Every system runs on the same server in one run (:mod:`benchmarks.server`): raw
psycopg (the floor), flowdrop_local, the Agents SDK's ``SQLAlchemySession``,
LangChain's ``PostgresChatMessageHistory`` and LangGraph's ``PostgresSaver``.
The single-connection workloads are the SQLite suite's, run the same way
(:func:`benchmarks.run.run_cell`: warm-up, interleaved shuffled rounds, medians).

Then contention (:func:`contention`): 8 threads, each with its own connection,
append to 8 different buffers, then all 8 to one buffer; throughput is appends per
second of wall time. Raw psycopg locks a per-buffer row (``SELECT ... FOR
UPDATE``), inserts and commits, in one pipelined round trip. Each round runs the
four configurations in a fresh shuffled order; the ratio different / same is
taken per round and per system, and every round is reported.

The report goes into ``benchmarks/RESULTS.md`` between the markers of the
``postgresql`` section, so the SQLite run and this one keep each other's tables.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import random
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import attrs
import psycopg

from . import pg_hotspots, report
from .cells import _show, run_cell
from .core import APPEND, COLD, HEAL_1, HEAL_10, READ, Cell, Unsupported, fmt_ns, history
from .server import ServerSystem, create_schema, drop_schema, server, settings
from .systems import PG_FAMILIES, select
from .systems.pg_flowdrop import ADDRESS
from .systems.pg_raw import INSERT, SCHEMA

WORKLOADS = (APPEND, HEAL_1, HEAL_10, READ, COLD)
_NAMES = {"append": APPEND, "heal1": HEAL_1, "heal10": HEAL_10, "read": READ, "cold": COLD}
_PACKAGES = (
    "psycopg",
    "psycopg-pool",
    "openai-agents",
    "sqlalchemy",
    "asyncpg",
    "langchain-postgres",
    "langgraph",
    "langgraph-checkpoint-postgres",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options only the PostgreSQL section reads."""
    group = parser.add_argument_group("PostgreSQL (--postgresql)")
    group.add_argument(
        "--postgresql",
        action="store_true",
        help="run the PostgreSQL section instead (server: $FLOWDROP_BENCH_POSTGRESQL_URL, "
        "else an embedded one); sizes default to 100,100000",
    )
    group.add_argument("--threads", type=int, default=8, help="contention: threads (8)")
    group.add_argument(
        "--contention-rounds", type=int, help="contention: interleaved rounds (9; 7 with --quick)"
    )
    group.add_argument(
        "--contention-appends",
        type=int,
        help="contention: appends per thread per configuration (40; 10 with --quick)",
    )


# ----------------------------------------------------------------- single connection


def run_sizes(
    systems: list[ServerSystem], args: argparse.Namespace, url: str, rng: random.Random
) -> tuple[list[Cell], dict[tuple[str, int], int]]:
    """Every workload at every size: cells and pre-fill times."""
    cells: list[Cell] = []
    prefill: dict[tuple[str, int], int] = {}
    for size in args.sizes:
        messages = history(size)
        opened: list[tuple[ServerSystem, str]] = []
        print(f"\n== PostgreSQL, {size:,} messages: pre-filling", flush=True)
        for system in systems:
            schema = f"bench_{system.key}_{size}"
            target = create_schema(url, schema)
            started = time.perf_counter_ns()
            try:
                system.connect(target, messages)
            except Exception as error:
                traceback.print_exc()
                print(f"  {system.name}: pre-fill failed: {error}", flush=True)
                drop_schema(url, schema)
                continue
            prefill[(system.key, size)] = time.perf_counter_ns() - started
            opened.append((system, schema))
            print(f"  {system.name:<40} {fmt_ns(prefill[(system.key, size)])}", flush=True)
        for workload in args.workloads:
            ops: dict[str, Any] = {}
            for system, _schema in opened:
                try:
                    ops[system.key] = (system, system.operation(workload))
                except Unsupported:
                    continue
            if ops:
                new = run_cell(workload, size, ops, args, rng, args.rounds)
                _show(new)
                cells.extend(new)
        for system, schema in opened:
            system.close()
            drop_schema(url, schema)
        del messages
        gc.collect()
    return cells, prefill


# ----------------------------------------------------------------------- contention

_LOCK = "SELECT 1 FROM sessions WHERE session = %s FOR UPDATE"
_TEXT = "a turn appended under contention, long enough to look like a real one " * 3


@attrs.frozen
class Round:
    """One contention round: appends per second for each (system, layout)."""

    number: int
    throughput: dict[tuple[str, str], float]

    def ratio(self, system: str) -> float:
        """Different buffers over one buffer, for ``system``."""
        return self.throughput[(system, "different")] / self.throughput[(system, "same")]


class _Contender:
    """One system's writers: ``writer(thread, buffer)`` makes a thread's append function."""

    name: str

    def writer(self, thread: int, buffer: int) -> Callable[[int], None]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _RawContender(_Contender):
    """Per thread an autocommit connection; an append is BEGIN, row lock, INSERT, COMMIT."""

    name = "raw"

    def __init__(self, url: str, threads: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute("CREATE TABLE sessions (session text PRIMARY KEY)")
            conn.execute(
                "INSERT INTO sessions SELECT 'buffer-' || i FROM generate_series(0, %s) AS i",
                (threads,),
            )
        self.conns = [psycopg.connect(url, autocommit=True) for _ in range(threads)]

    def writer(self, thread: int, buffer: int) -> Callable[[int], None]:
        conn = self.conns[thread]
        cursor = conn.cursor()
        session = f"buffer-{buffer}"

        def append(i: int) -> None:
            body = f'{{"role": "user", "content": "{i}: {_TEXT}"}}'
            with conn.pipeline():
                cursor.execute("BEGIN")
                cursor.execute(_LOCK, (session,), prepare=True)
                cursor.execute(INSERT, (session, body), prepare=True)
                cursor.execute("COMMIT")

        return append

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


class _FlowdropContender(_Contender):
    """Per thread a ``Store`` (one pooled connection in use), ``buffer.append``."""

    name = "flowdrop"

    def __init__(self, url: str, threads: int) -> None:
        from flowdrop_local import Store

        self.stores = [Store(url) for _ in range(threads)]
        for buffer in range(threads + 1):  # create every buffer before the clock runs
            self.stores[0].buffer(*self._address(buffer)).append(
                {"role": "user", "content": "the first turn"}
            )

    @staticmethod
    def _address(buffer: int) -> tuple[str, str, str]:
        return (ADDRESS[0], f"u-{buffer}", ADDRESS[2])

    def writer(self, thread: int, buffer: int) -> Callable[[int], None]:
        handle = self.stores[thread].buffer(*self._address(buffer))

        def append(i: int) -> None:
            handle.append({"role": "user", "content": f"{i}: {_TEXT}"})

        return append

    def close(self) -> None:
        for store in self.stores:
            store.close()


def _burst(contender: _Contender, layout: str, threads: int, appends: int) -> float:
    """``threads`` threads append ``appends`` times each; appends per second of wall time."""
    shared = threads  # the one buffer every thread shares in the "same" layout
    writers = [contender.writer(t, t if layout == "different" else shared) for t in range(threads)]
    barrier = threading.Barrier(threads + 1)
    ended = [0] * threads
    failures: list[BaseException] = []

    def work(t: int) -> None:
        append = writers[t]
        barrier.wait()
        try:
            for i in range(appends):
                append(i)
        except BaseException as error:
            failures.append(error)
        ended[t] = time.perf_counter_ns()

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    started = time.perf_counter_ns()
    for thread in pool:
        thread.join()
    if failures:
        raise failures[0]
    return threads * appends / ((max(ended) - started) / 1e9)


def contention(url: str, args: argparse.Namespace, rng: random.Random) -> list[Round]:
    """The contention rounds of raw psycopg and flowdrop_local (see the module docstring)."""
    threads, appends = args.threads, args.contention_appends
    print(
        f"\n== PostgreSQL contention: {threads} threads x {appends} appends, "
        f"{args.contention_rounds} rounds",
        flush=True,
    )
    contenders: list[_Contender] = [
        _RawContender(create_schema(url, "bench_contention_raw"), threads),
        _FlowdropContender(create_schema(url, "bench_contention_flowdrop"), threads),
    ]
    configs = [(c, layout) for c in contenders for layout in ("different", "same")]
    try:
        for contender, layout in configs:  # warm-up: connections, prepared statements
            _burst(contender, layout, threads, max(2, appends // 4))
        rounds: list[Round] = []
        for number in range(1, args.contention_rounds + 1):
            order = list(configs)
            rng.shuffle(order)
            gc.collect()
            measured = {
                (c.name, layout): _burst(c, layout, threads, appends) for c, layout in order
            }
            rounds.append(Round(number, measured))
            print(
                f"  round {number}: "
                + ", ".join(
                    f"{name} {measured[(name, 'different')]:,.0f}/s vs "
                    f"{measured[(name, 'same')]:,.0f}/s = x{rounds[-1].ratio(name):.2f}"
                    for name in ("raw", "flowdrop")
                ),
                flush=True,
            )
    finally:
        for contender in contenders:
            contender.close()
        drop_schema(url, "bench_contention_raw")
        drop_schema(url, "bench_contention_flowdrop")
    return rounds


# --------------------------------------------------------------------------- report


def _median(index: dict[tuple[str, int, str], Cell], workload: str, size: int, key: str) -> float:
    cell = index.get((workload, size, key))
    return cell.median if cell is not None and cell.samples else 0.0


def _headline(cells: list[Cell], index: dict[tuple[str, int, str], Cell]) -> list[str]:
    sizes = sorted({c.size for c in cells})
    small, large = sizes[0], sizes[-1]
    lines = [
        f"| system | append, {small:,} in the buffer | append, {large:,} | "
        f"read last 50 of {large:,} | open cold + read 50 of {large:,} |",
        "|---|---|---|---|---|",
    ]
    names = {c.system: c.name for c in cells}
    for key in sorted(names, key=lambda k: list(PG_FAMILIES).index(k)):
        cols = []
        for workload, size in ((APPEND, small), (APPEND, large), (READ, large), (COLD, large)):
            cell = index.get((workload, size, key))
            if cell is None:
                cols.append("")
            elif not cell.samples:
                cols.append("skipped")
            elif key == "raw":
                cols.append(fmt_ns(cell.median))
            else:
                floor = _median(index, workload, size, "raw")
                ratio = f" ({cell.median / floor:.2f}x)" if floor else ""
                cols.append(f"{fmt_ns(cell.median)}{ratio}")
        label = f"**{names[key]}**" if key == "flowdrop" else names[key]
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
    return lines


def _verdict(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _targets(
    cells: list[Cell], index: dict[tuple[str, int, str], Cell], rounds: list[Round]
) -> list[str]:
    lines = ["| target (issue 9) | measured | met |", "|---|---|---|"]
    sizes = sorted({c.size for c in cells})
    for size in sizes:
        ours, floor = _median(index, APPEND, size, "flowdrop"), _median(index, APPEND, size, "raw")
        if ours and floor:
            lines.append(
                f"| append <= 2x raw psycopg, {size:,} msgs | {ours / floor:.2f}x "
                f"({fmt_ns(ours)} vs {fmt_ns(floor)}) | {_verdict(ours / floor <= 2)} |"
            )
    if len(sizes) > 1:
        first, last = (_median(index, APPEND, s, "flowdrop") for s in (sizes[0], sizes[-1]))
        raw_first, raw_last = (_median(index, APPEND, s, "raw") for s in (sizes[0], sizes[-1]))
        if first and last and raw_first and raw_last:
            # Within 1.2x, or within 1.2x of raw's own move: the machine moves both alike.
            allowed = 1.2 * max(1.0, raw_last / raw_first)
            lines.append(
                f"| append flat, {sizes[0]:,} -> {sizes[-1]:,} msgs (within 1.2x of raw "
                f"psycopg's own move, at least 1.2x) | {last / first:.2f}x (raw psycopg "
                f"{raw_last / raw_first:.2f}x) | {_verdict(last / first <= allowed)} |"
            )
    large = sizes[-1]
    ours, floor = _median(index, READ, large, "flowdrop"), _median(index, READ, large, "raw")
    if ours and floor:
        lines.append(
            f"| read(limit=50) <= 1.5x raw psycopg, {large:,} msgs | {ours / floor:.2f}x "
            f"({fmt_ns(ours)} vs {fmt_ns(floor)}) | {_verdict(ours / floor <= 1.5)} |"
        )
    if rounds:
        raw = statistics.median(r.ratio("raw") for r in rounds)
        ours = statistics.median(r.ratio("flowdrop") for r in rounds)
        lines.append(
            f"| 8 buffers / 1 buffer throughput >= 70% of raw's ratio ({len(rounds)} rounds) | "
            f"flowdrop x{ours:.2f}, raw x{raw:.2f}: {ours / raw:.0%} | "
            f"{_verdict(ours / raw >= 0.7)} |"
        )
    return lines


def _contention_table(rounds: list[Round], threads: int) -> list[str]:
    lines = [
        f"| round | raw, {threads} buffers | raw, 1 buffer | raw ratio "
        f"| flowdrop, {threads} buffers | flowdrop, 1 buffer | flowdrop ratio | flowdrop / raw |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        t = r.throughput
        lines.append(
            f"| {r.number} | {t[('raw', 'different')]:,.0f}/s | {t[('raw', 'same')]:,.0f}/s "
            f"| {r.ratio('raw'):.2f} | {t[('flowdrop', 'different')]:,.0f}/s "
            f"| {t[('flowdrop', 'same')]:,.0f}/s | {r.ratio('flowdrop'):.2f} "
            f"| {r.ratio('flowdrop') / r.ratio('raw'):.0%} |"
        )

    def med(system: str, layout: str) -> str:
        return f"{statistics.median(r.throughput[(system, layout)] for r in rounds):,.0f}/s"

    raw = statistics.median(r.ratio("raw") for r in rounds)
    ours = statistics.median(r.ratio("flowdrop") for r in rounds)
    lines.append(
        f"| **median** | {med('raw', 'different')} | {med('raw', 'same')} | **{raw:.2f}** "
        f"| {med('flowdrop', 'different')} | {med('flowdrop', 'same')} | **{ours:.2f}** "
        f"| **{ours / raw:.0%}** |"
    )
    return lines


def render(
    *,
    cells: list[Cell],
    prefill: dict[tuple[str, int], int],
    rounds: list[Round],
    systems: list[ServerSystem],
    missing: dict[str, str],
    args: argparse.Namespace,
    command: str,
    elapsed: float,
    machine_lines: list[str],
    server_line: str,
    diagnosis: list[str],
) -> str:
    """The PostgreSQL section of the report (markdown, level-2 headings)."""
    index = report._index(cells)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "## PostgreSQL",
        "",
        f"- Date: {now}; the run took {elapsed / 60:.1f} min",
        *machine_lines,
        f"- Server: {server_line}; every system on it in the same run, each in a schema "
        "of its own per history length",
        f"- Command: `{command}` (from the repository root, after `pip install -e '.[bench]'`)",
        f"- Rounds: up to {args.rounds} per cell, interleaved and shuffled per round (seed "
        f"{args.seed}); one untimed warm-up each; at most {args.budget:g} s per system and "
        "cell (column n), flowdrop_local and raw psycopg always do at least 3",
        "- `x raw` is the median over raw psycopg's median: one prepared `INSERT` on an "
        "autocommit connection (the statement commits in the round trip that sends it) "
        "into `(id bigserial PRIMARY KEY, session text, body text)` indexed on "
        "`(session, id)`; its read is `ORDER BY id DESC LIMIT 50` on that index.",
        "",
        "### Headline",
        "",
        *_headline(cells, index),
        "",
        "### Targets",
        "",
        *_targets(cells, index, rounds),
        "",
    ]
    titles = {
        APPEND: "Append one message",
        HEAL_1: "User append healing k = 1 dangling call",
        HEAL_10: "User append healing k = 10 dangling calls",
        READ: "Read the last 50 messages",
        COLD: "Open cold (new connection or pool, new library object), read the last 50",
    }
    notes = {
        HEAL_1: "Raw's equivalent inserts k placeholder rows and the user row in one "
        "pipelined transaction (one round trip).",
        READ: "LangChain has no last-N read: `history.messages[-50:]` loads the whole "
        "session. LangGraph's `get_state` loads the latest checkpoint, the whole list.",
        COLD: "flowdrop_local's figure includes opening its pool and checking the schema "
        "version; the close happens after the timer.",
    }
    for workload in WORKLOADS:
        if any(c.workload == workload for c in cells):
            out += [f"### {titles[workload]}", ""]
            if workload in notes:
                out += [notes[workload], ""]
            out += [*report._workload_table(workload, cells, index), ""]
    if rounds:
        out += [
            f"### Contention: {args.threads} threads on {args.threads} buffers vs on one",
            "",
            f"Each thread has its own connection (flowdrop_local: a `Store` each) and "
            f"appends {args.contention_appends} times; throughput is all appends over the "
            "wall time from a common start to the last thread's end. Raw psycopg sends "
            "`BEGIN`, `SELECT 1 FROM sessions WHERE session = %s FOR UPDATE`, the `INSERT` "
            "and `COMMIT` in one pipeline (one round trip, the lock held only while the "
            "server runs them). The four configurations run in a new shuffled order each "
            "round; the ratio is taken within a round.",
            "",
            *_contention_table(rounds, args.threads),
            "",
        ]
    if diagnosis:
        out += [*diagnosis, ""]
    out += [
        "### Systems",
        "",
        "| system | driver | pre-fill, one untimed call |",
        "|---|---|---|",
    ]
    for system in systems:
        times = ", ".join(
            f"{size:,}: {fmt_ns(ns)}"
            for (k, size), ns in sorted(prefill.items())
            if k == system.key
        )
        out.append(f"| {system.name} | {system.pragmas()} | {times} |")
    skipped = [c for c in report._ordered(cells) if c.skipped is not None]
    if skipped or missing:
        out += ["", "### Skipped", ""]
        out += [f"- {c.name}, {c.workload}, {c.size:,} messages: {c.skipped}" for c in skipped]
        out += [f"- {name}: {why}" for name, why in missing.items()]
    return "\n".join(out) + "\n"


def _machine(lines: list[str]) -> list[str]:
    """The suite's machine lines, with this section's peers instead of SQLite's."""
    import importlib.metadata

    versions = []
    for package in _PACKAGES:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    kept = [line for line in lines if not line.startswith("- Peers")]
    return [*kept, f"- Peers: {', '.join(versions)}"]


def main(args: argparse.Namespace, command: str) -> int:
    """Run the PostgreSQL section; print every cell, then the section; write it into ``--out``."""
    from pathlib import Path

    systems_any, missing = select(args.systems.split(","), PG_FAMILIES)
    systems = [s for s in systems_any if isinstance(s, ServerSystem)]
    for name, why in missing.items():
        print(f"skipping {name}: {why}")
    rng = random.Random(args.seed)
    machine_lines = _machine(report.machine())
    started = time.monotonic()
    with server() as url:
        server_line = settings(url)
        print(f"server: {server_line}", flush=True)
        cells, prefill = run_sizes(systems, args, url, rng)
        rounds = contention(url, args, rng) if args.contention_rounds else []
        diagnosis = pg_hotspots.diagnose(url, max(args.sizes))
    elapsed = time.monotonic() - started
    text = render(
        cells=cells,
        prefill=prefill,
        rounds=rounds,
        systems=systems,
        missing=missing,
        args=args,
        command=command,
        elapsed=elapsed,
        machine_lines=machine_lines,
        server_line=server_line,
        diagnosis=diagnosis,
    )
    print("\n" + text)
    if args.out:
        report.write_section(Path(args.out), "postgresql", text)
        print(f"wrote the postgresql section of {args.out} ({elapsed:.0f} s)")
    else:
        print(f"done in {elapsed:.0f} s")
    return 0

"""The benchmark suite of issue 4: ``python -m benchmarks [--quick] ...``.

For each history length, every system gets its own file, pre-filled through its
fastest legitimate path (one batch call, untimed). Then each workload runs
interleaved: in round r every system does one timed operation, in a freshly
shuffled order, so machine noise (other work on the two cores) hits all systems
alike. One untimed warm-up operation per system comes first; it also sizes the
time budget: a system runs at most as many rounds as ``--budget`` seconds hold,
and a peer library whose operation is so slow that they hold fewer than
``MIN_ROUNDS`` is skipped for that cell, and says so. flowdrop_local and raw
sqlite3 always run at least ``MIN_ROUNDS``.

Appends grow the buffers as rounds go by (one message a round, k + 2 for a
healing round); the sizes are the lengths before the first round.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from . import postgresql, report
from .cells import _show, run_cell
from .core import (
    APPEND,
    COLD,
    HEAL_1,
    HEAL_10,
    IMPORT,
    READ,
    Cell,
    System,
    Unsupported,
    fmt_ns,
    history,
    remove_database,
)
from .systems import FAMILIES, select

_WORKLOAD_NAMES = {
    "append": APPEND,
    "heal1": HEAL_1,
    "heal10": HEAL_10,
    "read": READ,
    "cold": COLD,
    "import": IMPORT,
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="flowdrop_local vs raw sqlite3 vs the peer libraries (issue 4); "
        "with --postgresql, vs raw psycopg and the peers' PostgreSQL stores (issue 9).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="sizes 100,10000, 12 rounds, 1 s budget, import of 10,000: under a minute; "
        "writes no file unless --out is given",
    )
    parser.add_argument("--sizes", help="history lengths, comma-separated (100,10000,100000)")
    parser.add_argument("--rounds", type=int, help="timed operations per system and cell (50)")
    parser.add_argument(
        "--budget", type=float, help="seconds one system may spend on one cell (30)"
    )
    parser.add_argument("--import-size", type=int, help="messages in the batch import (100000)")
    parser.add_argument("--import-rounds", type=int, help="rounds of the batch import (10)")
    parser.add_argument(
        "--systems",
        default=",".join(FAMILIES),
        help=f"comma-separated: {', '.join(FAMILIES)}, or e.g. flowdrop-normal (all)",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(_WORKLOAD_NAMES),
        help=f"comma-separated: {', '.join(_WORKLOAD_NAMES)} (all)",
    )
    parser.add_argument("--out", help="markdown report (benchmarks/RESULTS.md; none with --quick)")
    parser.add_argument("--seed", type=int, default=4, help="seed of the round shuffles (4)")
    parser.add_argument("--workdir", help="where the database files go (a temporary directory)")
    postgresql.add_arguments(parser)
    args = parser.parse_args(argv)
    quick = args.quick
    sizes = ("100,10000" if quick else "100,10000,100000") if not args.postgresql else "100,100000"
    args.sizes = [int(s) for s in (args.sizes or sizes).split(",")]
    args.contention_rounds = args.contention_rounds or (7 if quick else 9)
    args.contention_appends = args.contention_appends or (10 if quick else 40)
    args.rounds = args.rounds or (12 if quick else 50)
    args.budget = args.budget or (1.0 if quick else 30.0)
    args.import_size = args.import_size or (10_000 if quick else 100_000)
    args.import_rounds = args.import_rounds or (3 if quick else 10)
    if args.out is None and not quick:
        args.out = str(Path(__file__).with_name("RESULTS.md"))
    try:
        args.workloads = [_WORKLOAD_NAMES[w] for w in args.workloads.split(",")]
    except KeyError as error:
        parser.error(f"unknown workload {error}; choose from {', '.join(_WORKLOAD_NAMES)}")
    if args.postgresql:  # no batch import there: each round would need a schema of its own
        args.workloads = [w for w in args.workloads if w in postgresql.WORKLOADS]
    return args


def run_sizes(
    systems: list[System], args: argparse.Namespace, workdir: Path, rng: random.Random
) -> tuple[list[Cell], dict[tuple[str, int], int], dict[str, str]]:
    """Every workload but the import, at every size: cells, pre-fill times, pragmas."""
    cells: list[Cell] = []
    prefill: dict[tuple[str, int], int] = {}
    pragmas: dict[str, str] = {}
    for size in args.sizes:
        messages = history(size)
        opened: list[System] = []
        print(f"\n== {size:,} messages: pre-filling", flush=True)
        for system in systems:
            path = workdir / f"{system.key}-{size}.db"
            remove_database(path)
            started = time.perf_counter_ns()
            try:
                system.open(path, messages)
            except Exception as error:
                traceback.print_exc()
                print(f"  {system.name}: pre-fill failed: {error}", flush=True)
                continue
            prefill[(system.key, size)] = time.perf_counter_ns() - started
            pragmas[system.key] = system.pragmas()
            opened.append(system)
            print(f"  {system.name:<40} {fmt_ns(prefill[(system.key, size)])}", flush=True)
        for workload in args.workloads:
            if workload == IMPORT:
                continue
            ops: dict[str, tuple[System, Callable[[], int]]] = {}
            for system in opened:
                try:
                    ops[system.key] = (system, system.operation(workload))
                except Unsupported:
                    continue
            if not ops:
                continue
            new = run_cell(workload, size, ops, args, rng, args.rounds)
            _show(new)
            cells.extend(new)
        for system in opened:
            system.close()
            assert system.path is not None
            remove_database(system.path)
        del messages
        gc.collect()
    return cells, prefill, pragmas


def run_import(
    systems: list[System], args: argparse.Namespace, workdir: Path, rng: random.Random
) -> tuple[list[Cell], dict[str, float]]:
    """Import ``--import-size`` messages in one call into a new file, per round.

    Also returns each system's file size per message after its import (the store
    closed, so its WAL is checkpointed into the file).
    """
    messages = history(args.import_size)
    print(f"\n== import of {args.import_size:,} messages in one batch", flush=True)
    footprint: dict[str, float] = {}

    def importer(system: System) -> Callable[[], int]:
        counter = itertools.count()

        def op() -> int:
            path = workdir / f"import-{system.key}-{next(counter)}.db"
            try:
                elapsed = system.import_batch(path, messages)
                footprint[system.key] = path.stat().st_size / len(messages)
                return elapsed
            finally:
                remove_database(path)

        return op

    ops = {system.key: (system, importer(system)) for system in systems}
    cells = run_cell(IMPORT, args.import_size, ops, args, rng, args.import_rounds)
    _show(cells)
    for key, size in sorted(footprint.items()):
        print(f"  {key:<40} {size:.0f} bytes per message on disk", flush=True)
    return cells, footprint


def main(argv: list[str] | None = None) -> int:
    """Run the suite; print every cell as it finishes, then the tables; write ``--out``."""
    args = _parse(argv)
    command = "python -m benchmarks" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
    )
    if args.postgresql:
        return postgresql.main(args, command)
    systems, missing = select(args.systems.split(","))
    for name, why in missing.items():
        print(f"skipping {name}: {why}", file=sys.stderr)
    rng = random.Random(args.seed)
    machine_lines = report.machine()  # before the run: the sources may change meanwhile
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flowdrop-bench-", dir=args.workdir) as tmp:
        workdir = Path(tmp)
        cells, prefill, pragmas = run_sizes(systems, args, workdir, rng)
        footprint: dict[str, float] = {}
        if IMPORT in args.workloads:
            imported, footprint = run_import(systems, args, workdir, rng)
            cells.extend(imported)
    elapsed = time.monotonic() - started
    text = report.render(
        cells=cells,
        prefill=prefill,
        pragmas=pragmas,
        names={s.key: s.name for s in systems},
        missing=missing,
        args=args,
        command=command,
        elapsed=elapsed,
        machine_lines=machine_lines,
        footprint=footprint,
    )
    print("\n" + text)
    if args.out:
        report.write(Path(args.out), text)
        print(f"wrote {args.out} ({elapsed:.0f} s)")
    else:
        print(f"done in {elapsed:.0f} s")
    return 0

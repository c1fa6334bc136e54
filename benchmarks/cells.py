"""Running one cell of the suite (one workload, one size, every system, interleaved
rounds) and printing it: shared by the SQLite run (run.py) and the PostgreSQL one
(postgresql.py)."""

from __future__ import annotations

import argparse
import gc
import random
import time
import traceback
import tracemalloc
from collections.abc import Callable

from .core import COLD, READ, Cell, System, fmt_bytes, fmt_ns

MIN_ROUNDS = 3


def _print_cell(cell: Cell, raw: Cell | None) -> None:
    head = f"  {cell.workload:<26} {cell.size:>7,}  {cell.name:<40}"
    if cell.skipped is not None:
        print(f"{head} skipped: {cell.skipped}", flush=True)
        return
    ratio = ""
    if raw is not None and raw.samples:
        ratio = f"  x{cell.median / raw.median:.2f} raw"
    memory = "" if cell.peak_bytes is None else f"  peak {fmt_bytes(cell.peak_bytes)}"
    print(
        f"{head} n={len(cell.samples):<3} median {fmt_ns(cell.median):>10}"
        f"  p95 {fmt_ns(cell.p95):>10}{ratio}{memory}",
        flush=True,
    )


def _peak_memory(op: Callable[[], int]) -> int:
    """Peak bytes Python allocates during one ``op`` (tracemalloc; SQLite's own cache excluded)."""
    gc.collect()
    tracemalloc.start()
    try:
        op()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run_cell(
    workload: str,
    size: int,
    ops: dict[str, tuple[System, Callable[[], int]]],
    args: argparse.Namespace,
    rng: random.Random,
    rounds: int,
) -> list[Cell]:
    """Warm up and size each system, then run the rounds interleaved; one Cell per system."""
    budget_ns = args.budget * 1e9
    planned: dict[str, int] = {}
    skipped: dict[str, str] = {}
    for key, (system, op) in ops.items():
        gc.collect()
        started = time.perf_counter_ns()
        try:
            op()
        except Exception as error:
            traceback.print_exc()
            skipped[key] = f"failed: {type(error).__name__}: {error}"
            continue
        wall = max(1, time.perf_counter_ns() - started)
        n = min(rounds, int(budget_ns // wall))
        if system.measured_always:
            n = max(n, min(rounds, MIN_ROUNDS))
        if n < MIN_ROUNDS:
            skipped[key] = (
                f"one operation took {fmt_ns(wall)}; {MIN_ROUNDS} rounds would exceed "
                f"the {args.budget:g} s budget"
            )
        else:
            planned[key] = n
    samples: dict[str, list[int]] = {key: [] for key in planned}
    gc.collect()
    for r in range(max(planned.values(), default=0)):
        order = [key for key, n in planned.items() if n > r and key not in skipped]
        rng.shuffle(order)
        for key in order:
            try:
                samples[key].append(ops[key][1]())
            except Exception as error:
                traceback.print_exc()
                skipped[key] = f"failed in round {r}: {type(error).__name__}: {error}"
    peaks: dict[str, int] = {}
    if workload in (READ, COLD):
        for key in planned:
            if key not in skipped:
                peaks[key] = _peak_memory(ops[key][1])
    cells = []
    for key, (system, _op) in ops.items():
        cells.append(
            Cell(
                workload=workload,
                size=size,
                system=key,
                name=system.name,
                floor=system.floor,
                samples=tuple(samples.get(key, ())) if key not in skipped else (),
                skipped=skipped.get(key),
                peak_bytes=peaks.get(key),
            )
        )
    return cells


def _show(cells: list[Cell]) -> None:
    by_key = {cell.system: cell for cell in cells}
    for cell in cells:
        _print_cell(cell, by_key.get(cell.floor))

"""The markdown report: machine, command, headline, one table per workload, the targets.

``write`` replaces ``RESULTS.md`` but keeps the sections that ``benchmarks.keys``,
``benchmarks.hotspots`` and ``benchmarks.memory`` maintain between their markers
(:func:`write_section`).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import os
import platform
import sqlite3
import subprocess
from pathlib import Path

from .core import APPEND, COLD, HEAL_1, HEAL_10, IMPORT, READ, WORKLOADS, Cell, fmt_bytes, fmt_ns

SECTIONS = ("keys", "hotspots", "memory", "postgresql", "migration", "sync", "append_kinds")
"""Sections other scripts own, kept when the suite rewrites the report."""
_ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = (
    "openai-agents",
    "langchain-community",
    "langchain-core",
    "sqlalchemy",
    "langgraph",
    "langgraph-checkpoint-sqlite",
    "sqlite-utils",
)
_ORDER = (
    "flowdrop-normal",
    "flowdrop-full",
    "flowdrop",
    "raw-normal",
    "raw-full",
    "raw",
    "agents",
    "langchain",
    "langgraph",
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _flowdrop_version() -> str:
    """The commit, and a hash of the package sources (the tree may hold uncommitted work)."""
    digest = hashlib.sha256()
    for source in sorted((_ROOT / "flowdrop_local").rglob("*.py")):
        digest.update(source.read_bytes())
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return f"commit {commit}, sources sha256 {digest.hexdigest()[:12]}"


def machine() -> list[str]:
    """Lines describing where the numbers were taken."""
    versions = []
    for package in _PACKAGES:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return [
        f"- Machine: {os.cpu_count()} CPUs (`nproc`), {_cpu_model()}, {platform.platform()}",
        f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}",
        f"- flowdrop_local: {_flowdrop_version()}",
        f"- Peers: {', '.join(versions)}",
    ]


def _ordered(cells: list[Cell]) -> list[Cell]:
    rank = {key: i for i, key in enumerate(_ORDER)}
    return sorted(cells, key=lambda c: (c.size, rank.get(c.system, len(rank)), c.system))


def _index(cells: list[Cell]) -> dict[tuple[str, int, str], Cell]:
    return {(c.workload, c.size, c.system): c for c in cells}


def _ratio(cell: Cell, index: dict[tuple[str, int, str], Cell]) -> float | None:
    raw = index.get((cell.workload, cell.size, cell.floor))
    if raw is None or not raw.samples or not cell.samples:
        return None
    return cell.median / raw.median


def _workload_table(
    workload: str, cells: list[Cell], index: dict[tuple[str, int, str], Cell]
) -> list[str]:
    memory = workload in (READ, COLD)
    head = "| system | messages | n | median | p95 | x raw |" + (" peak memory |" if memory else "")
    rule = "|---|---:|---:|---:|---:|---:|" + ("---:|" if memory else "")
    lines = [head, rule]
    for cell in _ordered([c for c in cells if c.workload == workload]):
        if cell.skipped is not None:
            lines.append(
                f"| {cell.name} | {cell.size:,} | 0 | skipped | | |" + (" |" if memory else "")
            )
            continue
        ratio = _ratio(cell, index)
        row = (
            f"| {cell.name} | {cell.size:,} | {len(cell.samples)} | {fmt_ns(cell.median)} "
            f"| {fmt_ns(cell.p95)} | {'' if ratio is None else f'{ratio:.2f}'} |"
        )
        if memory:
            row += f" {'' if cell.peak_bytes is None else fmt_bytes(cell.peak_bytes)} |"
        lines.append(row)
    return lines


def _headline(cells: list[Cell], index: dict[tuple[str, int, str], Cell]) -> list[str]:
    sizes = sorted({c.size for c in cells if c.workload != IMPORT})
    if not sizes:
        return []
    small, large = sizes[0], sizes[-1]
    growth = [f"append cost {small:,} -> {s:,}" for s in sizes[1:]]
    lines = [
        f"| | append one message ({small:,}) | x raw | read last 50 of {large:,} | x raw |"
        + "".join(f" {g} |" for g in growth),
        "|---|---:|---:|---:|---:|" + "---:|" * len(growth),
    ]
    systems = {c.system: c.name for c in cells}
    for key in sorted(systems, key=lambda k: _ORDER.index(k) if k in _ORDER else 99):
        base = index.get((APPEND, small, key))
        read = index.get((READ, large, key))
        cols = []
        for cell in (base, read):
            if cell is None or not cell.samples:
                cols += ["skipped" if cell is not None else "", ""]
            else:
                ratio = _ratio(cell, index)
                cols += [fmt_ns(cell.median), "" if ratio is None else f"{ratio:.2f}"]
        for size in sizes[1:]:
            later = index.get((APPEND, size, key))
            if base is None or later is None or not base.samples or not later.samples:
                cols.append("")
            else:
                cols.append(f"{later.median / base.median:.2f}x")
        lines.append(f"| {systems[key]} | " + " | ".join(cols) + " |")
    return lines


def _targets(
    cells: list[Cell], index: dict[tuple[str, int, str], Cell], footprint: dict[str, float]
) -> list[str]:
    """Issue 11's targets (schema version 3), each judged from this run's medians."""
    lines = ["| target | flowdrop_local | measured | met |", "|---|---|---|---|"]
    sizes = sorted({c.size for c in cells if c.workload != IMPORT})

    def median(workload: str, size: int, key: str) -> float | None:
        cell = index.get((workload, size, key))
        return cell.median if cell is not None and cell.samples else None

    def row(target: str, who: str, measured: str, ok: bool | None) -> None:
        verdict = "inconclusive" if ok is None else "yes" if ok else "**no**"
        lines.append(f"| {target} | {who} | {measured} | {verdict} |")

    for durability, limit in (("normal", 1.75), ("full", 1.3)):
        key, raw = f"flowdrop-{durability}", f"raw-{durability}"
        for size in sizes:
            ours, floor = median(APPEND, size, key), median(APPEND, size, raw)
            if ours and floor:
                ratio = ours / floor
                stretch = " (stretch 1.5x met)" if durability == "normal" and ratio <= 1.5 else ""
                row(
                    f"append <= {limit}x raw, {size:,} msgs",
                    durability,
                    f"{ratio:.2f}x{stretch}",
                    ratio <= limit,
                )
        if len(sizes) > 1:
            small, large = sizes[0], sizes[-1]
            ours_growth = (median(APPEND, large, key) or 0) / (median(APPEND, small, key) or 1)
            raw_growth = (median(APPEND, large, raw) or 0) / (median(APPEND, small, raw) or 1)
            if ours_growth and raw_growth:
                row(
                    f"append growth {small:,} -> {large:,} within 1.2x of raw's growth",
                    durability,
                    f"{ours_growth:.2f}x vs raw {raw_growth:.2f}x "
                    f"({ours_growth / raw_growth:.2f})",
                    ours_growth / raw_growth <= 1.2,
                )
            first, last = median(HEAL_10, small, key), median(HEAL_10, large, key)
            if first and last:
                row(
                    f"{HEAL_10} at {large:,} msgs within 1.2x of {small:,}",
                    durability,
                    f"{last / first:.2f}x",
                    last / first <= 1.2,
                )
        large = sizes[-1] if sizes else None
        if large is not None:
            for workload, limit_read, label in (
                (READ, 1.2, "read(limit=50)"),
                (COLD, 1.5, "cold open + read(limit=50)"),
            ):
                ours, floor = median(workload, large, key), median(workload, large, raw)
                if ours and floor:
                    row(
                        f"{label} <= {limit_read}x raw, {large:,} msgs",
                        durability,
                        f"{ours / floor:.2f}x",
                        ours / floor <= limit_read,
                    )
        imports = [c for c in cells if c.workload == IMPORT and c.system == key and c.samples]
        for cell in imports:
            floor = median(IMPORT, cell.size, raw)
            if floor:
                row(
                    f"import of {cell.size:,} <= 3x raw executemany",
                    durability,
                    f"{cell.median / floor:.2f}x",
                    cell.median / floor <= 3,
                )
        if key in footprint and raw in footprint:
            ratio = footprint[key] / footprint[raw]
            row(
                "file size per message <= 1.3x raw's (after the import)",
                durability,
                f"{footprint[key]:.0f} vs {footprint[raw]:.0f} bytes ({ratio:.2f}x)",
                ratio <= 1.3,
            )
    for durability in ("normal", "full"):
        floors = [m for size in sizes if (m := median(APPEND, size, f"raw-{durability}"))]
        if len(floors) > 1 and max(floors) > 2 * min(floors):
            lines += [
                "",
                f"Raw sqlite3's own append (synchronous={durability.upper()}) ranged from "
                f"{fmt_ns(min(floors))} to {fmt_ns(max(floors))} across the sizes of this run, "
                "although its work does not change with the size: the disk's sync latency "
                "varied (the machine is shared). Ratios at this setting are dominated by that "
                "noise; read them with the p95 columns.",
            ]
    return lines


def render(
    *,
    cells: list[Cell],
    prefill: dict[tuple[str, int], int],
    pragmas: dict[str, str],
    names: dict[str, str],
    missing: dict[str, str],
    args: argparse.Namespace,
    command: str,
    elapsed: float,
    machine_lines: list[str],
    footprint: dict[str, float] | None = None,
) -> str:
    """The whole report, without the position-key section."""
    index = _index(cells)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Benchmark results",
        "",
        f"- Date: {now}; the run took {elapsed / 60:.1f} min",
        *machine_lines,
        f"- Command: `{command}` (from the repository root, after `pip install -e '.[bench]'`)",
        f"- Rounds: up to {args.rounds} per cell ({args.import_rounds} for the import), "
        f"interleaved and shuffled per round (seed {args.seed}); one untimed warm-up each; "
        f"a system gets at most {args.budget:g} s per cell, so slow ones run fewer rounds "
        "(column n); a peer that cannot do 3 rounds in that time is skipped, flowdrop_local "
        "and raw sqlite3 always do at least 3",
        "- Times are per operation, warm page cache; `x raw` is the median over raw sqlite3's "
        "median at the same synchronous setting (peers run at their default, FULL). "
        "p95 is the nearest-rank 95th percentile. Peak memory is what tracemalloc sees during "
        "one read (Python allocations; SQLite's page cache is not included).",
        "- Sizes are the messages in the buffer before the first round; appends add one "
        "message a round (k + 2 for a healing round).",
        "",
        "## Headline",
        "",
        *_headline(cells, index),
        "",
        "## Targets of issue 11 (schema version 3)",
        "",
        *_targets(cells, index, footprint or {}),
        "",
    ]
    titles = {
        APPEND: "Append one message",
        HEAL_1: "User append healing k = 1 dangling call",
        HEAL_10: "User append healing k = 10 dangling calls",
        READ: "Read the last 50 messages",
        COLD: "Open the file cold (new connection and library object), read the last 50",
        IMPORT: f"Import {args.import_size:,} messages in one batch into a new file",
    }
    notes = {
        HEAL_1: "The declaring assistant turn is appended untimed; the user append is timed. "
        "Raw's equivalent (its floor) inserts k placeholder rows and the user row in one "
        "transaction.",
        HEAL_10: "As above, k = 10.",
        READ: "LangChain has no last-N read: `history.messages[-50:]` loads the whole session. "
        "LangGraph's `get_state` loads the latest checkpoint, which holds the whole list.",
        COLD: "The close happens after the timer. LangGraph's figure includes compiling the "
        "graph with the new saver.",
        APPEND: "LangGraph appends with `graph.update_state` (one checkpoint, no node run).",
    }
    for workload in WORKLOADS:
        if any(c.workload == workload for c in cells):
            out += [f"## {titles[workload]}", ""]
            if workload in notes:
                out += [notes[workload], ""]
            out += [*_workload_table(workload, cells, index), ""]
    out += [
        "## Systems",
        "",
        "| system | journal, synchronous | pre-fill, one untimed call |",
        "|---|---|---|",
    ]
    for key in sorted(names, key=lambda k: _ORDER.index(k) if k in _ORDER else 99):
        times = ", ".join(
            f"{size:,}: {fmt_ns(ns)}" for (k, size), ns in sorted(prefill.items()) if k == key
        )
        out.append(f"| {names[key]} | {pragmas.get(key, '')} | {times} |")
    skipped = [c for c in _ordered(cells) if c.skipped is not None]
    if skipped or missing:
        out += ["", "## Skipped", ""]
        out += [f"- {c.name}, {c.workload}, {c.size:,} messages: {c.skipped}" for c in skipped]
        out += [f"- {name}: {why}" for name, why in missing.items()]
    return "\n".join(out) + "\n"


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- BEGIN benchmarks.{name} -->", f"<!-- END benchmarks.{name} -->"


def _sections(text: str) -> dict[str, str]:
    """The marked sections of a report, by name, markers included."""
    found = {}
    for name in SECTIONS:
        begin, end = _markers(name)
        if begin in text and end in text:
            found[name] = text[text.index(begin) : text.index(end) + len(end)]
    return found


def write(path: Path, text: str) -> None:
    """Write the report, keeping the key and profile sections of the file it replaces."""
    kept = _sections(path.read_text(encoding="utf-8")) if path.exists() else {}
    tail = "".join(f"\n{kept[name]}\n" for name in SECTIONS if name in kept)
    path.write_text(text + tail, encoding="utf-8")


def write_section(path: Path, name: str, section: str) -> None:
    """Put ``section`` between the markers of ``name`` in ``path``, replacing an earlier one."""
    begin, end = _markers(name)
    block = f"{begin}\n{section.rstrip()}\n{end}"
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new, encoding="utf-8")

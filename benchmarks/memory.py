"""Peak memory of export and import: ``python -m benchmarks.memory``.

For each size, a source database of that many messages (the corpus of
:func:`benchmarks.core.message`: user, call, result, reply, in buffers of
``--per-buffer`` messages) is built once, then each measured step runs in a
child process of its own, twice:

* with ``tracemalloc`` on: the peak of Python allocations during the step (the
  store is opened before tracing starts, so the figure is the step's own);
* without it: ``ru_maxrss`` of the child (the whole process: interpreter,
  imports, SQLite's page cache) and the wall time.

Steps: ``export`` (``Store.export()`` written as JSON Lines to a file, as the
CLI does) and ``import`` (``Store.import_jsonl`` of that file opened as text,
as ``flowdrop-local import FILE`` does, into a new database).

``--library DIR`` puts ``DIR`` first on the children's path, so one run can
measure another checkout; ``--baseline DIR`` measures ``DIR`` too, first (the
figures before a change). ``--out benchmarks/RESULTS.md`` writes the table into
its ``memory`` section. The script prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from . import report
from .core import fmt_bytes, message, remove_database

_ROOT = Path(__file__).resolve().parent.parent
_BATCH = 1_000


def _use_library(library: str | None) -> str:
    """Put ``library`` first on the path; return where flowdrop_local comes from."""
    if library:
        sys.path.insert(0, library)
    import flowdrop_local

    return str(Path(flowdrop_local.__file__).parent.parent)


def build(path: Path, total: int, per_buffer: int) -> None:
    """``total`` corpus messages, ``per_buffer`` to a buffer, appended ``_BATCH`` at a time."""
    from flowdrop_local import Store

    with Store(path) as store:
        for first in range(0, total, per_buffer):
            buffer = store.buffer("bench", "memory", f"b{first // per_buffer:06d}")
            size = min(per_buffer, total - first)
            for start in range(0, size, _BATCH):
                batch = [message(i) for i in range(start, min(size, start + _BATCH))]
                if size <= start + _BATCH and batch[-1].get("tool_calls"):
                    batch[-1] = {"role": "assistant", "content": "[no call made]"}
                buffer.append(batch)


def _export(source: Path, target: Path) -> int:
    from flowdrop_local import Store

    count = 0
    with Store(source) as store, open(target, "w", encoding="utf-8") as out:
        if tracemalloc.is_tracing():
            tracemalloc.reset_peak()
        for record in store.export():
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def _import(source: Path, target: Path) -> int:
    from flowdrop_local import Store

    remove_database(target)
    with Store(target) as store, open(source, encoding="utf-8") as lines:
        if tracemalloc.is_tracing():
            tracemalloc.reset_peak()
        return store.import_jsonl(lines).imported


def child(args: argparse.Namespace) -> int:
    """One measured step; prints a JSON object on stdout."""
    library = _use_library(args.library)
    if args.trace:
        tracemalloc.start()
    started = time.perf_counter()
    step = _export if args.step == "export" else _import
    count = step(Path(args.source), Path(args.target))
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if args.trace else None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(
        json.dumps(
            {"count": count, "seconds": seconds, "peak": peak, "rss": rss, "library": library}
        )
    )
    return 0


def _run_child(
    library: str | None, step: str, source: Path, target: Path, trace: bool
) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.memory", "--child", step, str(source), str(target)]
    if library:
        command += ["--library", library]
    if trace:
        command.append("--trace")
    done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{step} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def render(rows: list[str], command: str) -> str:
    """The markdown section for ``RESULTS.md``."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "\n".join(
            [
                "## Peak memory of export and import",
                "",
                f"`{command}`, {now}. Each step runs in a child process of its own: once "
                "under `tracemalloc` (the step's peak of Python allocations), once without "
                "(`ru_maxrss` of the whole process, and the time). Export writes JSON Lines "
                "to a file as the CLI does; import reads that file as `flowdrop-local import` "
                "does. Buffers of 1,000 messages.",
                "",
                "| step | messages | flowdrop_local | tracemalloc peak | ru_maxrss | time |",
                "|---|---:|---|---:|---:|---:|",
                *rows,
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Build each size once, then measure export and import in child processes."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.memory", description="Peak memory of export and import."
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--per-buffer", type=int, default=1_000, help="messages per buffer")
    parser.add_argument("--library", help="directory holding the flowdrop_local to measure")
    parser.add_argument("--baseline", help="another checkout to measure first (before)")
    parser.add_argument("--baseline-name", help="what to call it in the table (its path)")
    parser.add_argument("--workdir", help="keep (and reuse) the source databases here")
    parser.add_argument("--out", help="report to update (e.g. benchmarks/RESULTS.md)")
    parser.add_argument("--child", nargs=3, metavar=("STEP", "SOURCE", "TARGET"))
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.step, args.source, args.target = args.child
        return child(args)

    library = _use_library(args.library)
    print(f"flowdrop_local from {library}", flush=True)
    baseline = args.baseline_name or args.baseline
    measured = [(f"before ({baseline})", args.baseline)] if args.baseline else []
    measured.append(("this checkout" if args.baseline else library, args.library))
    rows = []
    with tempfile.TemporaryDirectory(prefix="flowdrop-memory-") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for size in args.sizes:
            source = workdir / f"source-{size}-{args.per_buffer}.db"
            if not source.exists():
                started = time.perf_counter()
                build(source, size, args.per_buffer)
                print(f"built {source} in {time.perf_counter() - started:.0f} s", flush=True)
            dump = Path(tmp) / f"dump-{size}.jsonl"
            copy = Path(tmp) / f"copy-{size}.db"
            for step, src, dst in (("export", source, dump), ("import", dump, copy)):
                for label, where in measured:
                    traced = _run_child(where, step, src, dst, trace=True)
                    plain = _run_child(where, step, src, dst, trace=False)
                    row = (
                        f"| {step} | {size:,} | {label} | {fmt_bytes(traced['peak'])} | "
                        f"{fmt_bytes(plain['rss'])} | {plain['seconds']:.1f} s |"
                    )
                    print(row, flush=True)
                    rows.append(row)
            remove_database(copy)
            os.remove(dump)
    command = "python -m benchmarks.memory" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
    )
    section = render(rows, command)
    print("\n" + section)
    if args.out:
        report.write_section(Path(args.out), "memory", section)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

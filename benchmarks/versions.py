"""Two versions of flowdrop_local in one run: ``python -m benchmarks.versions REV``.

The version at git revision ``REV`` (checked out into a temporary worktree) and the
working tree's are timed in turns, in child processes that alternate chunk by
chunk, so both see the same machine at the same moments: the before-and-after
of a change, measured in one run. Each chunk opens a fresh store of ``--size``
messages (then waits a second, so the fill's checkpoint is not timed) and
times appends of three kinds (a user turn, an assistant turn that
declares a tool call, the call's result) and ``read(limit=50)``; the report gives
median, p95 and p99 per version and kind, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in the child, with the version under test first on sys.path.
_CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
from flowdrop_local import Store

size, rounds = int(sys.argv[1]), int(sys.argv[2])
times = {"user turn": [], "tool call": [], "tool result": [], "read(limit=50)": []}
with tempfile.TemporaryDirectory() as tmp:
    with Store(str(Path(tmp) / "chat.db")) as store:
        buf = store.buffer("user", "u-1", "c-1")
        buf.append([{"role": "user", "content": f"turn {i} " * 8} for i in range(size)])
        time.sleep(1)  # the fill's own WAL checkpoint (a thread's, in newer versions) is done
        clock = time.perf_counter_ns
        for n in range(rounds):
            call = {"role": "assistant", "content": "",
                    "tool_calls": [{"id": f"c{n}", "type": "function",
                                    "function": {"name": "run", "arguments": "{}"}}]}
            steps = (
                ("user turn", lambda: buf.append({"role": "user", "content": f"q {n}"})),
                ("tool call", lambda: buf.append(call)),
                ("tool result", lambda: buf.append(
                    {"role": "tool", "tool_call_id": f"c{n}", "content": "42"})),
                ("read(limit=50)", lambda: buf.read(limit=50)),
            )
            for kind, step in steps:
                started = clock()
                step()
                times[kind].append(clock() - started)
print(json.dumps(times))
"""


def _worktree(revision: str, folder: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(folder), revision],
        check=True,
    )
    return folder


def _chunk(tree: Path, size: int, rounds: int) -> dict[str, list[int]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(size), str(rounds)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, list[int]] = json.loads(done.stdout)
    return result


def _quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the version to compare with (a commit, a tag)")
    parser.add_argument(
        "--after", help="the version to compare it to (a commit; the working tree if not given)"
    )
    parser.add_argument("--size", type=int, default=10_000, help="messages before a chunk")
    parser.add_argument(
        "--chunks",
        type=int,
        default=10,
        help="chunks per version, the order swapped every chunk (10)",
    )
    parser.add_argument("--rounds", type=int, default=300, help="rounds per chunk (300)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flowdrop-versions-") as tmp:
        made = [_worktree(args.revision, Path(tmp) / "before")]
        if args.after:
            made.append(_worktree(args.after, Path(tmp) / "after"))
        trees = {
            args.revision: made[0],
            args.after or "working tree": made[-1] if args.after else ROOT,
        }
        found: dict[str, dict[str, list[int]]] = {name: {} for name in trees}
        try:
            for chunk in range(args.chunks):
                order = list(trees.items())
                if chunk % 2:  # ABBA: neither version always runs second
                    order.reverse()
                for name, tree in order:
                    for kind, times in _chunk(tree, args.size, args.rounds).items():
                        found[name].setdefault(kind, []).extend(times)
        finally:
            for tree in made:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                )
    print(
        f"{args.size:,} messages, {args.chunks} chunks of {args.rounds} rounds per version, "
        "alternating"
    )
    print("| kind | version | median | p95 | p99 | median vs before |")
    print("|---|---|---:|---:|---:|---:|")
    for kind in found[args.revision]:
        base = statistics.median(found[args.revision][kind]) / 1e3
        for name in trees:
            times = found[name][kind]
            median = statistics.median(times) / 1e3
            print(
                f"| {kind} | {name} | {median:.1f} µs | {_quantile(times, 0.95):.1f} µs | "
                f"{_quantile(times, 0.99):.1f} µs | {median / base:.2f}x |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Position keys under stress, through the public API: ``python -m benchmarks.keys``.

Every scenario writes through ``Buffer.append`` into its own buffer of one file,
then reports the longest ``position`` key of that buffer. Append keys should grow
logarithmically with the number of messages, and n keys placed between two
neighbours should be generated balanced (about log62(n) characters longer than
the neighbours), not one after another.

Scenarios:

* ``appends``: 1,000,000 messages, 1,000 per ``append`` call.
* ``wide-tail``: one assistant turn declaring 10,000 calls, the last row; the
  next user append heals them all.
* ``wide-between``: the same turn followed by an assistant text turn, so the
  10,000 placeholders go between two existing rows.
* ``turns-tail``: 10,000 times an assistant turn with one call, then a user turn.
* ``turns-between``: 10,000 times an assistant turn with one call, an assistant
  text turn, then a user turn: each placeholder goes between existing rows.
* ``import-healed``: a healed history imported in one batch: one turn declaring
  10,000 calls, its 10,000 placeholders (``metadata.healed``), then a user turn.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from flowdrop_local import Buffer, Store
from flowdrop_local.rules import PLACEHOLDER_CONTENT

from . import report
from .core import declaring_turn


@attrs.frozen
class Outcome:
    """What one scenario left in its buffer."""

    scenario: str
    description: str
    messages: int
    longest: str
    seconds: float
    note: str = ""


def _longest(store: Store, buffer: Buffer) -> str:
    """The longest position key of ``buffer`` (SQL on the file; ``messages()`` if that fails)."""
    try:
        with sqlite3.connect(f"file:{store.path}?mode=ro", uri=True) as conn:
            row = conn.execute(
                "SELECT m.position FROM messages AS m JOIN buffers AS b ON b.id = m.buffer_id "
                "WHERE b.scope = ? AND b.scope_id = ? AND b.key = ? "
                "ORDER BY length(m.position) DESC, m.position LIMIT 1",
                (buffer.scope, buffer.scope_id, buffer.key),
            ).fetchone()
        if row is not None:
            return str(row[0])
    except sqlite3.Error:
        pass
    return max((m.position for m in buffer.messages()), key=len, default="")


def _text(i: int) -> dict[str, str]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}


def appends(buffer: Buffer, total: int, batch: int) -> str:
    """``total`` messages, ``batch`` per append; the tail key at each power of ten."""
    marks = []
    next_mark = 1_000
    for start in range(0, total, batch):
        buffer.append([_text(i) for i in range(start, min(total, start + batch))])
        done = min(total, start + batch)
        if done >= next_mark or done == total:
            tail = buffer.messages(limit=1)[0].position
            marks.append(f"{done:,}: {len(tail)}")
            while next_mark <= done:
                next_mark *= 10
    return "tail key length after " + ", ".join(marks)


def wide(buffer: Buffer, calls: int, *, between: bool) -> str:
    """One turn declaring ``calls`` calls, healed by one user append."""
    buffer.append(_text(0))
    batch = [declaring_turn([f"call_{i}" for i in range(calls)])]
    if between:
        batch.append({"role": "assistant", "content": "a later turn"})
    buffer.append(batch)
    healed = len(buffer.append({"role": "user", "content": "next"}).healed_ids)
    return f"{healed:,} healed in one append"


def turns(buffer: Buffer, count: int, *, between: bool) -> str:
    """``count`` turns, each declaring one call that the next user turn heals."""
    healed = 0
    for i in range(count):
        buffer.append(declaring_turn([f"call_{i}"]))
        if between:
            buffer.append({"role": "assistant", "content": f"turn {i} goes on"})
        healed += len(buffer.append({"role": "user", "content": f"user {i}"}).healed_ids)
    return f"{healed:,} healed, one per user append"


def import_healed(buffer: Buffer, calls: int) -> str:
    """A healed history (turn, its placeholders, a user turn) imported in one append."""
    ids = [f"call_{i}" for i in range(calls)]
    placeholders = [
        {
            "role": "tool",
            "tool_call_id": c,
            "content": PLACEHOLDER_CONTENT,
            "metadata": {"healed": True},
        }
        for c in ids
    ]
    batch = [_text(0), declaring_turn(ids), *placeholders, {"role": "user", "content": "next"}]
    buffer.append(batch)
    stored = [m.tool_call_id for m in buffer.messages() if m.role == "tool"]
    first = ", ".join(str(c) for c in stored[:3])
    kept = "kept" if stored == ids else f"NOT kept (first stored: {first})"
    return f"declaration order of the placeholders {kept}"


def run(args: argparse.Namespace, workdir: Path) -> list[Outcome]:
    """Every scenario, each into its own buffer of one file."""
    scenarios: list[tuple[str, str, Callable[[Buffer], str]]] = [
        (
            "appends",
            f"{args.appends:,} appends, {args.batch:,} per call",
            lambda b: appends(b, args.appends, args.batch),
        ),
        (
            "wide-tail",
            f"a turn declaring {args.calls:,} calls (last row), healed by one user append",
            lambda b: wide(b, args.calls, between=False),
        ),
        (
            "wide-between",
            f"a turn declaring {args.calls:,} calls, then an assistant turn; healed between them",
            lambda b: wide(b, args.calls, between=True),
        ),
        (
            "turns-tail",
            f"{args.turns:,} x (assistant with 1 call, user)",
            lambda b: turns(b, args.turns, between=False),
        ),
        (
            "turns-between",
            f"{args.turns:,} x (assistant with 1 call, assistant text, user): "
            "each heal between existing rows",
            lambda b: turns(b, args.turns, between=True),
        ),
        (
            "import-healed",
            f"import of a healed history in one batch: a turn, its {args.calls:,} "
            "placeholders, a user turn",
            lambda b: import_healed(b, args.calls),
        ),
    ]
    outcomes = []
    with Store(workdir / "keys.db") as store:
        for name, description, scenario in scenarios:
            if args.only and name not in args.only:
                continue
            buffer = store.buffer("bench", "keys", name)
            started = time.perf_counter()
            try:
                note = scenario(buffer)
            except Exception as error:  # report it and go on with the other scenarios
                note = f"failed: {type(error).__name__}: {error}"
            seconds = time.perf_counter() - started
            outcome = Outcome(
                name, description, len(buffer), _longest(store, buffer), seconds, note
            )
            outcomes.append(outcome)
            print(
                f"{name:<14} {outcome.messages:>10,} messages  "
                f"longest key {len(outcome.longest):>5} chars  {seconds:7.1f} s  {note}",
                flush=True,
            )
    return outcomes


def _shown(key: str) -> str:
    return key if len(key) <= 24 else f"{key[:12]}…{key[-8:]}"


def render(outcomes: list[Outcome], command: str) -> str:
    """The markdown section."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Position keys under stress",
        "",
        f"`{command}`, {now}. Each scenario writes through `Buffer.append` into its own "
        "buffer; the longest `position` key of that buffer is read from the file.",
        "",
        "| scenario | messages | longest key | chars | time | notes |",
        "|---|---:|---|---:|---:|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.description} | {o.messages:,} | `{_shown(o.longest)}` | {len(o.longest)} "
            f"| {o.seconds:.1f} s | {o.note} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios, print the figures, write them into ``--out``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.keys", description="Position-key length under stress."
    )
    parser.add_argument("--quick", action="store_true", help="100,000 appends, 2,000 calls/turns")
    parser.add_argument("--appends", type=int, help="messages of the append scenario (1000000)")
    parser.add_argument("--batch", type=int, default=1_000, help="messages per append (1000)")
    parser.add_argument("--calls", type=int, help="calls declared by one turn (10000)")
    parser.add_argument("--turns", type=int, help="healed turns (10000)")
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--out", help="report to update (benchmarks/RESULTS.md; none with --quick)")
    parser.add_argument("--workdir", help="where the database goes (a temporary directory)")
    args = parser.parse_args(argv)
    args.appends = args.appends or (100_000 if args.quick else 1_000_000)
    args.calls = args.calls or (2_000 if args.quick else 10_000)
    args.turns = args.turns or (2_000 if args.quick else 10_000)
    args.only = set(args.only.split(",")) if args.only else set()
    if args.out is None and not args.quick:
        args.out = str(Path(__file__).with_name("RESULTS.md"))
    command = "python -m benchmarks.keys" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)
    )
    with tempfile.TemporaryDirectory(prefix="flowdrop-keys-", dir=args.workdir) as tmp:
        outcomes = run(args, Path(tmp))
    section = render(outcomes, command)
    print("\n" + section)
    if args.out:
        report.write_section(Path(args.out), "keys", section)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

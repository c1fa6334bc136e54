"""The long crash soak: writers killed with SIGKILL, over and over, on one file.

    python -m tests.soak.soak [--rounds 200] [--writers 3] [--db PATH]

Each round starts WRITERS appender processes on the same buffer (each append
heals), kills each with SIGKILL at its own random moment, then reopens the file
and verifies: integrity_check ok, the store's invariant checker clean, and every
append any child reported as returned present. Prints the totals at the end.
Not part of the test suite (it runs for minutes); tests/test_crash.py is the
fast version that CI runs.
"""

from __future__ import annotations

import argparse
import random
import signal
import tempfile
import time
from pathlib import Path

from tests.test_crash import start_appender, verify

ROOT = Path(__file__).resolve().parent.parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--db", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp()) / "soak.db"
    rng = random.Random(args.seed)
    reported: dict[str, list[str]] = {}
    kills = appends = 0
    started = time.monotonic()
    for round_ in range(args.rounds):
        children = {}
        for w in range(args.writers):
            tag = f"r{round_}w{w}"
            durability = "full" if rng.random() < 0.2 else "normal"
            child = start_appender(db, tag, durability)
            children[tag] = child
        deadlines = sorted((rng.uniform(0.02, 0.5), tag) for tag in children)
        begun = time.monotonic()
        for at, tag in deadlines:
            time.sleep(max(0.0, at - (time.monotonic() - begun)))
            children[tag].send_signal(signal.SIGKILL)
        for tag, child in children.items():
            out, _ = child.communicate()
            if child.returncode != -signal.SIGKILL:
                raise SystemExit(
                    f"writer {tag} exited with {child.returncode} before it was killed"
                )
            reported[tag] = out.split("\n")
            appends += sum(1 for line in reported[tag] if line)
            kills += 1
        messages = verify(db, reported)
        if round_ % 20 == 0 or round_ == args.rounds - 1:
            print(
                f"round {round_ + 1}/{args.rounds}: {kills} kills, {appends} reported appends, "
                f"{messages} messages, all present, file sound",
                flush=True,
            )
    print(
        f"soak: {args.rounds} rounds x {args.writers} concurrent writers, {kills} SIGKILLs, "
        f"{appends} reported appends, 0 lost, 0 invariant violations, "
        f"{time.monotonic() - started:.0f} s ({db})"
    )


if __name__ == "__main__":
    main()

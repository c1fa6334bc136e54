"""The README stays honest: every test it cites exists, every CLI command is documented."""

from __future__ import annotations

import re
from pathlib import Path

import click

from flowdrop_local.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _cited_tests() -> list[tuple[str, str]]:
    """(file, test name prefix) for each `file.py::test_x` and `::test_y` the README cites."""
    cited = []
    for line in README.splitlines():
        current = None
        for match in re.finditer(r"(?:(test_\w+\.py))?::(test_\w+)(\*)?", line):
            current = match.group(1) or current
            assert current, f"a citation without its file: {line!r}"
            cited.append((current, match.group(2)))
    return cited


def test_every_cited_test_exists() -> None:
    """Each test the README names is defined in the file it names."""
    cited = _cited_tests()
    assert len(cited) > 30
    missing = []
    for file, name in cited:
        source = (ROOT / "tests" / file).read_text(encoding="utf-8")
        if not re.search(rf"def {name}", source):
            missing.append(f"{file}::{name}")
    assert missing == []


def test_every_rule_has_a_standing_line() -> None:
    """The rule table lists MEM-1 to MEM-16."""
    table = README.split("## The GR-MEM rules: standing", 1)[1].split("\n## ", 1)[0]
    for n in range(1, 17):
        assert re.search(rf"^\| MEM-{n} ", table, flags=re.MULTILINE), f"MEM-{n} is missing"


def test_every_cli_command_is_in_the_readme() -> None:
    """Each top-level command appears in the CLI table."""
    for name, command in cli.commands.items():
        assert isinstance(command, click.Command)
        assert f"`{name}" in README, f"{name} is not documented"

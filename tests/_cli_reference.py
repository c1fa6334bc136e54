"""The command-line reference page, made from the CLI's own definitions.

``python -m tests._cli_reference > docs/reference/cli.md`` rewrites it;
``tests/test_docs.py`` checks the page is current (as sqlite-utils does with cog).
"""

from __future__ import annotations

import click

from flowdrop_local.cli import cli

WIDTH = 88


def _commands(
    command: click.Command, path: list[str], parent: click.Context | None
) -> list[tuple[list[str], click.Context]]:
    """Each command under ``command``, depth first, with a context for its help."""
    context = click.Context(
        command,
        info_name=path[-1],
        parent=parent,
        terminal_width=WIDTH,
        max_content_width=WIDTH,
    )
    found = [(path, context)]
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            found += _commands(command.commands[name], [*path, name], context)
    return found


def page() -> str:
    """The whole Markdown page."""
    lines = [
        "# Command line",
        "",
        "Made from the CLI's own definitions (`python -m tests._cli_reference >",
        "docs/reference/cli.md`); a test fails when this page and `flowdrop-local",
        "--help` disagree. [The CLI guide](../cli.md) says how the commands fit together.",
        "",
    ]
    for path, context in _commands(cli, ["flowdrop-local"], None):
        lines += [f"## `{' '.join(path)}`", "", "```text", context.get_help(), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(page(), end="")

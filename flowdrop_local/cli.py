"""The ``flowdrop-local`` command: translates arguments and formats, decides nothing.

The database is ``--db PATH``, else ``$FLOWDROP_DB``, else ``./flowdrop.db``.
Bad input prints one ``Error: ...`` line on stderr and exits with status 2.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ._files import remove_database
from .buffer import Buffer
from .check import as_dicts
from .cli_sessions import sessions
from .errors import FlowdropError
from .model import converter
from .store import Store

DEFAULT_DB = "flowdrop.db"


class BadInput(click.ClickException):
    """A flowdrop_local error shown as one line, exit status 2."""

    exit_code = 2


# Only these commands may create the database; the others refuse a missing file.
_CREATING = frozenset({"append", "demo", "import"})


@contextmanager
def _open(ctx: click.Context) -> Iterator[Store]:
    """The store for the command; a command that fails removes a file it created."""
    store: Store | None = None
    try:
        with Store(ctx.obj["db"], create=ctx.info_name in _CREATING) as store:
            yield store
    except BaseException as error:
        if store is not None and store.created:
            remove_database(store.path)
        if isinstance(error, FlowdropError):
            raise BadInput(str(error)) from None
        raise


def _dump(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


@click.group()
@click.option(
    "--db",
    envvar="FLOWDROP_DB",
    default=DEFAULT_DB,
    show_default=True,
    help="The database file (or set FLOWDROP_DB).",
)
@click.version_option(package_name="flowdrop-local")
@click.pass_context
def cli(ctx: click.Context, db: str) -> None:
    """Keep LLM conversation buffers in one SQLite file, healed and sendable."""
    ctx.obj = {"db": db}


@cli.command()
@click.argument("scope")
@click.argument("scope_id")
@click.argument("key")
@click.option("--json", "json_message", help="The message (or a JSON array of messages).")
@click.option(
    "--role",
    type=click.Choice(["system", "user", "assistant", "tool"]),
    help="Role, with --content.",
)
@click.option("--content", help="Text content, with --role.")
@click.option("--tool-call-id", help="The call a tool message answers, with --role tool.")
@click.pass_context
def append(
    ctx: click.Context,
    scope: str,
    scope_id: str,
    key: str,
    json_message: str | None,
    role: str | None,
    content: str | None,
    tool_call_id: str | None,
) -> None:
    """Append a message to buffer SCOPE SCOPE_ID KEY and print the append report."""
    if json_message is not None:
        if role is not None or content is not None or tool_call_id is not None:
            raise BadInput("give either --json or --role/--content, not both")
        try:
            message: Any = json.loads(json_message)
        except json.JSONDecodeError as error:
            raise BadInput(f"--json is not valid JSON: {error}") from None
    elif role is not None:
        message = {"role": role, "content": content or ""}
        if tool_call_id is not None:
            message["tool_call_id"] = tool_call_id
    else:
        raise BadInput("give the message with --json, or with --role and --content")
    with _open(ctx) as store:
        try:
            result = store.buffer(scope, scope_id, key).append(message)
        except FlowdropError as error:
            raise BadInput(str(error)) from None
    _dump(converter.unstructure(result))


def _echo_history(messages: list[dict[str, Any]]) -> None:
    for index, message in enumerate(messages):
        metadata = message["metadata"]
        content = message["content"]
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        notes = []
        calls = metadata.get("tool_calls")
        if isinstance(calls, list) and calls:
            names = []
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                name = function.get("name") if isinstance(function, dict) else call.get("name")
                names.append(f"{call.get('tool_call_id', call.get('id'))}:{name}")
            notes.append("calls " + ", ".join(names))
        if "tool_call_id" in metadata:
            notes.append(f"answers {metadata['tool_call_id']}")
        if metadata.get("healed") is True:
            notes.append("HEALED")
        suffix = f"  [{'; '.join(notes)}]" if notes else ""
        click.echo(f"{index:>4}  {message['role']:<9} {text}{suffix}")


@cli.command()
@click.argument("scope")
@click.argument("scope_id")
@click.argument("key")
@click.option("--limit", type=click.IntRange(min=0), help="Only the last N messages.")
@click.option("--json", "json_output", is_flag=True, help="Print the messages as a JSON array.")
@click.option(
    "--format",
    "payload_format",
    type=click.Choice(["openai-chat", "openai-responses", "anthropic"]),
    help="Print the payload to send to this provider API (JSON; --limit widens to whole turns).",
)
@click.pass_context
def show(
    ctx: click.Context,
    scope: str,
    scope_id: str,
    key: str,
    limit: int | None,
    json_output: bool,
    payload_format: str | None,
) -> None:
    """Print the history of buffer SCOPE SCOPE_ID KEY."""
    with _open(ctx) as store:
        try:
            buffer = store.buffer(scope, scope_id, key)
            if payload_format is not None:
                _dump(_payload(buffer, payload_format, limit))
                return
            messages = buffer.read(limit=limit)
        except FlowdropError as error:
            raise BadInput(str(error)) from None
    if json_output:
        _dump(messages)
    else:
        _echo_history(messages)


def _payload(buffer: Buffer, payload_format: str, limit: int | None) -> Any:
    """The provider payload of a buffer, checked by its validator before it is printed."""
    from . import providers

    payload: Any
    if payload_format == "openai-chat":
        payload = buffer.to_openai_chat(limit)
        providers.validate_openai_chat(payload)
    elif payload_format == "openai-responses":
        payload = buffer.to_openai_responses(limit)
        providers.validate_openai_responses(payload)
    else:
        payload = buffer.to_anthropic(limit)
        providers.validate_anthropic(payload)
    return payload


DEMO_ADDRESS = ("demo", "local", "weather-agent")
DEMO_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant with a weather tool."},
    {"role": "user", "content": "Will I need an umbrella in Lisbon tomorrow?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_weather_1",
                "type": "function",
                "function": {"name": "get_forecast", "arguments": '{"city": "Lisbon"}'},
            }
        ],
    },
]


@cli.command()
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Store an agent conversation whose tool call is interrupted, then heal it."""
    with _open(ctx) as store:
        buffer = store.buffer(*DEMO_ADDRESS)
        buffer.clear()
        click.echo(f"Database: {store.path}   buffer: {' / '.join(DEMO_ADDRESS)}\n")
        click.echo("1. The agent loop stores the conversation and a tool call, then crashes")
        click.echo("   before the tool returns:\n")
        buffer.append(DEMO_CONVERSATION)
        _echo_history(buffer.read())
        click.echo("\n   A provider would reject this history: call_weather_1 has no result.\n")
        click.echo("2. The user writes again. The append heals the dangling call in the same")
        click.echo("   transaction, placing the synthetic result right after its call (MEM-3):\n")
        result = buffer.append({"role": "user", "content": "Hello? Are you still there?"})
        _echo_history(buffer.read())
        click.echo(
            f"\n   append report: count={result.count} appended={result.appended} "
            f"healed={len(result.healed_ids)}\n"
        )
        click.echo("3. The tool's real answer arrives late; it replaces the placeholder in place")
        click.echo("   (MEM-10), and a re-delivery of it is dropped (MEM-1):\n")
        late = {"role": "tool", "tool_call_id": "call_weather_1", "content": "Rain, 14 C, 80%"}
        first, again = buffer.append(late), buffer.append(late)
        _echo_history(buffer.read())
        click.echo(
            f"\n   first delivery: replaced={len(first.replaced_ids)} appended={first.appended}; "
            f"second: dropped={again.dropped} appended={again.appended}"
        )
        click.echo(
            f"\nSee it again with: flowdrop-local --db {store.path} show {' '.join(DEMO_ADDRESS)}"
        )


cli.add_command(sessions)


@cli.command()
@click.option("--json", "json_output", is_flag=True, help="Print the violations as JSON.")
@click.pass_context
def check(ctx: click.Context, json_output: bool) -> None:
    """Check the file: SQLite integrity, foreign keys and the buffer invariants.

    Exit status 0 when clean, 1 with a report of each violation.
    """
    with _open(ctx) as store:
        violations = store.check()
    if json_output:
        _dump({"ok": not violations, "violations": as_dicts(violations)})
    elif violations:
        for violation in violations:
            click.echo(str(violation))
        click.echo(f"{len(violations)} violation(s) in {store.path}", err=True)
    else:
        click.echo(f"{store.path}: ok")
    if violations:
        ctx.exit(1)


@cli.command()
@click.pass_context
def vacuum(ctx: click.Context) -> None:
    """Checkpoint the write-ahead log into the file and compact it."""
    with _open(ctx) as store:
        before = _size(store.path)
        store.vacuum()
        click.echo(f"{store.path}: {before} -> {_size(store.path)} bytes")


def _size(path: str) -> int:
    return sum(
        os.path.getsize(path + suffix) for suffix in ("", "-wal") if os.path.exists(path + suffix)
    )


@cli.command()
@click.argument("address", nargs=-1)
@click.pass_context
def export(ctx: click.Context, address: tuple[str, ...]) -> None:
    """Write every buffer (or SCOPE SCOPE_ID KEY) as JSON Lines to stdout."""
    if len(address) not in (0, 3):
        raise BadInput("give no address (everything) or SCOPE SCOPE_ID KEY")
    with _open(ctx) as store:
        target = (address[0], address[1], address[2]) if address else None
        for record in store.export(target):
            click.echo(json.dumps(record, ensure_ascii=False))


@cli.command(name="import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@click.option("--replace", is_flag=True, help="Replace buffers that already hold messages.")
@click.pass_context
def import_(ctx: click.Context, file: Any, replace: bool) -> None:
    """Import a JSON Lines export (FILE, or - for stdin) in one transaction."""
    with _open(ctx) as store:
        try:
            report = store.import_jsonl(file, replace=replace)
        except FlowdropError as error:
            raise BadInput(str(error)) from None
    _dump(converter.unstructure(report))


@cli.command()
@click.argument("target", type=click.Path(dir_okay=False))
@click.pass_context
def backup(ctx: click.Context, target: str) -> None:
    """Write a consistent copy of the live database to TARGET."""
    with _open(ctx) as store:
        try:
            store.backup(target)
        except FlowdropError as error:
            raise BadInput(str(error)) from None
    click.echo(f"backed up {ctx.obj['db']} to {target}")


def main() -> None:
    """Entry point of the ``flowdrop-local`` script."""
    cli(prog_name="flowdrop-local")


if __name__ == "__main__":  # pragma: no cover
    main()

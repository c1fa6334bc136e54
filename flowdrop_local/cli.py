"""The ``flowdrop-local`` command: translates arguments and formats, decides nothing.

The database is ``--db PATH``, else ``$FLOWDROP_DB``, else ``./flowdrop.db``.
Bad input prints one ``Error: ...`` line on stderr and exits with status 2.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any, Final, TypeVar

import click

from ._cli_common import (
    LIMIT,
    LOCK_SECONDS,
    TOO_LONG_INTEGER,
    BadInput,
    FlowdropGroup,
    dump,
    echo_history,
    parse_json,
    require_conversation,
    shared_schema,
)
from ._files import remove_database
from ._terminal import visible
from .buffer import Buffer
from .check import Violation, as_dicts
from .cli_sessions import sessions
from .errors import InvalidImport, NotADatabase
from .model import BufferInfo, converter
from .store import Store

__all__ = ["DEMO_ADDRESS", "BadInput", "cli", "main"]

DEFAULT_DB = "flowdrop.db"
T = TypeVar("T")
log = logging.getLogger("flowdrop_local")


# Only these commands may create the database; the others refuse a missing file.
_CREATING = frozenset({"append", "demo", "import"})


@contextmanager
def _open(ctx: click.Context) -> Iterator[Store]:
    """The store for the command; a command that fails removes a file it created."""
    store: Store | None = None
    try:
        with Store(
            ctx.obj["db"],
            create=ctx.info_name in _CREATING,
            lock_timeout=ctx.obj["lock_timeout"],
            shared_schema=shared_schema(),
        ) as store:
            yield store
    except BaseException:
        if store is not None and store.created:
            remove_database(store.path)
        raise


def _lock_timeout() -> float | None:
    """The group's ``--lock-timeout``, for a command that opens stores of its own."""
    timeout: float | None = click.get_current_context().find_root().obj["lock_timeout"]
    return timeout


@click.group(cls=FlowdropGroup)
@click.option(
    "--db",
    type=click.Path(),
    envvar="FLOWDROP_DB",
    default=DEFAULT_DB,
    show_default=True,
    help="The database: a SQLite file or a postgresql:// URL (or set FLOWDROP_DB).",
)
@click.option(
    "--lock-timeout",
    type=LOCK_SECONDS,
    envvar="FLOWDROP_LOCK_TIMEOUT",
    metavar="SECONDS",
    help="Give up a write (exit 2, nothing written) after waiting this long for another "
    "writer's lock; default: wait for it (or set FLOWDROP_LOCK_TIMEOUT).",
)
@click.version_option(package_name="flowdrop-local")
@click.pass_context
def cli(ctx: click.Context, db: str, lock_timeout: float | None) -> None:
    """Keep LLM conversation buffers in one SQLite file, healed and sendable."""
    ctx.obj = {"db": db, "lock_timeout": lock_timeout}


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
        message: Any = parse_json(json_message, "--json")
    elif role is not None:
        message = {"role": role, "content": content or ""}
        if tool_call_id is not None:
            message["tool_call_id"] = tool_call_id
        elif role == "tool":
            log.warning(
                "--role tool without --tool-call-id: the tool message answers no call, "
                "so no provider payload can carry it as a result"
            )
    else:
        raise BadInput("give the message with --json, or with --role and --content")
    with _open(ctx) as store:
        result = store.buffer(scope, scope_id, key).append(message)
    dump(converter.unstructure(result))


@cli.command()
@click.argument("scope")
@click.argument("scope_id")
@click.argument("key")
@click.option("--limit", type=LIMIT, help="Only the last N messages.")
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
        buffer = store.buffer(scope, scope_id, key)
        require_conversation(buffer, store.path)
        if payload_format is not None:
            dump(_payload(buffer, payload_format, limit))
            return
        messages = buffer.read(limit=limit)
    if json_output:
        dump(messages)
    else:
        echo_history(messages)


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
        click.echo(visible(f"Database: {store.path}   buffer: {' / '.join(DEMO_ADDRESS)}") + "\n")
        click.echo("1. The agent loop stores the conversation and a tool call, then crashes")
        click.echo("   before the tool returns:\n")
        buffer.append(DEMO_CONVERSATION)
        echo_history(buffer.read())
        click.echo("\n   A provider would reject this history: call_weather_1 has no result.\n")
        click.echo("2. The user writes again. The append heals the dangling call in the same")
        click.echo("   transaction, placing the synthetic result right after its call (MEM-3):\n")
        result = buffer.append({"role": "user", "content": "Hello? Are you still there?"})
        echo_history(buffer.read())
        click.echo(
            f"\n   append report: count={result.count} appended={result.appended} "
            f"healed={len(result.healed_ids)}\n"
        )
        click.echo("3. The tool's real answer arrives late; it replaces the placeholder in place")
        click.echo("   (MEM-10), and a re-delivery of it is dropped (MEM-1):\n")
        late = {"role": "tool", "tool_call_id": "call_weather_1", "content": "Rain, 14 C, 80%"}
        first, again = buffer.append(late), buffer.append(late)
        echo_history(buffer.read())
        click.echo(
            f"\n   first delivery: replaced={len(first.replaced_ids)} appended={first.appended}; "
            f"second: dropped={again.dropped} appended={again.appended}"
        )
        again_with = f"flowdrop-local --db {store.path} show {' '.join(DEMO_ADDRESS)}"
        click.echo(f"\nSee it again with: {visible(again_with)}")


cli.add_command(sessions)


@cli.command()
@click.option("--json", "json_output", is_flag=True, help="Print the violations as JSON.")
@click.pass_context
def check(ctx: click.Context, json_output: bool) -> None:
    """Check the file: SQLite integrity, foreign keys and the buffer invariants.

    Exit status 0 when clean, 1 with a report of each violation.
    """
    path = ctx.obj["db"]
    try:
        with _open(ctx) as store:
            path = store.path  # a URL without its password
            violations = store.check()
    except NotADatabase as error:
        if not _is_sqlite_file(path):
            raise
        # An SQLite file too damaged to open is a finding of the check, not bad input.
        violations = [Violation("integrity_check", f"the file cannot be opened: {error}")]
    if json_output:
        dump({"ok": not violations, "violations": as_dicts(violations)})
    elif violations:
        for violation in violations:
            click.echo(visible(str(violation)))
        click.echo(visible(f"{len(violations)} violation(s) in {path}"), err=True)
    else:
        click.echo(visible(f"{path}: ok"))
    if violations:
        ctx.exit(1)


_SQLITE_HEADER: Final = b"SQLite format 3\x00"


def _is_sqlite_file(path: str) -> bool:
    """The file starts with SQLite's header (so it is a damaged database, not another file)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO's open would wait for a writer
            return False
        with open(path, "rb") as file:
            return file.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    except (OSError, ValueError):
        return False


@cli.command()
@click.pass_context
def vacuum(ctx: click.Context) -> None:
    """Checkpoint the write-ahead log into the file and compact it."""
    with _open(ctx) as store:
        before = _size(store.path)
        store.vacuum()
        click.echo(visible(f"{store.path}: {before} -> {_size(store.path)} bytes"))


def _size(path: str) -> int:
    return sum(
        os.path.getsize(path + suffix) for suffix in ("", "-wal") if os.path.exists(path + suffix)
    )


@cli.command()
@click.argument("address", nargs=-1)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_context
def export(ctx: click.Context, address: tuple[str, ...], quiet: bool) -> None:
    """Write everything (or the buffer SCOPE SCOPE_ID KEY) as JSON Lines to stdout.

    Without an address the export is complete (format 2): a header line, the
    sessions, their viewers and the memory values, then every message.
    """
    if len(address) not in (0, 3):
        raise BadInput("give no address (everything) or SCOPE SCOPE_ID KEY")
    with _open(ctx) as store:
        target = (address[0], address[1], address[2]) if address else None
        records = store.export(target, full=target is None)
        with _progress(records, "exporting", quiet) as shown:
            for record in shown:
                click.echo(json.dumps(record, ensure_ascii=False))


@contextmanager
def _progress(items: Iterable[T], label: str, quiet: bool) -> Iterator[Iterable[T]]:
    """``items`` with a progress bar on a terminal (stderr); as they are otherwise."""
    if quiet or not sys.stderr.isatty():
        yield items
        return
    with click.progressbar(items, label=label, file=sys.stderr, show_pos=True) as bar:
        yield bar


@cli.command()
@click.argument("source")
@click.argument("target")
@click.option("--replace", is_flag=True, help="Replace what already exists in TARGET.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def copy(source: str, target: str, replace: bool, quiet: bool) -> None:
    """Copy everything from SOURCE to TARGET (each a SQLite path or a postgresql:// URL).

    Streams in one transaction on TARGET, losslessly: ids, positions, timestamps,
    healed marks, content parts, sessions, viewers and memory. A buffer, session or
    memory key that already exists in TARGET is refused unless --replace.
    """
    if os.path.abspath(source) == os.path.abspath(target) or source == target:
        raise BadInput("SOURCE and TARGET are the same database")
    with Store(source, create=False, shared_schema=shared_schema()) as src:
        created = False
        try:
            with Store(target, lock_timeout=_lock_timeout(), shared_schema=shared_schema()) as dst:
                created = dst.created
                with _progress(src.export(full=True), "copying", quiet) as records:
                    try:
                        report = dst.import_records(records, replace=replace)
                    except InvalidImport as error:  # its lines are records of SOURCE here
                        raise BadInput(f"nothing copied: {error.problem}") from None
        except BaseException:
            if created:
                remove_database(target)
            raise
    dump(converter.unstructure(report))


@cli.command("sync")
@click.argument("a")
@click.argument("b")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="SCOPE[:ID]",
    help="Only these scopes (repeatable; an application's own scope too; 'all' for every "
    "buffer). Default: every scope but user and session.",
)
@click.option("--dry-run", is_flag=True, help="Report what would move; change nothing.")
@click.option(
    "--full",
    is_flag=True,
    help="Read every message, not just buffers written since the last sync (for a "
    "store written behind the library, or a clock set back).",
)
@click.option("--json", "json_output", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--new-replica",
    metavar="A|B",
    help="First give that store a new replica id (the fix for a file copied by hand).",
)
def sync_(
    a: str,
    b: str,
    scopes: tuple[str, ...],
    dry_run: bool,
    full: bool,
    json_output: bool,
    new_replica: str | None,
) -> None:
    """Merge stores A and B both ways (each a SQLite path or a postgresql:// URL).

    Afterwards both hold the same buffers in the synced scopes: messages sent each
    way, deletions applied, conflicts resolved (per rule), placeholders healed or
    replaced. See docs/sync.md.
    """
    from . import syncing
    from .errors import InvalidArgument

    if new_replica is not None and new_replica not in (a, b):
        raise BadInput("--new-replica names A or B")
    timeout = _lock_timeout()
    with (
        Store(a, create=False, lock_timeout=timeout, shared_schema=shared_schema()) as left,
        Store(b, create=False, lock_timeout=timeout, shared_schema=shared_schema()) as right,
    ):
        if new_replica is not None:
            syncing.new_replica(left if new_replica == a else right)
        try:
            report = syncing.sync(
                left, right, list(scopes) if scopes else None, dry_run=dry_run, full=full
            )
        except InvalidArgument as error:
            raise BadInput(str(error)) from None
    if json_output:
        dump(report.to_dict())
        return
    left_out = (
        f"; left out by the scopes: {report.buffers_left_out_a} buffer(s) and "
        f"{report.memory_left_out_a} memory value(s) on A, {report.buffers_left_out_b} and "
        f"{report.memory_left_out_b} on B (--scope all covers everything)"
        if report.left_out
        else ""
    )
    if report.moved == 0:
        click.echo(
            f"in sync ({report.buffers_compared} buffers compared, {report.buffers_read} read"
            f"{left_out})"
        )
        return
    shown = "would move" if dry_run else "moved"
    click.echo(
        f"{shown}: {report.sent_a_to_b} message(s) A->B, {report.sent_b_to_a} B->A; "
        f"deleted {report.deleted_on_a} on A, {report.deleted_on_b} on B; "
        f"{report.healed} healed, {report.replaced} placeholder(s) replaced, "
        f"{report.rekeyed} re-keyed; conflicts: "
        + (", ".join(f"{rule} {n}" for rule, n in sorted(report.conflicts.items())) or "none")
        + left_out
    )


# Python's JSON parser recurses once per nesting level and converts integers of
# at most 4,300 digits; a line that could exceed either is parsed once here first,
# so its failure names the line instead of escaping as a RecursionError/ValueError.
_GUARD_LENGTH: Final = 4_000
_GUARD_BRACKETS: Final = 200
_MAX_LINE_DEPTH: Final = 500


def _import_lines(file: IO[bytes]) -> Iterator[str]:
    """The file's lines as text, strict UTF-8; an unreadable line is an InvalidImport."""
    for number, raw in enumerate(file, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidImport(
                number, f"not UTF-8 text ({error.reason} at byte {error.start})"
            ) from None
        if len(line) > _GUARD_LENGTH or line.count("[") + line.count("{") > _GUARD_BRACKETS:
            _guard(line, number)
        yield line


def _guard(line: str, number: int) -> None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return  # the import reports it, with the parser's own message
    except RecursionError:
        raise InvalidImport(number, "JSON nested too deeply to read") from None
    except ValueError:  # the only ValueError left: an integer past Python's limit
        raise InvalidImport(number, f"the line holds {TOO_LONG_INTEGER}") from None
    if _depth(value) > _MAX_LINE_DEPTH:
        raise InvalidImport(number, f"JSON nested deeper than {_MAX_LINE_DEPTH} levels")


def _depth(value: object) -> int:
    """How deeply ``value`` nests (iteratively: it may be deeper than the stack)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


@cli.command(name="import")
@click.argument("file", type=click.File("rb"))
@click.option("--replace", is_flag=True, help="Replace buffers that already hold messages.")
@click.pass_context
def import_(ctx: click.Context, file: Any, replace: bool) -> None:
    """Import a JSON Lines export (FILE, or - for stdin) in one transaction."""
    with _open(ctx) as store:
        report = store.import_jsonl(_import_lines(file), replace=replace)
    dump(converter.unstructure(report))


@cli.command()
@click.argument("target", type=click.Path(dir_okay=False))
@click.pass_context
def backup(ctx: click.Context, target: str) -> None:
    """Write a consistent copy of the live database to TARGET."""
    with _open(ctx) as store:
        store.backup(target)
    click.echo(visible(f"backed up {ctx.obj['db']} to {target}"))


@cli.command()
@click.option(
    "--db",
    "db",
    type=click.Path(),
    help="The database to show (default: the group's --db, $FLOWDROP_DB or ./flowdrop.db).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The port (0: any free one).",
)
@click.option("--no-browser", is_flag=True, help="Only print the URL; do not open a browser.")
@click.pass_context
def serve(ctx: click.Context, db: str | None, host: str, port: int, no_browser: bool) -> None:
    """Start a local read-only web viewer and print its URL (with its token) first.

    The page lists the conversations, shows a transcript with its tool calls, and
    searches when search is enabled. It never writes to the database. Ctrl-C stops it.
    """
    from .viewer.server import serve as run

    def announce(url: str) -> None:
        click.echo("Serving the read-only viewer; press Ctrl-C to stop.", err=True)
        click.echo(url)
        sys.stdout.flush()

    run(db or ctx.obj["db"], host=host, port=port, open_browser=not no_browser, announce=announce)


# ------------------------------------------------ conversations and search


@contextmanager
def _progress_callback(label: str, quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` drawing a bar on a terminal (stderr); None otherwise."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    bar: Any = None
    shown = 0

    def progress(done: int, total: int) -> None:
        nonlocal bar, shown
        if bar is None:
            bar = click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True)
            bar.__enter__()
        bar.update(done - shown)
        shown = done

    try:
        yield progress
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)


def _info_dict(info: BufferInfo) -> dict[str, Any]:
    return dict(converter.unstructure(info))


@cli.command()
@click.option("--scope", help="Only buffers of this scope.")
@click.option("--scope-id", help="Only buffers of this scope id.")
@click.option("--limit", type=LIMIT, default=50, show_default=True, help="At most N buffers.")
@click.option("--json", "json_output", is_flag=True, help="Print them as a JSON array.")
@click.pass_context
def buffers(
    ctx: click.Context, scope: str | None, scope_id: str | None, limit: int, json_output: bool
) -> None:
    """List conversations, most recently updated first: time, count, address, title."""
    with _open(ctx) as store:
        page = store.conversations(limit=limit, scope=scope, scope_id=scope_id)
    if json_output:
        dump([_info_dict(info) for info in page.items])
        return
    for info in page.items:
        title = f"  {info.title}" if info.title else ""
        click.echo(visible(f"{info.updated_at}  {info.count:>6}  {'/'.join(info.address)}{title}"))


@cli.command()
@click.argument("scope")
@click.argument("scope_id")
@click.argument("key")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, scope: str, scope_id: str, key: str, yes: bool) -> None:
    """Delete buffer SCOPE SCOPE_ID KEY: its messages, title and metadata.

    On a terminal it asks first; --yes (or input that is not a terminal) does not.
    """
    with _open(ctx) as store:
        buffer = store.buffer(scope, scope_id, key)
        require_conversation(buffer, store.path)
        if not yes and sys.stdin.isatty():
            count = len(buffer)
            click.confirm(
                visible(f"Delete {'/'.join(buffer.address)} and its {count} message(s)?"),
                abort=True,
                err=True,
            )
        deleted = buffer.delete()
    click.echo(visible(f"deleted {'/'.join(buffer.address)} ({deleted} message(s))"))


@cli.command()
@click.argument("scope")
@click.argument("scope_id")
@click.argument("key")
@click.option("--at", "at", required=True, help="The last message to copy (its id).")
@click.option(
    "--to",
    "to",
    nargs=3,
    required=True,
    metavar="SCOPE ID KEY",
    help="The new buffer (absent or empty).",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_context
def fork(
    ctx: click.Context,
    scope: str,
    scope_id: str,
    key: str,
    at: str,
    to: tuple[str, str, str],
    quiet: bool,
) -> None:
    """Copy buffer SCOPE SCOPE_ID KEY up to message --at into a new buffer --to.

    Prints the new buffer's info as JSON; append to it to continue from there.
    """
    with _open(ctx) as store, _progress_callback("forking", quiet) as progress:
        forked = store.buffer(scope, scope_id, key).fork(at=at, to=to, progress=progress)
        info = forked.info()
    dump(_info_dict(info))


@cli.command()
@click.argument("scope")
@click.argument("scope_id")
@click.argument("key")
@click.argument("text")
@click.pass_context
def title(ctx: click.Context, scope: str, scope_id: str, key: str, text: str) -> None:
    """Set the title of buffer SCOPE SCOPE_ID KEY to TEXT (prints its info as JSON)."""
    with _open(ctx) as store:
        info = store.buffer(scope, scope_id, key).set_title(text)
    dump(_info_dict(info))


@cli.command()
@click.argument("query", required=False)
@click.option("--enable", is_flag=True, help="Build the search index (once per database).")
@click.option("--scope", help="Only buffers of this scope.")
@click.option("--scope-id", help="Only buffers of this scope id.")
@click.option("--key", help="Only buffers with this key.")
@click.option("--limit", type=LIMIT, default=20, show_default=True, help="At most N hits.")
@click.option("--json", "json_output", is_flag=True, help="Print the hits as a JSON array.")
@click.option("--quiet", is_flag=True, help="No progress bar (with --enable).")
@click.pass_context
def search(
    ctx: click.Context,
    query: str | None,
    enable: bool,
    scope: str | None,
    scope_id: str | None,
    key: str | None,
    limit: int,
    json_output: bool,
    quiet: bool,
) -> None:
    """Search message text for QUERY (every word must match), best first.

    Matched words are shown between [ and ]. Search is opt-in: run
    'search --enable' once to index the database; appends keep it from then on.
    """
    if not enable and query is None:
        raise BadInput("give a QUERY, or --enable to build the search index")
    with _open(ctx) as store:
        if enable:
            with _progress_callback("indexing", quiet) as progress:
                built = store.enable_search(progress)
            if not json_output:
                click.echo("search index built" if built else "search was enabled already")
            if query is None:
                return
        assert query is not None
        hits = store.search(query, scope=scope, scope_id=scope_id, key=key, limit=limit)
    if json_output:
        dump([converter.unstructure(hit) for hit in hits])
        return
    for hit in hits:
        address = "/".join((hit.scope, hit.scope_id, hit.key))
        click.echo(visible(f"{hit.role:<9} {address}  {hit.message_id}"))
        click.echo("    " + visible(hit.snippet))


def main() -> None:
    """Entry point of the ``flowdrop-local`` script."""
    cli(prog_name="flowdrop-local")


if __name__ == "__main__":  # pragma: no cover
    main()

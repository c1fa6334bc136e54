"""What every ``flowdrop-local`` command shares: errors, argument checks, output.

The guarantee the CLI makes is one ``Error: ...`` line and exit status 2 for bad
input, never a traceback. It is kept as a class, not case by case:

* :class:`FlowdropGroup` turns any :class:`FlowdropError` escaping a command into
  that line (an access denial into exit status 3), so a new command inherits it;
* its commands refuse, at parse time, arguments no library call can take: a NUL
  character anywhere, and a lone surrogate (an undecodable byte in ``argv``) in
  a text argument; file paths keep them, the file system takes such names;
* :func:`parse_json` reads ``--json`` / ``--metadata`` text, turning a nesting
  too deep for Python's parser or an integer longer than its conversion limit
  into that line as well;
* every message printed for a person goes through :func:`visible`, so stored
  terminal escapes are shown, not executed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

import click

from ._terminal import visible
from .access import AccessDenied
from .errors import FlowdropError
from .transcript import message_text

# Limits are SQLite integers: anything larger cannot be bound, so it is refused
# here as a usage error rather than failing inside the query.
LIMIT: Final = click.IntRange(min=0, max=2**63 - 1)
# --lock-timeout: what Store(lock_timeout=) takes (store.MAX_SECONDS at most).
LOCK_SECONDS: Final = click.FloatRange(min=0, min_open=True, max=1_000_000)
SHARED_SCHEMA_VARIABLE: Final = "FLOWDROP_PG_SHARED_SCHEMA"


def shared_schema() -> bool:
    """``Store(shared_schema=)`` for the CLI's stores: true when FLOWDROP_PG_SHARED_SCHEMA
    is ``1`` (or ``true``, ``yes``), accepting a PostgreSQL schema other roles may
    create objects in (with a warning) instead of refusing it."""
    return os.environ.get(SHARED_SCHEMA_VARIABLE, "").strip().lower() in {"1", "true", "yes"}


TOO_LONG_INTEGER: Final = (
    f"an integer of more than {sys.get_int_max_str_digits():,} digits, which Python cannot read"
)


class BadInput(click.ClickException):
    """A flowdrop_local error shown as one line, exit status 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(visible(message))


class Denied(click.ClickException):
    """An access denial shown as one line, exit status 3."""

    exit_code = 3

    def __init__(self, message: str) -> None:
        super().__init__(visible(message))


def _name(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    return param.human_readable_name


def _refuse_unusable_text(command: click.Command, ctx: click.Context) -> None:
    """A lone surrogate in a text argument cannot be stored or looked up: refuse it."""
    for param in command.params:
        if isinstance(param.type, click.Path | click.File) or param.name is None:
            continue
        value = ctx.params.get(param.name)
        values = value if isinstance(value, tuple) else (value,)
        for item in values:
            if isinstance(item, str) and not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise BadInput(
                        f"{_name(param)} is not valid UTF-8 text (it holds an undecodable byte)"
                    ) from None


def _escape(error: click.ClickException) -> None:
    """Click's own messages quote the argument as typed: show its control characters."""
    setattr(error, "message", visible(error.message))  # noqa: B010  (Final in click's stubs)


def _refuse_nul(args: Sequence[str]) -> None:
    """No real command line holds a NUL; SQLite and the file system would cut at it."""
    if any("\x00" in arg for arg in args):
        raise BadInput("an argument holds a NUL character")


def _checked_parse(
    command: click.Command,
    parse: Callable[[click.Context, list[str]], list[str]],
    ctx: click.Context,
    args: list[str],
) -> list[str]:
    _refuse_nul(args)
    try:
        rest = parse(ctx, args)
    except click.ClickException as error:
        _escape(error)
        raise
    _refuse_unusable_text(command, ctx)
    return rest


class FlowdropCommand(click.Command):
    """A command whose arguments are checked for text no library call can take."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _checked_parse(self, super().parse_args, ctx, args)


class FlowdropGroup(click.Group):
    """A group whose commands (and sub-groups) print bad input as one ``Error:`` line."""

    command_class = FlowdropCommand
    group_class = type  # sub-groups made with @group.group() are FlowdropGroups too

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _checked_parse(self, super().parse_args, ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AccessDenied as error:
            raise Denied(str(error)) from None
        except FlowdropError as error:
            raise BadInput(str(error)) from None
        except click.ClickException as error:
            _escape(error)
            raise


def require_conversation(buffer: Any, where: str) -> None:
    """:class:`BadInput` (exit 2) for an address no conversation has: ``show`` or
    ``delete`` of a typo must say so, not print nothing (or "deleted ... 0"). A buffer
    with a row (titled, or emptied) is a conversation; a refused identity scope is
    left to its refusal (it logs one warning and reads as empty, MEM-7)."""
    if getattr(buffer, "refused", False) or buffer.info().created_at is not None:
        return
    raise BadInput(f"no conversation {'/'.join(buffer.address)} in {where}")


def parse_json(text: str, option: str) -> Any:
    """``text`` as JSON, or :class:`BadInput` naming ``option``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise BadInput(f"{option} is not valid JSON: {error}") from None
    except RecursionError:
        raise BadInput(f"{option} is nested too deeply to read") from None
    except ValueError:  # the only ValueError left: an integer past Python's limit
        raise BadInput(f"{option} holds {TOO_LONG_INTEGER}") from None


def dump(value: Any) -> None:
    """Print ``value`` as indented JSON (control characters come out as ``\\u00XX``)."""
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


# --------------------------------------------------------------- text view

def message_notes(metadata: dict[str, Any]) -> list[str]:
    """The calls a turn declares, the call a result answers, and the HEALED mark."""
    notes = []
    calls = metadata.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = []
        for call in calls:
            if not isinstance(call, dict):
                continue
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else call.get("name")
            names.append(f"{call.get('tool_call_id', call.get('id'))}:{name}")
        notes.append("calls " + ", ".join(names))
    if "tool_call_id" in metadata:
        notes.append(f"answers {metadata['tool_call_id']}")
    if metadata.get("healed") is True:
        notes.append("HEALED")
    return notes


def echo_history(messages: list[dict[str, Any]]) -> None:
    """One line per message (more where its text has line breaks), escaped for a terminal."""
    for index, message in enumerate(messages):
        notes = message_notes(message["metadata"])
        suffix = f"  [{'; '.join(notes)}]" if notes else ""
        text = visible(message_text(message), keep_newlines=True)
        click.echo(f"{index:>4}  {message['role']:<9} {text}{visible(suffix)}")

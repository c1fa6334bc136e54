"""``flowdrop-local sessions``: try the session rules (MEM-8, MEM-9) from a shell.

A face: it builds a :class:`Principal` from ``--as`` and ``--admin`` and calls the
sessions API, which decides. Bad input exits 2 (like the rest of the CLI); an
access denial exits 3 and names its ``error_code``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from ._files import remove_database
from .access import AccessDenied, Principal
from .errors import FlowdropError
from .model import converter
from .sessions import Session, Sessions
from .store import Store

F = TypeVar("F", bound=Callable[..., Any])


class _BadInput(click.ClickException):
    """A flowdrop_local error shown as one line, exit status 2 (as ``cli.BadInput``)."""

    exit_code = 2


class _Denied(click.ClickException):
    """An access denial shown as one line, exit status 3."""

    exit_code = 3


def _principal_options(command: F) -> F:
    """``--as USER`` and ``--admin``: who the command acts as."""
    command = click.option(
        "--admin", is_flag=True, help="Act at the administrative tier (may do anything)."
    )(command)
    return click.option(
        "--as",
        "as_user",
        metavar="USER",
        help="Act as this user id (omit, or give 0, to act with no identity).",
    )(command)


@contextmanager
def _api(ctx: click.Context, as_user: str | None, admin: bool) -> Iterator[Sessions]:
    """The sessions API as the principal; errors become one ``Error:`` line.

    Only ``create`` may create the database, and it removes the file it created if it fails.
    """
    store: Store | None = None
    try:
        with Store(ctx.obj["db"], create=ctx.info_name == "create") as store:
            yield store.sessions(Principal(as_user, admin=admin))
    except BaseException as error:
        if store is not None and store.created:
            remove_database(store.path)
        if isinstance(error, AccessDenied):
            raise _Denied(str(error)) from None
        if isinstance(error, FlowdropError):
            raise _BadInput(str(error)) from None
        raise


def _session_dict(session: Session) -> dict[str, Any]:
    data: dict[str, Any] = converter.unstructure(session)
    return data


def _dump(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


@click.group()
def sessions() -> None:
    """Create, list and show sessions as a given user (--as USER, --admin)."""


@sessions.command()
@click.argument("workflow_id")
@click.option("--name", default="", help="A name for the session.")
@click.option("--owner", metavar="USER", help="Admin only: the owner (default: the --as user).")
@click.option("--no-owner", is_flag=True, help="Admin only: a session owned by nobody.")
@click.option("--metadata", "metadata_json", metavar="JSON", help="A JSON object to keep with it.")
@_principal_options
@click.pass_context
def create(
    ctx: click.Context,
    workflow_id: str,
    name: str,
    owner: str | None,
    no_owner: bool,
    metadata_json: str | None,
    as_user: str | None,
    admin: bool,
) -> None:
    """Create a session of WORKFLOW_ID and print it as JSON."""
    if owner is not None and no_owner:
        raise _BadInput("give --owner or --no-owner, not both")
    metadata = None
    if metadata_json is not None:
        try:
            metadata = json.loads(metadata_json)
        except json.JSONDecodeError as error:
            raise _BadInput(f"--metadata is not valid JSON: {error}") from None
    with _api(ctx, as_user, admin) as api:
        if no_owner:
            session = api.create(workflow_id, name=name, metadata=metadata, owner=None)
        elif owner is not None:
            session = api.create(workflow_id, name=name, metadata=metadata, owner=owner)
        else:
            session = api.create(workflow_id, name=name, metadata=metadata)
    _dump(_session_dict(session))


@sessions.command(name="list")
@click.option("--workflow", "workflow_id", help="Only sessions of this workflow.")
@click.option("--json", "json_output", is_flag=True, help="Print a JSON array.")
@_principal_options
@click.pass_context
def list_(
    ctx: click.Context, workflow_id: str | None, json_output: bool, as_user: str | None, admin: bool
) -> None:
    """List the sessions the --as user may read, oldest first."""
    with _api(ctx, as_user, admin) as api:
        found = api.list(workflow_id=workflow_id)
    if json_output:
        _dump([_session_dict(s) for s in found])
        return
    for s in found:
        owner = s.owner_id if s.owner_id is not None else "(nobody)"
        click.echo(f"{s.id}  {s.status:<7}  {owner:<12}  {s.workflow_id}  {s.name}")


@sessions.command()
@click.argument("session_id")
@click.option("--limit", type=click.IntRange(min=0), help="Only the last N messages.")
@click.option("--json", "json_output", is_flag=True, help="Print {session, messages} as JSON.")
@_principal_options
@click.pass_context
def show(
    ctx: click.Context,
    session_id: str,
    limit: int | None,
    json_output: bool,
    as_user: str | None,
    admin: bool,
) -> None:
    """Print SESSION_ID and its current conversation, if the --as user may read it."""
    with _api(ctx, as_user, admin) as api:
        session = api.get(session_id)
        messages = api.read(session_id, limit)
    if json_output:
        _dump({"session": _session_dict(session), "messages": messages})
        return
    owner = session.owner_id if session.owner_id is not None else "(nobody)"
    click.echo(f"session {session.id}  [{session.status}]  owner {owner}")
    click.echo(f"workflow {session.workflow_id}  name {session.name!r}  {session.conversation_key}")
    for index, message in enumerate(messages):
        content = message["content"]
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        click.echo(f"{index:>4}  {message['role']:<9} {text}")

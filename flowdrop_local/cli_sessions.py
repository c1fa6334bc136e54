"""``flowdrop-local sessions``: try the session rules (MEM-8, MEM-9) from a shell.

A face: it builds a :class:`Principal` from ``--as`` and ``--admin`` and calls the
sessions API, which decides. Bad input exits 2 (like the rest of the CLI); an
access denial exits 3 and names its ``error_code`` (see :mod:`._cli_common`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from ._cli_common import (
    LIMIT,
    BadInput,
    FlowdropGroup,
    dump,
    echo_history,
    parse_json,
    shared_schema,
)
from ._files import remove_database
from ._terminal import visible
from .access import Principal
from .model import converter
from .sessions import Session, Sessions
from .store import Store

F = TypeVar("F", bound=Callable[..., Any])


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
    """The sessions API as the principal (the group turns its errors into one line).

    Only ``create`` may create the database, and it removes the file it created if it fails.
    """
    store: Store | None = None
    try:
        with Store(
            ctx.obj["db"],
            create=ctx.info_name == "create",
            lock_timeout=ctx.obj.get("lock_timeout"),
            shared_schema=shared_schema(),
        ) as store:
            yield store.sessions(Principal(as_user, admin=admin))
    except BaseException:
        if store is not None and store.created:
            remove_database(store.path)
        raise


def _session_dict(session: Session) -> dict[str, Any]:
    data: dict[str, Any] = converter.unstructure(session)
    return data


@click.group(cls=FlowdropGroup)
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
        raise BadInput("give --owner or --no-owner, not both")
    metadata = None if metadata_json is None else parse_json(metadata_json, "--metadata")
    with _api(ctx, as_user, admin) as api:
        if no_owner:
            session = api.create(workflow_id, name=name, metadata=metadata, owner=None)
        elif owner is not None:
            session = api.create(workflow_id, name=name, metadata=metadata, owner=owner)
        else:
            session = api.create(workflow_id, name=name, metadata=metadata)
    dump(_session_dict(session))


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
        dump([_session_dict(s) for s in found])
        return
    for s in found:
        owner = s.owner_id if s.owner_id is not None else "(nobody)"
        click.echo(visible(f"{s.id}  {s.status:<7}  {owner:<12}  {s.workflow_id}  {s.name}"))


@sessions.command()
@click.argument("session_id")
@click.option("--limit", type=LIMIT, help="Only the last N messages.")
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
        dump({"session": _session_dict(session), "messages": messages})
        return
    owner = session.owner_id if session.owner_id is not None else "(nobody)"
    click.echo(visible(f"session {session.id}  [{session.status}]  owner {owner}"))
    click.echo(
        visible(
            f"workflow {session.workflow_id}  name {session.name!r}  {session.conversation_key}"
        )
    )
    echo_history(messages)

"""What every stage shares: buffer addresses, the scopes a sync covers (and what
they leave out), the wall clock's stamp."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence

from ..access import IDENTITY_SCOPES, resolve_address
from ..backends.base import Tx
from ..errors import (
    InvalidAddress,
    InvalidArgument,
    shown,
)

Address = tuple[str, str, str]


Key = tuple[str, str, str]


class Scopes:
    """Which buffer addresses a sync covers.

    Default (``None``): every scope that is not an identity scope: ``global``,
    ``workflow``, ``pipeline``, ``execution`` and every scope the application named
    itself (``store.buffer("chat", ...)``). ``user`` and ``session`` buffers move only
    when named: ``("user", "42")`` or ``"user:42"`` one identity, ``"user"`` every
    user's. An application's scope is named the same way (``"chat"``,
    ``"chat:ana"``). ``"all"``: every buffer, whatever its scope.
    """

    def __init__(self, scopes: Iterable[object] | None) -> None:
        self.named = scopes is not None
        self.all = False
        self.default = scopes is None
        self.whole: set[str] = set()
        self.ids: set[tuple[str, str]] = set()
        if scopes is None:
            return
        if isinstance(scopes, str | tuple):
            scopes = [scopes]
        for item in scopes:
            scope, scope_id = parse_scope(item)
            if scope == "all":
                self.all = True
            elif scope_id is None:
                self.whole.add(scope)
            else:
                self.ids.add((scope, scope_id))

    @property
    def everything(self) -> bool:
        return self.all

    @property
    def key(self) -> str:
        """These scopes as text, the same for the same set ('all' for everything)."""
        if self.all:
            return "all"
        if self.default:
            return "default"
        return " ".join(sorted(self.whole) + sorted(f"{s}:{i}" for s, i in self.ids))

    def __contains__(self, address: Sequence[str]) -> bool:
        if self.all or (self.default and address[0] not in IDENTITY_SCOPES):
            return True
        return address[0] in self.whole or (address[0], address[1]) in self.ids


def parse_scope(item: object) -> tuple[str, str | None]:
    if isinstance(item, str):
        scope, _, scope_id = item.partition(":")
        parsed: tuple[str, str | None] = (scope, scope_id if _ else None)
    elif (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], str)
    ):
        parsed = (item[0], item[1])
    else:
        raise InvalidArgument(
            f"a sync scope is 'SCOPE', 'SCOPE:ID' or (scope, id), not {shown(item)}"
        )
    if parsed[0] == "all":
        if parsed[1] is not None:
            raise InvalidArgument("'all' takes no id")
        return parsed
    try:  # an application's own scope is named as an address names it
        resolve_address(parsed[0], "x")
    except InvalidAddress as error:
        raise InvalidArgument(f"{error} (a sync scope, or 'all')") from None
    if parsed[1] is not None and parsed[1].strip() in ("", "0") and parsed[0] in IDENTITY_SCOPES:
        raise InvalidArgument(f"{parsed[0]}:{parsed[1]!r} names no identity")
    return parsed


def left_out(tx: Tx, scopes: Scopes) -> tuple[int, int]:
    """The buffers and memory values of one side that ``scopes`` leave out."""
    if scopes.all:
        return 0, 0
    buffers = sum(n for s, i, n in tx.all("sync_buffer_owners") if (s, i) not in scopes)
    memory = sum(n for s, i, n in tx.all("sync_memory_owners") if (s, i) not in scopes)
    return buffers, memory


# ------------------------------------------------------------------ replicas


def wall_clock() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

"""A session for the OpenAI Agents SDK that keeps its history in a flowdrop_local buffer.

``Session(session_id, path_or_store)`` implements the SDK's ``Session`` protocol
(``get_items``, ``add_items``, ``pop_item``, ``clear_session``, all async, and
``session_settings``) and behaves as the SDK's own ``SQLiteSession`` wherever the
protocol leaves room: ``get_items(limit)`` returns the last ``limit`` items in
order (``0`` gives none, a negative limit all), ``limit=None`` falls back to
``session_settings.limit``, settings are given as ``SessionSettings`` or a dict,
``":memory:"`` is the default, several sessions share one file, and ``close()``
ends the session (any later call raises :class:`~flowdrop_local.StoreClosed`, a
``RuntimeError``).

Storage: one message per Responses item in the buffer ``("session",
session_id, key)``, the item kept verbatim in its metadata
(:func:`~flowdrop_local.providers.item_to_message`), so ``get_items`` returns the
items that were added, in order, less what the buffer rules drop (MEM-1: a
second output for a call; MEM-2: a ``function_call`` stored again), plus the
placeholders of healed calls as ``function_call_output`` items. A
``function_call``'s call id is its ``call_id``; its ``id`` (``fc_...``) names the
item and is never read as the call id.

Healing shows one run later. The SDK reads the history *before* it stores the
run's new user item, and healing (MEM-3) happens when that user item is stored;
so the run in which the user moves on after an unanswered call (an approval
left pending, a crash) does not see the placeholder (the SDK leaves the dangling
call out of that model input itself), and every run after it sees the call and
its placeholder side by side. When the real output arrives later (the old run is
resumed and approved), it replaces the placeholder in place (MEM-10): each
``call_id`` keeps exactly one output.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any, Final

from agents.items import TResponseInputItem
from agents.memory import SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit

from ..buffer import Buffer
from ..errors import InvalidAddress, InvalidMessage, StoreClosed
from ..providers import item_to_message, message_to_items
from ..store import Store

DEFAULT_KEY: Final = "openai-agents"


class Session:
    """An Agents SDK session stored in a flowdrop_local buffer.

    Args:
        session_id: the conversation's id; a ``session`` scope needs a real
            identity, so a blank id or ``"0"`` is refused.
        path_or_store: a database file (opened here and closed by
            :meth:`close`), ``":memory:"`` (the default, as ``SQLiteSession``),
            or an open :class:`~flowdrop_local.Store` to share (left open).
        key: the buffer key under ``("session", session_id)``.
        session_settings: ``SessionSettings`` or a dict of its fields; its
            ``limit`` is the default of :meth:`get_items`.

    Raises:
        InvalidAddress: ``session_id`` is not a usable identity.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        path_or_store: str | os.PathLike[str] | Store = ":memory:",
        *,
        key: str = DEFAULT_KEY,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._owns_store = not isinstance(path_or_store, Store)
        self.store = path_or_store if isinstance(path_or_store, Store) else Store(path_or_store)
        try:
            buffer = self.store.buffer("session", session_id, key)
            if buffer.refused:
                raise InvalidAddress(
                    f"session_id {session_id!r} is not a usable identity for a session buffer"
                )
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise
        self.buffer: Buffer = buffer
        self._closed = False

    def __repr__(self) -> str:
        return f"<openai_agents.Session {self.session_id!r} in {self.store.path!r}>"

    def _check_not_closed(self) -> None:
        if self._closed:
            raise StoreClosed(f"the session {self.session_id!r} is closed")

    # ------------------------------------------------------------ the protocol

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history as Responses input items, oldest first.

        ``limit``: only the last ``limit`` items (``None``: ``session_settings.limit``,
        then all; ``0``: none; negative: all, as ``SQLiteSession`` reads it).
        """
        self._check_not_closed()
        resolved = resolve_session_limit(limit, self.session_settings)
        return await asyncio.to_thread(self._get_items, resolved)

    def _get_items(self, limit: int | None) -> list[TResponseInputItem]:
        if limit == 0:
            return []
        bounded = limit is not None and limit > 0
        messages = self.buffer.read(limit=limit if bounded else None)
        items = [item for message in messages for item in message_to_items(message)]
        if bounded:
            # A message not stored by a session can map to several items.
            items = items[-limit:]  # type: ignore[operator]
        return items  # type: ignore[return-value]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the items in one append, keeping the buffer rules (MEM-1, 2, 3, 10).

        Raises:
            InvalidMessage: an item cannot be stored (a ``function_call``
                without a ``call_id``, say); nothing was written.
        """
        self._check_not_closed()
        if not items:
            return
        messages = [item_to_message(_as_dict(item)) for item in items]
        await asyncio.to_thread(self.buffer.append, messages)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the most recent item, or ``None`` when there is none.

        Exactly that item leaves :meth:`get_items`: a message that maps to several
        items (assistant text and a call, appended outside the session) keeps the
        others, stored again one message per item; entries after it that show as
        no item (an empty assistant turn) go with it. Removing a result
        un-answers its call (the next user item heals it again); removing a call
        removes its declaration.
        """
        self._check_not_closed()
        return await asyncio.to_thread(self._pop_item)

    def _pop_item(self) -> TResponseInputItem | None:
        peek = 1
        while True:
            tail = self.buffer.read(limit=peek)
            shown = [bool(message_to_items(m)) for m in tail]
            if any(shown):
                after = shown[::-1].index(True)  # trailing messages that show no item
                break
            if len(tail) < peek:
                return None  # no item at all: nothing is removed
            peek *= 2
        for _ in range(after):
            self.buffer.pop()
        last = self.buffer.pop()
        if last is None:  # emptied meanwhile by another writer
            return None
        items = message_to_items(last)
        if len(items) > 1:
            self.buffer.append([item_to_message(item) for item in items[:-1]])
        return items[-1] if items else None  # type: ignore[return-value]

    async def clear_session(self) -> None:
        """Delete every item of this session (other sessions in the file are untouched)."""
        self._check_not_closed()
        await asyncio.to_thread(self.buffer.clear)

    def close(self) -> None:
        """End the session, and close the store if this session opened it. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._owns_store:
                self.store.close()


def _as_dict(item: object) -> dict[str, Any]:
    """An input item as a plain dict (the SDK passes dicts; pydantic items are dumped)."""
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        dumped = dump(exclude_unset=True)
        if isinstance(dumped, dict):
            return dumped
    raise InvalidMessage(0, "item", f"a session item must be a mapping, not {type(item).__name__}")

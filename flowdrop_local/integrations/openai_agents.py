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

Write-ahead (``Runner.run(..., session=session, hooks=session.hooks)``): the SDK
stores a turn's items only after its tools have run, so a process killed inside a
tool would leave nothing of the model's call to heal. :attr:`Session.hooks`
stores the model's messages, reasoning items and function calls as soon as the
model returns them (``RunHooks.on_llm_end``, which the SDK awaits before any tool
starts). When the SDK then saves the turn, the items written ahead *by that run*
are dropped once each, matched by content, never by item id (ids repeat:
``"scripted-message"``, ``"__fake_id__"``), so an identical real second reply is
kept. The run is told apart by its ``RunContextWrapper``: every method here takes
the SDK's optional ``wrapper`` keyword (the SDK's context-aware session contract),
and only a run that reads or writes this session through it is written ahead.
Other output items (hosted tool calls, MCP, compaction) are saved by the SDK at
the end of the turn, as without the hooks.
"""

from __future__ import annotations

import asyncio
import json
import os
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final, Protocol

from agents import Agent, RunContextWrapper, RunHooks, Tool
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import SessionSettings
from agents.memory.session_settings import coerce_session_settings, resolve_session_limit

from ..access import resolve_address
from ..aio import AsyncStore
from ..backends import is_postgresql_target
from ..buffer import Buffer, valid_address_part
from ..errors import InvalidAddress, InvalidMessage, StoreClosed
from ..providers import item_to_message, message_to_items
from ..store import Store

DEFAULT_KEY: Final = "openai-agents"
# The output items written ahead: the SDK saves exactly these (``to_input_item``
# of the raw item) at the end of the turn. Other kinds are transformed on the
# way, so a write-ahead copy would not be recognised and would be stored twice.
WRITTEN_AHEAD: Final = frozenset({"message", "reasoning", "function_call"})


class Session:
    """An Agents SDK session stored in a flowdrop_local buffer.

    Args:
        session_id: the conversation's id; a ``session`` scope needs a real
            identity, so a blank id or ``"0"`` is refused.
        path_or_store: a database file or ``":memory:"`` (the default, as
            ``SQLiteSession``): opened here as an :class:`~flowdrop_local.AsyncStore`
            (its own worker thread; no thread hop per call) and closed by
            :meth:`close`. An :class:`~flowdrop_local.AsyncStore` to share (left
            open): on PostgreSQL, natively async on the loop that opened it. A
            ``postgresql://`` URL or a sync :class:`~flowdrop_local.Store`: sync
            calls on asyncio's default threads (a session outlives event loops,
            ``asyncio.run`` after ``asyncio.run``, and an async pool cannot).
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
        path_or_store: str | os.PathLike[str] | AsyncStore | Store = ":memory:",
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
        valid_address_part("key", key, allow_empty=False)
        if resolve_address("session", session_id).refused:
            raise InvalidAddress(
                f"session_id {session_id!r} is not a usable identity for a session buffer"
            )
        self._key = key
        self._owns_store = not isinstance(path_or_store, AsyncStore | Store)
        self.store: AsyncStore | Store
        if isinstance(path_or_store, AsyncStore | Store):
            self.store = path_or_store
        elif is_postgresql_target(path_or_store):
            self.store = Store(path_or_store)
        else:
            self.store = AsyncStore(os.fspath(path_or_store)).open_blocking()
        self._history: _History | None = None
        self._closed = False
        # Per run (keyed by the id of its RunContextWrapper, dropped with it):
        # what it wrote ahead and the SDK has not saved yet.
        self._runs: dict[int, _Run] = {}
        self.hooks: RunHooks[Any] = WriteAheadHooks(self)
        """Hooks that write the model's output ahead: ``Runner.run(..., hooks=session.hooks)``."""

    def __repr__(self) -> str:
        return f"<openai_agents.Session {self.session_id!r} in {self.store.path!r}>"

    def _check_not_closed(self) -> None:
        if self._closed:
            raise StoreClosed(f"the session {self.session_id!r} is closed")

    @property
    def buffer(self) -> Buffer:
        """The session's buffer as a sync :class:`~flowdrop_local.Buffer`, to read or
        export the history outside the SDK (``session.buffer.to_anthropic()``).

        Raises:
            UnsupportedOperation: the session shares a PostgreSQL ``AsyncStore``.
        """
        store = self.store
        sync = store if isinstance(store, Store) else store.sync_store()
        return sync.buffer("session", self.session_id, self._key)

    async def _buffer(self) -> _History:
        """The session's buffer, opening the store on first use."""
        self._check_not_closed()
        if self._history is None:
            store = self.store
            if isinstance(store, Store):
                self._history = _ThreadHop(self.buffer)
            else:
                await store.open()
                self._history = store.buffer("session", self.session_id, self._key)
        return self._history

    # ------------------------------------------------------------ the protocol

    async def get_items(
        self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[TResponseInputItem]:
        """The history as Responses input items, oldest first.

        ``limit``: only the last ``limit`` items (``None``: ``session_settings.limit``,
        then all; ``0``: none; negative: all, as ``SQLiteSession`` reads it).
        ``wrapper``: the SDK's run context; its run may then write ahead.
        """
        self._check_not_closed()
        self._join(wrapper)
        limit = resolve_session_limit(limit, self.session_settings)
        if limit == 0:
            return []
        bounded = limit is not None and limit > 0
        buffer = await self._buffer()
        messages = await buffer.read(limit if bounded else None)
        items = [item for message in messages for item in message_to_items(message)]
        if bounded:
            # A message not stored by a session can map to several items.
            items = items[-limit:]  # type: ignore[operator]
        return items  # type: ignore[return-value]

    async def add_items(
        self, items: list[TResponseInputItem], *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        """Store the items in one append, keeping the buffer rules (MEM-1, 2, 3, 10).

        ``wrapper``: the SDK's run context; the items this run wrote ahead are
        dropped here, once each.

        Raises:
            InvalidMessage: an item cannot be stored (a ``function_call``
                without a ``call_id``, say); nothing was written.
        """
        self._check_not_closed()
        run = self._join(wrapper)
        given = [_as_dict(item) for item in items]
        messages = [item_to_message(item) for item in given]
        if run is not None:
            messages = [m for item, m in zip(given, messages, strict=True) if not run.saved(item)]
        if messages:
            await self._append(messages)

    async def _append(self, messages: list[dict[str, Any]]) -> None:
        """One append of stored messages (the only write path of items)."""
        await (await self._buffer()).append(messages)

    async def pop_item(
        self, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> TResponseInputItem | None:
        """Remove and return the most recent item, or ``None`` when there is none.

        Exactly that item leaves :meth:`get_items`: a message that maps to several
        items (assistant text and a call, appended outside the session) keeps the
        others, stored again one message per item; entries after it that show as
        no item (an empty assistant turn) go with it. Removing a result
        un-answers its call (the next user item heals it again); removing a call
        removes its declaration.
        """
        buffer = await self._buffer()
        peek = 1
        while True:
            tail = await buffer.read(peek)
            shown = [bool(message_to_items(m)) for m in tail]
            if any(shown):
                after = shown[::-1].index(True)  # trailing messages that show no item
                break
            if len(tail) < peek:
                return None  # no item at all: nothing is removed
            peek *= 2
        for _ in range(after):
            await buffer.pop()
        last = await buffer.pop()
        if last is None:  # emptied meanwhile by another writer
            return None
        items = message_to_items(last)
        if len(items) > 1:
            await buffer.append([item_to_message(item) for item in items[:-1]])
        return items[-1] if items else None  # type: ignore[return-value]

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Delete every item of this session (other sessions in the file are untouched)."""
        await (await self._buffer()).clear()

    # ------------------------------------------------------------ write-ahead

    def hooks_with(self, app_hooks: RunHooks[Any]) -> RunHooks[Any]:
        """Hooks that call ``app_hooks`` for every event, then write ahead (the SDK takes one)."""
        return WriteAheadHooks(self, app_hooks)

    def _join(self, wrapper: RunContextWrapper[Any] | None) -> _Run | None:
        """The run of ``wrapper``, registered on first sight (``None``: no run, no dedup)."""
        if wrapper is None:
            return None
        key = id(wrapper)
        run = self._runs.get(key)
        if run is None or run.context() is not wrapper:
            runs = self._runs

            def forget(_: object) -> None:
                if runs.get(key) is run:
                    del runs[key]

            run = _Run(weakref.ref(wrapper, forget))
            runs[key] = run
        return run

    async def _write_ahead(self, wrapper: RunContextWrapper[Any], response: ModelResponse) -> None:
        """Store the model's messages, reasoning and calls before any tool of this turn runs."""
        run = self._runs.get(id(wrapper))
        if run is None or run.context() is not wrapper:
            return  # a run that does not use this session
        self._check_not_closed()
        items = [_as_dict(item) for item in response.to_input_items()]
        items = [_without_null_status(i) for i in items if i.get("type") in WRITTEN_AHEAD]
        if items:
            await self._append([item_to_message(item) for item in items])
            run.wrote(items)

    def close(self) -> None:
        """End the session, and close the store if this session opened it. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._owns_store:
                if isinstance(self.store, Store):
                    self.store.close()
                else:
                    self.store.close_blocking()


class _Run:
    """One SDK run using the session: the items it wrote ahead, not yet saved by the SDK."""

    def __init__(self, context: weakref.ref[RunContextWrapper[Any]]) -> None:
        self.context = context
        self.ahead: Counter[str] = Counter()

    def wrote(self, items: list[dict[str, Any]]) -> None:
        self.ahead.update(_fingerprint(item) for item in items)

    def saved(self, item: Mapping[str, Any]) -> bool:
        """True (and forgotten) when ``item`` is one this run wrote ahead and has not matched."""
        key = _fingerprint(item)
        if self.ahead[key] <= 0:
            return False
        self.ahead[key] -= 1
        return True


def _without_null_status(item: dict[str, Any]) -> dict[str, Any]:
    # The SDK drops a ``status`` of None when it saves a run item.
    return (
        item
        if item.get("status", "") is not None
        else {k: v for k, v in item.items() if k != "status"}
    )


def _fingerprint(item: Mapping[str, Any]) -> str:
    """What an item says, to match the SDK's save against the write-ahead copy.

    A reasoning item is matched without its ``id``: ``reasoning_item_id_policy="omit"``
    makes the SDK save it without one.
    """
    kept = _without_null_status(dict(item))
    if kept.get("type") == "reasoning":
        kept.pop("id", None)
    return json.dumps(kept, sort_keys=True, default=repr)


class WriteAheadHooks(RunHooks[Any]):
    """Run hooks that store the model's output before its tools run (see the module doc).

    Every event goes to ``app_hooks`` first, if given; ``on_llm_end`` then writes ahead.
    """

    def __init__(self, session: Session, app_hooks: RunHooks[Any] | None = None) -> None:
        self.session = session
        self.app_hooks = app_hooks if app_hooks is not None else RunHooks[Any]()

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        await self.app_hooks.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        await self.app_hooks.on_llm_end(context, agent, response)
        await self.session._write_ahead(context, response)

    async def on_agent_start(self, context: Any, agent: Agent[Any]) -> None:
        await self.app_hooks.on_agent_start(context, agent)

    async def on_agent_end(self, context: Any, agent: Agent[Any], output: Any) -> None:
        await self.app_hooks.on_agent_end(context, agent, output)

    async def on_handoff(
        self, context: RunContextWrapper[Any], from_agent: Agent[Any], to_agent: Agent[Any]
    ) -> None:
        await self.app_hooks.on_handoff(context, from_agent, to_agent)

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        await self.app_hooks.on_tool_start(context, agent, tool)

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object
    ) -> None:
        await self.app_hooks.on_tool_end(context, agent, tool, result)


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


class _History(Protocol):
    """What the session asks of its buffer: an AsyncBuffer, or a sync Buffer on a thread."""

    async def read(self, limit: int | None = None) -> list[dict[str, Any]]: ...
    async def append(self, messages: list[dict[str, Any]]) -> Any: ...
    async def pop(self) -> dict[str, Any] | None: ...
    async def clear(self) -> int: ...


class _ThreadHop:
    """A sync :class:`~flowdrop_local.Buffer` (of a shared sync Store) behind ``await``."""

    def __init__(self, buffer: Buffer) -> None:
        self._buffer = buffer

    async def read(self, limit: int | None = None) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._buffer.read, limit)

    async def append(self, messages: list[dict[str, Any]]) -> Any:
        return await asyncio.to_thread(self._buffer.append, messages)

    async def pop(self) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._buffer.pop)

    async def clear(self) -> int:
        return await asyncio.to_thread(self._buffer.clear)


"""Records the library hands out, and the one converter used at the edges.

Records are frozen attrs classes. ``converter`` (cattrs, JSON-preconfigured) turns
stored rows into :class:`Message` and records into JSON-ready dicts for the CLI
and exports. The hot paths (append, ``Buffer.read``) work on tuples and dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from cattrs.preconf.json import make_converter

from .rules.pairing import call_id_of, is_usable_call_id, marked_healed


@attrs.frozen
class ToolCall:
    """A tool call declared by an assistant turn, read through either id spelling."""

    id: str
    name: str | None
    arguments: Any
    raw: Mapping[str, Any]

    @classmethod
    def from_declaration(cls, call: Mapping[str, Any]) -> ToolCall:
        """Read a declared call in the spec, flat or OpenAI chat shape."""
        function = call.get("function")
        if isinstance(function, Mapping):
            name, arguments = function.get("name"), function.get("arguments")
        else:
            name, arguments = call.get("name"), call.get("arguments", call.get("input"))
        call_id = call_id_of(call)
        return cls(
            id=call_id if is_usable_call_id(call_id) else "",  # type: ignore[arg-type]
            name=name if isinstance(name, str) else None,
            arguments=arguments,
            raw=call,
        )


@attrs.frozen
class Message:
    """A stored message.

    ``content`` is a string, or the list of content parts it was appended with.
    Tool data lives in ``metadata``; the properties read it.
    """

    id: str
    position: str
    role: str
    content: str | list[Any]
    metadata: dict[str, Any] = attrs.field(factory=dict)
    created_at: str = ""

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The calls this turn declares (empty for every role but assistant)."""
        calls = self.metadata.get("tool_calls")
        if not isinstance(calls, list):
            return ()
        return tuple(ToolCall.from_declaration(c) for c in calls if isinstance(c, Mapping))

    @property
    def tool_call_id(self) -> str | None:
        """The call a tool message answers."""
        value = self.metadata.get("tool_call_id")
        return value if isinstance(value, str) else None

    @property
    def healed(self) -> bool:
        """True for a synthetic placeholder inserted by healing (MEM-3)."""
        return marked_healed(self.role, self.metadata)

    def to_dict(self) -> dict[str, Any]:
        """The ``{"role", "content", "metadata"}`` shape that ``Buffer.read`` returns."""
        return {"role": self.role, "content": self.content, "metadata": self.metadata}


@attrs.frozen
class AppendResult:
    """What one append did (MEM-14).

    ``appended`` counts incoming messages that became new entries: a dropped
    duplicate (MEM-1, MEM-2) and a placeholder replaced in place (MEM-10) count
    zero, and healing placeholders are not incoming messages. ``count`` is the
    buffer's size after the append, placeholders included and messages evicted
    by a window (``evicted``) excluded. ``dropped`` counts MEM-1/MEM-2 drops.
    """

    count: int
    appended: int
    message_ids: tuple[str, ...] = ()
    healed_ids: tuple[str, ...] = ()
    replaced_ids: tuple[str, ...] = ()
    dropped: int = 0
    evicted: int = 0
    appended_any: bool = attrs.field(init=False)

    @appended_any.default
    def _appended_any(self) -> bool:
        return self.appended > 0


@attrs.frozen
class BufferRef:
    """The address of a buffer and its size, as ``Store.buffers`` lists it."""

    scope: str
    scope_id: str
    key: str
    count: int


@attrs.frozen
class BufferInfo:
    """A conversation as ``Buffer.info`` and ``Store.conversations`` give it.

    ``created_at`` and ``updated_at`` are ISO 8601 UTC text, ``None`` while the
    buffer has no row (nothing appended, no title or metadata set). ``updated_at``
    is coarse: an append writes it at most once a minute.
    """

    scope: str
    scope_id: str
    key: str
    title: str = ""
    metadata: dict[str, Any] = attrs.field(factory=dict)
    created_at: str | None = None
    updated_at: str | None = None
    count: int = 0

    @property
    def address(self) -> tuple[str, str, str]:
        """``(scope, scope_id, key)``."""
        return (self.scope, self.scope_id, self.key)


@attrs.frozen
class Page:
    """One page of a listing: its items, and the cursor of the next page (``None``: last)."""

    items: tuple[BufferInfo, ...]
    next: str | None = None


@attrs.frozen
class SearchHit:
    """One message a search found, best first.

    ``snippet`` is the message's text around the match, each matched term between
    ``[`` and ``]`` (text cut short is marked ``...``); ``score`` is higher for a
    better match (its scale depends on the backend).
    """

    scope: str
    scope_id: str
    key: str
    message_id: str
    role: str
    snippet: str
    score: float


converter = make_converter()
# Content is stored verbatim: a string, or the list of parts it arrived as.
converter.register_structure_hook_func(lambda t: t == (str | list[Any]), lambda value, _: value)


def _unstructure_append_result(result: AppendResult) -> dict[str, Any]:
    return {
        field.name: converter.unstructure(getattr(result, field.name))
        for field in attrs.fields(AppendResult)
    }


converter.register_unstructure_hook(AppendResult, _unstructure_append_result)

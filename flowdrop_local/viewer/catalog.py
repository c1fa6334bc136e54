"""What the viewer reads, behind one small class the server calls.

The server never touches the store itself: it asks a :class:`Catalog` for a page
of conversations, a page of one transcript, or search hits, each as JSON-ready
data. So the listing and the search can change (a paged ``order="recent"``
listing, FTS search) without the server or the page changing.

The listing is ``store.conversations()`` (most recently updated first, a keyset
range of the recency index: one page costs the same however many buffers there
are; its opaque cursor is passed through), and search is ``store.search()``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from ..buffer import valid_limit
from ..errors import FlowdropError, InvalidArgument
from ..store import Store
from ..transcript import transcript

__all__ = ["SEARCH_HINT", "Catalog"]

SEARCH_HINT: Final = "search is not enabled: run `flowdrop-local search --enable`"
# A page that would start with tool results is widened back to their call, this
# many messages at a time, so that a result is drawn next to its call.
_WIDEN_STEP: Final = 50
_MAX_WIDEN: Final = 2_000
# A snippet marks each matched term as [...] (store.search), <mark>...</mark> or
# \x02...\x03; the rest is plain text. (A bracket the text itself holds may show
# as a mark: the page only ever draws text, so that is cosmetic.)
_MARK: Final = re.compile(r"<mark>(.*?)</mark>|\x02(.*?)\x03|\[([^\[\]\n]*)\]", re.DOTALL)


def _address(value: object) -> list[str]:
    """An address given as a tuple, a dict or an object with scope/scope_id/key."""
    if isinstance(value, Mapping):
        return [str(value["scope"]), str(value["scope_id"]), str(value["key"])]
    if isinstance(value, list | tuple):
        return [str(part) for part in value]
    return [str(value.scope), str(value.scope_id), str(value.key)]  # type: ignore[attr-defined]


def _field(hit: object, name: str, default: Any = None) -> Any:
    if isinstance(hit, Mapping):
        return hit.get(name, default)
    return getattr(hit, name, default)


def snippet_segments(snippet: str) -> list[dict[str, Any]]:
    """A snippet as ``[{text, mark}]``: the page draws marked terms, never the markup."""
    segments: list[dict[str, Any]] = []
    at = 0
    for match in _MARK.finditer(snippet):
        if match.start() > at:
            segments.append({"text": snippet[at : match.start()], "mark": False})
        marked = match.group(1) or match.group(2) or match.group(3) or ""
        segments.append({"text": marked, "mark": True})
        at = match.end()
    if at < len(snippet):
        segments.append({"text": snippet[at:], "mark": False})
    return segments


class Catalog:
    """The viewer's reads over one (read-only) store, as JSON-ready dicts."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # ---------------------------------------------------------------- listing

    def conversations(self, *, limit: int = 50, after: str | None = None) -> dict[str, Any]:
        """A page of conversations, newest first: ``{items, next}``.

        Each item: ``address``, ``title``, ``count`` and ``updated_at``. ``next`` is
        the cursor of the next page, or None.

        Raises:
            InvalidArgument: a bad ``limit`` or ``after``.
        """
        page = self.store.conversations(limit=valid_limit(limit), after=after or None)
        return {
            "items": [
                {
                    "address": [info.scope, info.scope_id, info.key],
                    "title": info.title,
                    "count": info.count,
                    "updated_at": info.updated_at or "",
                }
                for info in page.items
            ],
            "next": page.next,
        }

    # ------------------------------------------------------------- transcript

    def transcript(
        self, address: tuple[str, str, str], *, limit: int = 100, before: str | None = None
    ) -> dict[str, Any]:
        """The last ``limit`` messages (before message ``before``) as transcript entries.

        Returns ``{address, count, entries, before}``: ``before`` is the id to ask
        for the previous page with, or None at the start of the history. A page
        never starts inside a turn's results: it is widened back to their call.

        Raises:
            MessageNotFound: ``before`` is not a message of this buffer.
        """
        buffer = self.store.buffer(*address)
        messages = buffer.messages(valid_limit(limit), before=before)
        widened = 0
        while messages and messages[0].role == "tool" and widened < _MAX_WIDEN:
            earlier = buffer.messages(_WIDEN_STEP, before=messages[0].id)
            if not earlier:
                break
            # Keep from the last turn that is not a result: the call turn.
            cut = max((i for i, m in enumerate(earlier) if m.role != "tool"), default=0)
            messages = earlier[cut:] + messages
            widened += len(earlier) - cut
        first = messages[0].id if messages else None
        more = first is not None and bool(buffer.messages(1, before=first))
        return {
            "address": list(address),
            "count": len(buffer),
            "entries": transcript(messages),
            "before": first if more else None,
        }

    # ----------------------------------------------------------------- search

    def search(
        self,
        query: str,
        *,
        scope: str | None = None,
        scope_id: str | None = None,
        key: str | None = None,
        limit: int = 20,
    ) -> dict[str, Any]:
        """``{enabled, hint, hits}``; each hit ``{address, message_id, role, segments, score}``.

        Search is the store's (``store.search``); when the store has none, or
        search is not enabled on this database, ``enabled`` is False and ``hint``
        says how to enable it.
        """
        search = getattr(self.store, "search", None)
        enabled = getattr(self.store, "search_enabled", None)
        if callable(enabled):
            enabled = enabled()
        if not callable(search) or enabled is False:
            return {"enabled": False, "hint": SEARCH_HINT, "hits": []}
        if not query.strip():
            return {"enabled": True, "hint": "", "hits": []}
        try:
            hits = search(query, scope=scope, scope_id=scope_id, key=key, limit=valid_limit(limit))
        except InvalidArgument:
            raise
        except FlowdropError as error:  # e.g. the index was never built
            return {"enabled": False, "hint": f"{SEARCH_HINT} ({error})", "hits": []}
        return {
            "enabled": True,
            "hint": "",
            "hits": [
                {
                    "address": _address(_field(hit, "address") or hit),
                    "message_id": str(_field(hit, "message_id", "")),
                    "role": str(_field(hit, "role", "")),
                    "segments": snippet_segments(str(_field(hit, "snippet", ""))),
                    "score": _score(_field(hit, "score")),
                }
                for hit in hits
            ],
        }


def _score(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None

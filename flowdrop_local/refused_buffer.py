"""The buffer an identity scope hands out when it refuses (MEM-7, MEM-14).

A :class:`RefusedBuffer` is a :class:`Buffer` (so every caller keeps its type) with
no storage behind it: reads are empty, an append validates its messages and then
drops them, reporting ``count=0, appended=0``. None of its methods executes SQL.
Its ``backend`` is a stand-in that raises on any use, so a ``Buffer`` method added
later and not overridden here fails closed instead of writing to a shared bucket.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn, cast

from .access import refused_storage
from .buffer import Buffer, valid_limit, valid_title, validate_batch
from .errors import MessageNotFound
from .model import AppendResult, BufferInfo, Message

if TYPE_CHECKING:
    from .access import ScopeResolution
    from .backends.base import Backend, Tx


class _NoStorage:
    """Stands in for the backend of a refused buffer: every attribute access raises."""

    def __init__(self, scope: str) -> None:
        self._scope = scope

    def __getattr__(self, name: str) -> NoReturn:
        refused_storage(self._scope)


class RefusedBuffer(Buffer):
    """An identity-scope buffer whose scope refused: empty, and drops every turn.

    ``scope_id`` is ``""``, the resolved scope id a refusal reports (MEM-7).
    """

    refused = True

    def __init__(self, scope: str, key: str, *, window: int | None = None) -> None:
        super().__init__(cast("Backend", _NoStorage(scope)), scope, "", key, window=window)

    def __repr__(self) -> str:
        return f"<RefusedBuffer {self.scope!r} {self.key!r}>"

    def read(self, limit: int | None = None, *, before: str | None = None) -> list[dict[str, Any]]:
        """Nothing: a refused scope selects no bucket."""
        if limit is not None:
            valid_limit(limit)
        return []

    def messages(self, limit: int | None = None, *, before: str | None = None) -> list[Message]:
        """Nothing: a refused scope selects no bucket."""
        if limit is not None:
            valid_limit(limit)
        return []

    def __len__(self) -> int:
        return 0

    def _last_turns(self, limit: int | None) -> list[dict[str, Any]]:
        """An empty window, after the same check of ``limit`` (no storage is read)."""
        from .providers import read_last_turns

        return read_last_turns(lambda n: [], limit, lambda n: [])

    def clear(self) -> int:
        """Nothing to clear; returns 0."""
        return 0

    def pop(self) -> None:
        """Nothing to pop; returns ``None``."""
        return None

    def append(
        self, messages: Mapping[str, Any] | Message | Iterable[Mapping[str, Any] | Message]
    ) -> AppendResult:
        """Validate the messages like any append, then drop them: ``count=0, appended=0``.

        Raises:
            InvalidMessage: a message is malformed (bad input is an error, refused or not).
        """
        validate_batch(messages)
        return AppendResult(count=0, appended=0)

    def info(self) -> BufferInfo:
        """An empty conversation: a refused scope selects no bucket."""
        return BufferInfo(*self.address)

    def delete(self) -> int:
        """Nothing to delete; returns 0."""
        return 0

    def set_title(self, title: str) -> BufferInfo:
        """Validate the title, then drop it, as an append drops its turn (MEM-7)."""
        valid_title(title)
        return self.info()

    def update_metadata(self, changes: Mapping[str, Any]) -> BufferInfo:
        """Nothing to change: a refused scope selects no bucket (MEM-7)."""
        return self.info()

    def fork(self, *, at: str, **_: Any) -> Buffer:
        """A refused buffer holds no message to fork at."""
        raise MessageNotFound(f"no message {at!r} in {self!r}: its scope refused")

    def existing_id(self, tx: Tx) -> int | None:
        return None  # no bucket is selected, so none exists

    def delete_in(self, tx: Tx) -> int:
        return 0  # nothing to delete, as delete()

    def read_in(self, *args: Any, **kwargs: Any) -> NoReturn:
        refused_storage(self.scope)

    def messages_in(self, *args: Any, **kwargs: Any) -> NoReturn:
        refused_storage(self.scope)

    def append_in(self, *args: Any, **kwargs: Any) -> NoReturn:
        # Whatever the append path's inner signature becomes: only append() may drop
        # a turn, and nothing reaches storage through a refused buffer.
        refused_storage(self.scope)

    # A plan reaches storage (AsyncBuffer calls the methods above instead).
    read_plan = messages_plan = count_plan = head_plan = append_in
    pop_plan = clear_plan = append_plan = existing_id_plan = append_in
    info_plan = set_title_plan = update_metadata_plan = delete_plan = fork_plan = append_in


def buffer_of(
    backend: Backend, resolution: ScopeResolution, scope: str, key: str, window: int | None
) -> Buffer:
    """The buffer a resolved address selects: a :class:`RefusedBuffer` when it refused."""
    if resolution.refused:
        return RefusedBuffer(scope, key, window=window)
    return Buffer(backend, scope, resolution.scope_id, key, window=window)

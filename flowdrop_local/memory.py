"""Key-value memory in the same (scope, scope_id) slots as the buffers (MEM-7).

Every operation resolves its scope with :func:`access.resolve_scope` first and, if
the scope refused, returns the neutral result without touching the connection: a
read gives the caller's default with ``found=False``, a write or delete reports
``ok=False``, and ``resolved_scope_id`` is ``""``. Inputs are validated before
that, so bad input is an error whether or not the scope would refuse.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import attrs

from .access import ExecutionContext, ScopeResolution, resolve_scope
from .errors import InvalidAddress, InvalidValue, shown, stored_json
from .plans import One, Run, Step, Write, run_plan
from .rules.incoming import MAX_STORED_BYTES, too_big

if TYPE_CHECKING:
    from .backends.base import Backend


@attrs.frozen
class MemoryRead:
    """The result of a memory read, in the shape the MEM-7 examples show.

    A refusal and the shared bucket both report ``resolved_scope_id=""``; only
    ``found`` and ``value`` tell them apart.
    """

    value: Any
    found: bool
    scope: str
    resolved_scope_id: str

    def to_dict(self) -> dict[str, Any]:
        """``{"value", "found", "scope", "resolved_scope_id"}``."""
        return attrs.asdict(self, recurse=False)


@attrs.frozen
class MemoryWrite:
    """The result of a memory write or delete.

    ``ok`` is False only when the scope refused, and then nothing was written.
    ``existed`` says whether the key held a value before the call (for a delete:
    whether anything was removed).
    """

    ok: bool
    scope: str
    resolved_scope_id: str
    existed: bool = False


def _key(key: object) -> str:
    if not isinstance(key, str) or not key.strip():
        raise InvalidAddress(f"a memory key must be a non-blank string, got {shown(key)}")
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidAddress(f"memory key {shown(key)} contains a lone surrogate") from None
    return key


def _encode(value: object) -> str:
    """The value as JSON text SQLite can store, or InvalidValue before anything is written."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # a lone surrogate would fail inside the transaction
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidValue(f"a memory value must be JSON: {error}") from None
    if too_big(text):
        raise InvalidValue(f"a memory value takes more than {MAX_STORED_BYTES:,} bytes as JSON")
    return text


def _resolve(
    context: ExecutionContext | None, scope: str, key: object
) -> tuple[ScopeResolution, str]:
    """Check the key, then resolve the scope: bad input is an error even when it would refuse."""
    checked = _key(key)
    return resolve_scope(context, scope), checked


# Each operation checks its input and resolves its scope first, then returns either
# its result (a refused scope: no storage is touched) or the plan that reads or
# writes (engine steps, driven on a sync or an async transaction).


def get(
    backend: Backend, context: ExecutionContext | None, scope: str, key: str, default: Any = None
) -> MemoryRead:
    """Read ``key`` in ``scope``; see :meth:`Store.memory_get`."""
    op = get_op(context, scope, key, default)
    if isinstance(op, MemoryRead):
        return op
    with backend.read() as tx:
        read: MemoryRead = run_plan(op, tx)
    return read


def get_op(
    context: ExecutionContext | None, scope: str, key: str, default: Any = None
) -> MemoryRead | Generator[Step, Any, MemoryRead]:
    """:func:`get`: its result when the scope refused, else the plan of a read transaction."""
    resolution, key = _resolve(context, scope, key)
    if resolution.refused:
        return MemoryRead(default, False, scope, "")

    def plan() -> Generator[Step, Any, MemoryRead]:
        row = yield One("memory_get", (scope, resolution.scope_id, key))
        if row is None:
            return MemoryRead(default, False, scope, resolution.scope_id)
        value = stored_json(row[0], "memory key {!r} of scope {}", key, scope)
        return MemoryRead(value, True, scope, resolution.scope_id)

    return plan()


def set_(
    backend: Backend, context: ExecutionContext | None, scope: str, key: str, value: Any
) -> MemoryWrite:
    """Store ``value`` under ``key`` in ``scope``; see :meth:`Store.memory_set`."""
    op = set_op(context, scope, key, value)
    if isinstance(op, MemoryWrite):
        return op
    with backend.write() as tx:
        written: MemoryWrite = run_plan(op, tx)
    return written


def set_op(
    context: ExecutionContext | None, scope: str, key: str, value: Any
) -> MemoryWrite | Generator[Step, Any, MemoryWrite]:
    """:func:`set_`: its result when the scope refused, else the plan of a write transaction."""
    text = _encode(value)
    resolution, key = _resolve(context, scope, key)
    if resolution.refused:
        return MemoryWrite(False, scope, "")
    address = (scope, resolution.scope_id, key)

    def plan() -> Generator[Step, Any, MemoryWrite]:
        existed = (yield One("memory_get", address)) is not None
        yield Write("memory_set", (*address, text))
        return MemoryWrite(True, scope, resolution.scope_id, existed)

    return plan()


def delete(backend: Backend, context: ExecutionContext | None, scope: str, key: str) -> MemoryWrite:
    """Delete ``key`` in ``scope``; see :meth:`Store.memory_delete`."""
    op = delete_op(context, scope, key)
    if isinstance(op, MemoryWrite):
        return op
    with backend.write() as tx:
        written: MemoryWrite = run_plan(op, tx)
    return written


def delete_op(
    context: ExecutionContext | None, scope: str, key: str
) -> MemoryWrite | Generator[Step, Any, MemoryWrite]:
    """:func:`delete`: its result when the scope refused, else the plan of a write transaction."""
    resolution, key = _resolve(context, scope, key)
    if resolution.refused:
        return MemoryWrite(False, scope, "")

    def plan() -> Generator[Step, Any, MemoryWrite]:
        removed = yield Run("memory_delete", (scope, resolution.scope_id, key))
        return MemoryWrite(True, scope, resolution.scope_id, removed > 0)

    return plan()

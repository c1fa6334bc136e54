"""The two backends speak the same statements and keep the same schema.

The rules run once (``engine.py``) against named statements each backend defines
in its own dialect; these tests hold the two definitions together, and check the
PostgreSQL specifics the rules rely on: key order under ``COLLATE "C"`` and the
MEM-3 backstop trigger.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowdrop_local import Store
from flowdrop_local._schema import schema_sql, statements
from flowdrop_local.backends import is_postgresql_target
from flowdrop_local.backends import postgresql_dialect as pg_dialect
from flowdrop_local.backends import sqlite as sqlite_backend
from flowdrop_local.positions import key_between

# Differences the PostgreSQL schema declares on purpose (its header says why).
ONLY_IN_POSTGRESQL = {"flowdrop_meta"}


def test_both_backends_define_the_same_statements() -> None:
    """Every named statement the engine or a handle may ask for exists in both dialects."""
    assert set(sqlite_backend.SQL) == set(pg_dialect.SQL)


_VERBS = {"one", "all", "run", "write", "many"}
_STEPS = {"One", "All", "Run", "Write", "Many"}


def _named_statements() -> dict[str, str]:
    """Every statement name the package asks a transaction for, with where: the
    steps plans yield (``One("tail", ...)``, :mod:`flowdrop_local.plans`) and direct
    calls (``tx.run("delete_buffer", ...)``), read from the source. Names made at
    run time are not seen here; the plan and sync tests run them on both backends."""
    import ast

    root = Path(__file__).resolve().parent.parent / "flowdrop_local"
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                continue
            step = isinstance(node.func, ast.Name) and node.func.id in _STEPS
            direct = (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in _VERBS
                and "tx" in ast.unparse(node.func.value)
            )
            if step or direct:
                where = f"{path.relative_to(root.parent)}:{node.lineno}"
                found.setdefault(node.args[0].value, where)
    return found


def test_every_statement_a_plan_or_handle_names_exists_in_every_backend() -> None:
    """A statement named anywhere in the package is defined by SQLite and PostgreSQL
    alike, so no plan can ask a backend for SQL it lacks."""
    named = _named_statements()
    assert len(named) > 100
    missing = [
        f"{name} ({where}): {backend}"
        for name, where in sorted(named.items())
        for backend, sql in (("sqlite", sqlite_backend.SQL), ("postgresql", pg_dialect.SQL))
        if name not in sql
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("postgresql://u@h/db", True),
        ("postgres://u@h/db", True),
        ("host=h dbname=db", False),  # a libpq key=value string is a valid file name
        ("chat.db", False),
        (":memory:", False),
    ],
)
def test_the_backend_is_picked_from_the_target(target: str, expected: bool) -> None:
    """URLs select PostgreSQL; anything else is a SQLite path."""
    assert is_postgresql_target(target) is expected


def test_a_password_never_appears_in_the_name_of_the_database() -> None:
    """Errors and repr use the URL without its password."""
    assert pg_dialect.redact("postgresql://app:s3cret@db/chat") == "postgresql://app:***@db/chat"


@pytest.fixture
def pg_conn(postgresql_url: str) -> Iterator[object]:
    import psycopg

    Store(postgresql_url).close()  # creates the schema
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        yield conn


def _sqlite_columns() -> dict[str, list[str]]:
    conn = sqlite3.connect(":memory:")
    for statement in statements(schema_sql()):
        conn.execute(statement)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: [r[1] for r in conn.execute(f"PRAGMA table_xinfo({t})")] for t in tables}


def test_both_schemas_declare_the_same_tables_and_columns(pg_conn: object) -> None:
    """Same tables, same columns in the same order, except the listed differences."""
    import psycopg

    assert isinstance(pg_conn, psycopg.Connection)
    rows = pg_conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
    ).fetchall()
    pg_columns: dict[str, list[str]] = {}
    for table, column in rows:
        pg_columns.setdefault(table, []).append(column)
    for table in ONLY_IN_POSTGRESQL:
        pg_columns.pop(table)
    assert pg_columns == _sqlite_columns()


def test_both_schemas_declare_the_same_checks_per_table(pg_conn: object) -> None:
    """Every table carries CHECK constraints on both sides where SQLite has them."""
    import psycopg

    assert isinstance(pg_conn, psycopg.Connection)
    checked = {
        row[0]
        for row in pg_conn.execute(
            "SELECT c.relname FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
            "WHERE k.contype = 'c' AND c.relnamespace = current_schema()::regnamespace"
        )
    }
    sqlite_checked = {
        table
        for statement in statements(schema_sql())
        if statement.upper().startswith("CREATE TABLE") and "CHECK" in statement.upper()
        for table in [statement.split()[2]]
    }
    # buffers: SQLite backs the identity-scope rule with a trigger (the table predates
    # it), PostgreSQL with a CHECK.
    assert checked == sqlite_checked | {"buffers"}


KEYS = ["a0", "a1", "aZ", "az", "b00", "b0A", "b0a", "Zz", "a0V", "a0a", "A", "z"]


def test_positions_order_as_sqlite_binary_does(store: Store) -> None:
    """Keys that differ in case and length come back in byte order on both backends."""
    buffer = store.buffer("s", "", "order")
    keys = sorted((k for k in KEYS if len(k) >= 2), key=lambda k: k.encode())
    records = [
        {"scope": "s", "scope_id": "", "key": "order", "position": k, "role": "user", "content": k}
        for k in keys  # an import takes a buffer's lines in position order
    ]
    store.import_records(records)
    assert [m.position for m in buffer.messages()] == sorted(keys, key=lambda k: k.encode())
    assert [m["content"] for m in buffer.read(limit=3)] == keys[-3:]


def test_generated_keys_keep_their_order_on_both_backends(store: Store) -> None:
    """500 appends and a heal between two rows read back in position order."""
    buffer = store.buffer("s", "", "k")
    for i in range(0, 500, 50):
        buffer.append([{"role": "user", "content": str(j)} for j in range(i, i + 50)])
    positions = [m.position for m in buffer.messages()]
    assert positions == sorted(positions) and len(set(positions)) == 500
    assert key_between(positions[-1], None) > positions[-1]


def test_postgresql_backstop_rejects_a_raw_user_insert_over_an_unanswered_call(
    postgresql_url: str,
) -> None:
    """MEM-3's trigger exists on PostgreSQL too: a writer bypassing the library is stopped."""
    import psycopg

    with Store(postgresql_url) as store:
        store.buffer("s", "", "k").append({"role": "assistant", "tool_calls": [{"id": "c1"}]})
    with psycopg.connect(postgresql_url) as conn:
        buffer_id = conn.execute("SELECT id FROM buffers").fetchone()[0]  # type: ignore[index]
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="MEM-3"):
            conn.execute(
                "INSERT INTO messages (id, buffer_id, position, role, content) "
                "VALUES (%s, %s, 'b0', 'user', 'raw')",
                ("0" * 36, buffer_id),
            )


def test_file_only_operations_say_what_to_use_instead(postgresql_url: str) -> None:
    """backup, vacuum, durability= and read_only= are typed errors on PostgreSQL."""
    from flowdrop_local import UnsupportedOperation

    with Store(postgresql_url) as store:
        with pytest.raises(UnsupportedOperation, match="pg_dump"):
            store.backup("copy.db")
        with pytest.raises(UnsupportedOperation, match="autovacuum"):
            store.vacuum()
        with pytest.raises(UnsupportedOperation, match="SQLite"):
            _ = store.db
    with pytest.raises(UnsupportedOperation, match="synchronous_commit"):
        Store(postgresql_url, durability="full")
    with pytest.raises(UnsupportedOperation, match="SELECT"):
        Store(postgresql_url, read_only=True)


def test_a_foreign_postgresql_database_is_refused(postgresql_url: str) -> None:
    """Tables named like ours without our marker: NotAFlowdropDatabase, nothing written."""
    import psycopg

    from flowdrop_local import NotAFlowdropDatabase, SchemaTooNew

    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE messages (id int)")
    with pytest.raises(NotAFlowdropDatabase, match="messages"):
        Store(postgresql_url)
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute("DROP TABLE messages")
    Store(postgresql_url).close()
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        conn.execute("UPDATE flowdrop_meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(SchemaTooNew):
        Store(postgresql_url)


def test_appends_to_one_postgresql_buffer_from_threads_lose_nothing(postgresql_url: str) -> None:
    """8 threads share one Store (a pool), starting together on a buffer that does not
    exist yet (the creation race), 12 times: no append fails, every turn is there,
    every call is answered once."""
    import threading

    errors: list[BaseException] = []
    with Store(postgresql_url) as store:
        for round_ in range(12):
            key = f"shared-{round_}"

            def work(n: int, key: str = key) -> None:
                try:
                    buffer = store.buffer("s", "", key)
                    for i in range(5):
                        buffer.append({"role": "assistant", "tool_calls": [{"id": f"t{n}-{i}"}]})
                        buffer.append({"role": "user", "content": f"{n}-{i}"})
                except BaseException as error:  # a thread's error would otherwise vanish
                    errors.append(error)

            threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            rows = store.buffer("s", "", key).read()
            assert sum(r["role"] == "user" for r in rows) == 40
            assert sum(r["metadata"].get("healed") is True for r in rows) == 40
        assert store.check() == []


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        (
            "CREATE FUNCTION mallory() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO session_viewers (session_id, user_id) "
            "VALUES (NEW.id, 'mallory'); RETURN NEW; END $$; "
            "CREATE TRIGGER grant_mallory AFTER INSERT ON sessions "
            "FOR EACH ROW EXECUTE FUNCTION mallory()",
            "trigger grant_mallory",
        ),
        ("DROP TRIGGER messages_user_needs_answered_calls ON messages", "is missing"),
        ("CREATE INDEX sneaky ON messages (content)", "index sneaky"),
        ("DROP INDEX tool_calls_unanswered", "is missing"),
    ],
)
def test_a_postgresql_schema_that_is_not_ours_is_refused_and_reported(
    postgresql_url: str, sql: str, named: str
) -> None:
    """A trigger (or index) someone added on our tables, or one of ours dropped, is refused
    on open (NotAFlowdropDatabase naming it) and reported by check() on an open store."""
    import psycopg

    from flowdrop_local import NotAFlowdropDatabase

    with Store(postgresql_url) as store:
        with psycopg.connect(postgresql_url, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]
        assert any(named in v.detail for v in store.check())
    with pytest.raises(NotAFlowdropDatabase, match=named):
        Store(postgresql_url)


def test_an_unreachable_server_is_a_typed_error_without_the_password() -> None:
    """Nothing listens on port 1: ServerUnreachable at once (issue 21 D: not
    NotADatabase), and the password never shows."""
    import time

    from flowdrop_local import ServerUnreachable

    started = time.monotonic()
    with pytest.raises(ServerUnreachable) as failed:
        Store("postgresql://app:hunter2@127.0.0.1:1/chat")
    assert "hunter2" not in str(failed.value) and "app:***@" in str(failed.value)
    assert time.monotonic() - started < 10


def test_a_pool_the_application_has_is_used_and_left_open(postgresql_url: str) -> None:
    """Store(pool) works through the application's pool; closing the store keeps the pool."""
    from psycopg_pool import ConnectionPool

    with ConnectionPool(postgresql_url, min_size=1, max_size=2, open=True) as pool:
        with Store(pool) as store:
            assert store.backend.kind == "postgresql"
            store.buffer("s", "", "k").append({"role": "user", "content": "hi"})
        with pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM messages").fetchone() == (1,)


def test_the_package_works_without_the_postgresql_extra(tmp_path: Path) -> None:
    """psycopg is an optional extra: without it the package imports, a SQLite store
    works (offline sync included) and the CLI runs. (Sync's statements once imported
    the PostgreSQL backend eagerly: `pip install .` then failed at import.)"""
    import subprocess
    import sys

    program = (
        "import sys\n"
        "sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "from flowdrop_local import Store, sync\n"
        "from flowdrop_local.cli import main\n"
        f"a, b = Store({str(tmp_path / 'a.db')!r}), Store({str(tmp_path / 'b.db')!r})\n"
        "a.buffer('global', '', 'k').append({'role': 'user', 'content': 'q'})\n"
        "print(sync(a, b).sent_a_to_b)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"

"""What runs inside the library's statements on PostgreSQL (issue 21 A, CVE-2018-1058's class).

A second role, mallory, has nothing but CREATE on ``public`` (granted to every
role, as PostgreSQL 14 and older do by default). The application's search path is
``<its schema>, public``. Each attack plants a function in ``public`` that a
statement of the library, or a function of its schema, would call instead of the
built-in it means (an overload that matches the arguments better); the payload
copies every message into a table of hers and, for the sessions API, names her a
viewer. Each test fails on a library that trusts its search path.

Then what the open verifies: our objects' owners, and no trigger, rule, row
policy or function on our tables that is not ours (refused, naming it); a store's
schema where other roles can create objects (refused with SharedSchemaRefused: an
operator made there after the open would come before pg_catalog's on our path;
``shared_schema=True`` opens it with a warning, and ``check()`` says so).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

from flowdrop_local import (
    AsyncStore,
    NotAFlowdropDatabase,
    Principal,
    SharedSchemaRefused,
    Store,
    syncing,
)

psycopg = pytest.importorskip("psycopg")

_roles = itertools.count()


class Mallory:
    """The attacker: a login role with CREATE on ``public`` and nothing else of ours."""

    def __init__(self, server: str, name: str) -> None:
        self.server = server
        self.name = name
        self.loot = f"public.{name}_loot"

    def connect(self) -> Any:
        return psycopg.connect(self.server, user=self.name, password="m4llory", autocommit=True)

    def run(self, sql: str) -> None:
        """Run ``sql`` as mallory; ``LOOT`` stands for her table, ``STEAL()`` for her payload."""
        with self.connect() as conn:
            conn.execute(
                sql.replace("LOOT", self.loot).replace("STEAL", f"public.{self.name}_steal")
            )

    def stolen(self) -> list[str]:
        with self.connect() as conn:
            return [row[0] for row in conn.execute(f"SELECT what FROM {self.loot}")]


@pytest.fixture
def mallory(postgresql_server: str) -> Iterator[Mallory]:
    """Mallory, with a table every role may write and a payload that fills it.

    ``STEAL()`` copies every message the caller can read into her table (the caller's
    privileges: a function runs as the role that calls it) and leaves a mark, so an
    attack that ran is seen even on an empty store.
    """
    name = f"mallory_{os.getpid()}_{next(_roles)}"
    with psycopg.connect(postgresql_server, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'm4llory'")
        # PostgreSQL 15+ no longer lets every role create in public: grant it, as 14 did.
        conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    attacker = Mallory(postgresql_server, name)
    attacker.run(
        "CREATE TABLE LOOT (what text); GRANT INSERT, SELECT ON LOOT TO PUBLIC; "
        "CREATE FUNCTION STEAL() RETURNS void LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO LOOT VALUES ('ran as ' || current_user); "
        "BEGIN INSERT INTO LOOT SELECT content FROM messages; "
        "EXCEPTION WHEN undefined_table THEN NULL; END; END $$"
    )
    try:
        yield attacker
    finally:
        with psycopg.connect(postgresql_server, autocommit=True) as conn:
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            conn.execute(f"DROP OWNED BY {name} CASCADE")
            conn.execute(f"DROP ROLE {name}")


@pytest.fixture
def app_url(postgresql_url: str) -> str:
    """The application's URL: its own schema first on the search path, then ``public``."""
    return f"{postgresql_url}%2Cpublic"


def _schema_of(url: str) -> str:
    return url.split("search_path%3D", 1)[1].split("%2C")[0]


def _other_client(url: str) -> Any:
    """Another client of the same database (psql, a migration, a report), on the app's path."""
    return psycopg.connect(url, autocommit=True)


# ---------------------------------------------------------------- the attacks


def test_a_json_agg_overload_in_public_neither_grants_a_session_nor_copies_it(
    mallory: Mallory, app_url: str
) -> None:
    """MEM-15: every session load aggregates the viewers with json_agg(user_id); her
    json_agg(text) matches text better than the built-in's anyelement."""
    mallory.run(
        "CREATE FUNCTION public.json_agg_step(text, text) RETURNS text LANGUAGE sql "
        "AS $$ SELECT $1 $$; "
        "CREATE FUNCTION public.json_agg_final(text) RETURNS json LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM STEAL(); RETURN '[\"mallory\"]'::json; END $$; "
        "CREATE AGGREGATE public.json_agg(text) (sfunc = public.json_agg_step, stype = text, "
        "finalfunc = public.json_agg_final)"
    )
    with Store(app_url) as store:
        owner = store.sessions(Principal("ana"))
        session = owner.create("support")
        owner.drive(session.id, {"role": "user", "content": "my card number is 4111"})
        as_mallory = store.sessions(Principal("mallory"))
        with pytest.raises(PermissionError):
            as_mallory.read(session.id)
        assert owner.get(session.id).id == session.id
    assert mallory.stolen() == []


def test_an_array_agg_overload_in_public_does_not_run_in_the_delete_trigger(
    mallory: Mallory, app_url: str
) -> None:
    """The tally trigger aggregates array_agg(tally): a bigint, which her
    array_agg(bigint) matches better than anynonarray."""
    mallory.run(
        "CREATE FUNCTION public.array_agg_step(bigint[], bigint) RETURNS bigint[] "
        "LANGUAGE sql AS $$ SELECT $1 || $2 $$; "
        "CREATE FUNCTION public.array_agg_final(bigint[]) RETURNS bigint[] LANGUAGE plpgsql "
        "AS $$ BEGIN PERFORM STEAL(); RETURN $1; END $$; "
        "CREATE AGGREGATE public.array_agg(bigint) (sfunc = public.array_agg_step, "
        "stype = bigint[], initcond = '{}', finalfunc = public.array_agg_final)"
    )
    with Store(app_url) as store:
        buffer = store.buffer("user", "ana", "chat")
        buffer.append(
            [{"role": "user", "content": "secret"}, {"role": "assistant", "content": "ok"}]
        )
        buffer.pop()
        assert buffer.count() == 1
    assert mallory.stolen() == []
    # Another client on the same path (a psql session, a cleanup job) fires the trigger too.
    with _other_client(app_url) as conn:
        conn.execute("DELETE FROM messages")
    assert mallory.stolen() == []


def test_a_concatenation_overload_in_public_does_not_run_when_a_buffer_is_cleared(
    mallory: Mallory, app_url: str
) -> None:
    """pop, clear and delete lock the change numbers by hashtext(current_schema() || ...):
    a name and an untyped literal, which her ||(name, text) matches exactly."""
    mallory.run(
        "CREATE FUNCTION public.concat_name(name, text) RETURNS text LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM STEAL(); RETURN $1::text || $2; END $$; "
        "CREATE OPERATOR public.|| (leftarg = name, rightarg = text, "
        "function = public.concat_name)"
    )
    with Store(app_url) as store:
        syncing.enable(store)  # the lock is taken on a store that syncs
        buffer = store.buffer("user", "ana", "chat")
        buffer.append({"role": "user", "content": "secret"})
        buffer.clear()
        assert buffer.count() == 0
    assert mallory.stolen() == []


def test_text_search_overloads_in_public_see_no_message_and_change_no_result(
    mallory: Mallory, app_url: str
) -> None:
    """Search passes 'simple' as an untyped literal: her (text, text) overloads of
    to_tsvector, plainto_tsquery and ts_headline win over the regconfig ones."""
    mallory.run(
        "CREATE FUNCTION public.to_tsvector(text, text) RETURNS tsvector LANGUAGE plpgsql "
        "AS $$ BEGIN PERFORM STEAL(); RETURN pg_catalog.to_tsvector('pg_catalog.simple', "
        "'mallory'); END $$; "
        "CREATE FUNCTION public.plainto_tsquery(text, text) RETURNS tsquery LANGUAGE plpgsql "
        "AS $$ BEGIN PERFORM STEAL(); RETURN pg_catalog.plainto_tsquery('pg_catalog.simple', "
        "$2); END $$; "
        "CREATE FUNCTION public.ts_headline(text, text, tsquery, text) RETURNS text "
        "LANGUAGE plpgsql AS $$ BEGIN PERFORM STEAL(); RETURN 'mallory'; END $$"
    )
    with Store(app_url) as store:
        buffer = store.buffer("user", "ana", "chat")
        buffer.append({"role": "user", "content": "old secret"})
        store.enable_search()
        buffer.append({"role": "user", "content": "new secret"})
        hits = store.search("secret")
        assert sorted(hit.snippet for hit in hits) == ["new [secret]", "old [secret]"]
    assert mallory.stolen() == []
    # Another client writing a message fires the search trigger on its own path.
    with _other_client(app_url) as conn:
        conn.execute(
            "INSERT INTO messages (buffer_id, position, id, role, content) "
            "SELECT id, 'zz', '00000000-0000-7000-8000-000000000001', 'assistant', 'hi' "
            "FROM buffers LIMIT 1"
        )
    assert mallory.stolen() == []


def test_the_async_backend_pins_its_path_too(mallory: Mallory, app_url: str) -> None:
    """The async twin runs the same statements: the delete trigger's array_agg attack."""
    mallory.run(
        "CREATE FUNCTION public.array_agg_step(bigint[], bigint) RETURNS bigint[] "
        "LANGUAGE sql AS $$ SELECT $1 || $2 $$; "
        "CREATE FUNCTION public.array_agg_final(bigint[]) RETURNS bigint[] LANGUAGE plpgsql "
        "AS $$ BEGIN PERFORM STEAL(); RETURN $1; END $$; "
        "CREATE AGGREGATE public.array_agg(bigint) (sfunc = public.array_agg_step, "
        "stype = bigint[], initcond = '{}', finalfunc = public.array_agg_final)"
    )

    async def main() -> int:
        async with AsyncStore(app_url) as store:
            buffer = store.buffer("user", "ana", "chat")
            await buffer.append(
                [{"role": "user", "content": "secret"}, {"role": "assistant", "content": "ok"}]
            )
            await buffer.pop()
            return await buffer.count()

    assert asyncio.run(main()) == 1
    assert mallory.stolen() == []


# ------------------------------------------------------ what the open verifies


def _as_superuser(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def test_a_trigger_on_our_tables_that_runs_a_function_not_ours_is_refused(
    mallory: Mallory, postgresql_url: str
) -> None:
    """A trigger with our trigger's name but someone else's function: the name check
    alone let it through."""
    Store(postgresql_url).close()
    mallory.run(
        "CREATE FUNCTION public.evil() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM STEAL(); RETURN NULL; END $$"
    )
    _as_superuser(
        postgresql_url,
        "DROP TRIGGER messages_tally_delete ON messages; "
        "CREATE TRIGGER messages_tally_delete AFTER DELETE ON messages "
        "FOR EACH STATEMENT EXECUTE FUNCTION public.evil()",
    )
    with pytest.raises(NotAFlowdropDatabase, match=r"messages_tally_delete.*public\.evil"):
        Store(postgresql_url)


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        (
            "CREATE RULE spy AS ON INSERT TO messages DO ALSO SELECT public.{m}_steal()",
            r"rule spy on messages",
        ),
        (
            "CREATE POLICY spy ON sessions USING (public.{m}_peek()); "
            "ALTER TABLE sessions ENABLE ROW LEVEL SECURITY",
            r"policy spy on sessions",
        ),
        (
            "ALTER TABLE memory ADD CONSTRAINT spy CHECK (public.{m}_peek()) NOT VALID",
            r"memory.*public\.mallory_\w+_peek\(\)",
        ),
        (
            "ALTER TABLE buffers ALTER COLUMN title SET DEFAULT public.{m}_name()",
            r"buffers.*public\.mallory_\w+_name\(\)",
        ),
    ],
    ids=["rule", "row-policy", "check", "default"],
)
def test_rules_policies_and_expressions_calling_functions_not_ours_are_refused(
    mallory: Mallory, postgresql_url: str, plant: str, named: str
) -> None:
    """What runs inside a statement on our tables besides triggers: a rule, a row
    policy, a CHECK or a default; each refused by name, and check() reports it."""
    with Store(postgresql_url) as store:
        store.buffer("user", "ana", "chat").append({"role": "user", "content": "hi"})
        mallory.run(
            f"CREATE FUNCTION public.{mallory.name}_peek() RETURNS boolean LANGUAGE plpgsql "
            "AS $$ BEGIN PERFORM STEAL(); RETURN true; END $$; "
            f"CREATE FUNCTION public.{mallory.name}_name() RETURNS text LANGUAGE sql "
            "AS $$ SELECT '' $$"
        )
        _as_superuser(postgresql_url, plant.format(m=mallory.name))
        problems = [str(v) for v in store.check()]
        assert any(re.search(named, p) for p in problems), problems
    with pytest.raises(NotAFlowdropDatabase, match=named):
        Store(postgresql_url)
    assert mallory.stolen() == []


def test_tables_someone_else_made_in_a_shared_schema_are_refused(
    mallory: Mallory, postgresql_server: str
) -> None:
    """A schema both may create in: mallory made flowdrop_local's tables first (with
    the library itself), so they are hers; the application must not write into them."""
    shared = f"shared_{mallory.name}"
    _as_superuser(
        postgresql_server,
        f"CREATE SCHEMA {shared}; GRANT CREATE, USAGE ON SCHEMA {shared} TO PUBLIC",
    )
    try:
        theirs = f"postgresql://{mallory.name}:m4llory@" + postgresql_server.split("@", 1)[1]
        sep = "&" if "?" in theirs else "?"
        Store(f"{theirs}{sep}options=-csearch_path%3D{shared}", shared_schema=True).close()
        sep = "&" if "?" in postgresql_server else "?"
        with pytest.raises(NotAFlowdropDatabase, match=rf"belongs to {mallory.name}"):
            Store(f"{postgresql_server}{sep}options=-csearch_path%3D{shared}")
    finally:
        _as_superuser(postgresql_server, f"DROP SCHEMA {shared} CASCADE")


def test_a_function_someone_else_made_in_our_schema_is_refused(
    mallory: Mallory, postgresql_url: str
) -> None:
    """A role that may create in the store's own schema is out of scope, but what it
    made there is found: her json_agg(text) next to our tables."""
    schema = _schema_of(postgresql_url)
    Store(postgresql_url).close()
    _as_superuser(postgresql_url, f"GRANT CREATE, USAGE ON SCHEMA {schema} TO {mallory.name}")
    mallory.run(
        f"CREATE FUNCTION {schema}.json_agg(text) RETURNS json LANGUAGE sql "
        "AS $$ SELECT '[\"mallory\"]'::json $$"
    )
    with pytest.raises(NotAFlowdropDatabase, match=rf"json_agg\(text\).*{mallory.name}"):
        Store(postgresql_url)


def _tables_in(url: str, schema: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname::text FROM pg_class WHERE relnamespace = %s::regnamespace",
            (schema,),
        ).fetchall()
    return [row[0] for row in rows]


def test_a_schema_others_may_create_in_is_refused_naming_it_and_them(
    mallory: Mallory, postgresql_url: str
) -> None:
    """Our schema letting another role create objects: what she makes there after the
    open (an operator ``=(text, text)``, which comes before pg_catalog's on our path)
    would run inside our statements. The open refuses it, sync and async, before it
    creates anything, naming the schema, the role and the fix."""
    schema = _schema_of(postgresql_url)
    _as_superuser(postgresql_url, f"GRANT CREATE ON SCHEMA {schema} TO {mallory.name}")
    named = rf"schema {schema}\b.*{mallory.name}.*REVOKE CREATE ON SCHEMA \"{schema}\" FROM"
    with pytest.raises(SharedSchemaRefused, match=named) as refused:
        Store(postgresql_url)
    assert isinstance(refused.value, NotAFlowdropDatabase)
    assert "search_path%3D" in str(refused.value) and "shared_schema=True" in str(refused.value)
    assert _tables_in(postgresql_url, schema) == []

    async def main() -> None:
        with pytest.raises(SharedSchemaRefused, match=named):
            await AsyncStore(postgresql_url)

    asyncio.run(main())
    assert _tables_in(postgresql_url, schema) == []

    # A store made while the schema was private, opened after the grant: refused too.
    _as_superuser(postgresql_url, f"REVOKE CREATE ON SCHEMA {schema} FROM {mallory.name}")
    Store(postgresql_url).close()
    _as_superuser(postgresql_url, f"GRANT CREATE ON SCHEMA {schema} TO PUBLIC")
    with pytest.raises(SharedSchemaRefused, match=r"PUBLIC.*FROM PUBLIC"):
        Store(postgresql_url)


def test_the_attack_of_a_shared_schema_after_the_open_cannot_start(
    mallory: Mallory, postgresql_server: str
) -> None:
    """The review's case (F1): the store in a schema every role may create in, as
    ``public`` is on PostgreSQL 14 and older, with nothing of mallory's in it yet. Opened,
    her ``=(text, text)`` made there afterwards ran as the victim and copied every
    message. The open is refused, so nothing is written; once the schema is private
    again, her operator cannot be made."""
    shared = f"shared_{mallory.name}"
    _as_superuser(
        postgresql_server,
        f"CREATE SCHEMA {shared}; GRANT CREATE, USAGE ON SCHEMA {shared} TO PUBLIC",
    )
    try:
        sep = "&" if "?" in postgresql_server else "?"
        url = f"{postgresql_server}{sep}options=-csearch_path%3D{shared}"
        with pytest.raises(SharedSchemaRefused, match=rf"schema {shared}\b.*PUBLIC"):
            Store(url)
        assert _tables_in(postgresql_server, shared) == []
        _as_superuser(postgresql_server, f"REVOKE CREATE ON SCHEMA {shared} FROM PUBLIC")
        with Store(url) as store:
            store.buffer("user", "ana", "chat").append({"role": "user", "content": "4111"})
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                mallory.run(
                    f"CREATE FUNCTION {shared}.eq(a text, b text) RETURNS boolean "
                    "LANGUAGE sql AS $$ SELECT pg_catalog.texteq(a, b) $$"
                )
            assert store.buffer("user", "ana", "notes").read() == []
        assert mallory.stolen() == []
    finally:
        _as_superuser(postgresql_server, f"DROP SCHEMA {shared} CASCADE")


def test_a_shared_schema_accepted_explicitly_is_warned_about_and_reported(
    mallory: Mallory, postgresql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``shared_schema=True`` (and ``FLOWDROP_PG_SHARED_SCHEMA=1`` for the CLI): the
    open goes on with a warning naming the schema and the role, and check() says so."""
    schema = _schema_of(postgresql_url)
    _as_superuser(postgresql_url, f"GRANT CREATE ON SCHEMA {schema} TO {mallory.name}")
    with caplog.at_level(logging.WARNING, logger="flowdrop_local"):
        store = Store(postgresql_url, shared_schema=True)
    try:
        assert any(
            schema in r.getMessage() and mallory.name in r.getMessage() for r in caplog.records
        ), caplog.text
        found = [str(v) for v in store.check()]
        assert any(schema in f and mallory.name in f for f in found), found
    finally:
        store.close()

    async def main() -> list[str]:
        async with AsyncStore(postgresql_url, shared_schema=True) as store:
            return [str(v) for v in await store.check()]

    assert any(mallory.name in f for f in asyncio.run(main()))
    _as_superuser(postgresql_url, f"GRANT CREATE ON SCHEMA {schema} TO PUBLIC")
    with Store(postgresql_url, shared_schema=True) as store:
        assert any("PUBLIC" in str(v) for v in store.check())
    # The grant made after the open: check() of a store opened without it reports it.
    _as_superuser(postgresql_url, f"REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC, {mallory.name}")
    with Store(postgresql_url) as store:
        assert store.check() == []
        _as_superuser(postgresql_url, f"GRANT CREATE ON SCHEMA {schema} TO {mallory.name}")
        assert any(mallory.name in str(v) for v in store.check())

    from click.testing import CliRunner

    from flowdrop_local.cli import cli

    refused = CliRunner().invoke(cli, ["--db", postgresql_url, "buffers"], env={})
    assert refused.exit_code == 2 and "REVOKE CREATE" in refused.output, refused.output
    accepted = CliRunner().invoke(
        cli, ["--db", postgresql_url, "buffers"], env={"FLOWDROP_PG_SHARED_SCHEMA": "1"}
    )
    assert accepted.exit_code == 0, accepted.output


def test_our_functions_pin_their_search_path(postgresql_url: str) -> None:
    """Every function of the schema (and of the search index) sets its own path."""
    with Store(postgresql_url) as store:
        store.enable_search()
    schema = _schema_of(postgresql_url)
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT proname, proconfig FROM pg_proc WHERE pronamespace = %s::regnamespace "
            "AND proname NOT LIKE 'flowdrop_sync%%' ORDER BY proname",
            (schema,),
        ).fetchall()
    assert len(rows) == 7
    for name, config in rows:
        assert config == [f"search_path=pg_catalog, {schema}, pg_temp"], name


def test_an_older_schema_gets_its_functions_pinned_on_open(postgresql_url: str) -> None:
    """A store made before the functions pinned their path is brought up to date on open
    (by a role that owns them), in place: same version, same data."""
    with Store(postgresql_url) as store:
        store.buffer("user", "ana", "chat").append({"role": "user", "content": "hi"})
        store.enable_search()
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        for name in ("flowdrop_now()", "flowdrop_tally_deleted()", "flowdrop_search_added()"):
            conn.execute(f"ALTER FUNCTION {name} RESET search_path")
    with Store(postgresql_url) as store:
        assert store.check() == []
        assert store.buffer("user", "ana", "chat").count() == 1
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        unpinned = conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace "
            "AND proconfig IS NULL AND proname NOT LIKE 'flowdrop_sync%'"
        ).fetchall()
    assert unpinned == []


def test_a_pool_handed_in_keeps_its_connections_search_path(app_url: str) -> None:
    """The pin is transaction-local: the application's own statements on the same
    pooled connections still see the path it configured."""
    psycopg_pool = pytest.importorskip("psycopg_pool")
    with (
        psycopg_pool.ConnectionPool(app_url, min_size=1, max_size=1, open=True) as pool,
        Store(pool) as store,
    ):
        store.buffer("user", "ana", "chat").append({"role": "user", "content": "hi"})
        with pool.connection() as conn:
            (path,) = conn.execute("SHOW search_path").fetchone()
    assert path.replace(" ", "").endswith(",public")

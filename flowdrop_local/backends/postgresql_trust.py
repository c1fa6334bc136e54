"""What may run inside flowdrop_local's statements on PostgreSQL (issue 21 A).

PostgreSQL resolves a function, operator, type or table name through the
session's ``search_path``, and an overload that matches the arguments better
wins over the built-in: a role with CREATE on any schema of the application's
path (``public`` on PostgreSQL 14 and older) could have its ``json_agg(text)``
run inside the library's statements, with the library's privileges (the
CVE-2018-1058 class). So:

* Every transaction pins its path first (:data:`PIN_SQL`, transaction-local, in
  the pipeline of its first statement: no round trip, and nothing left on a
  connection of an application's pool): the store's schema, then ``pg_catalog``,
  then ``pg_temp``. The schema comes first because ``current_schema()`` (which
  names where our tables live, for sync's statements too) is the first entry.
* Every function of the schema sets ``search_path = pg_catalog, <schema>,
  pg_temp`` itself, so its body resolves the same for any client (psql, a job)
  that writes our tables; the built-ins an overload could take over are
  schema-qualified in statements and bodies.
* The open verifies, under ``pg_catalog`` alone, what could run inside our
  statements (:func:`verdict`): who owns our objects, and that no trigger, rule,
  row policy, default, constraint or index on our tables calls a function that
  is not ours. It refuses (:class:`~flowdrop_local.errors.SharedSchemaRefused`) a
  schema where roles other than ours may create objects: the schema comes before
  pg_catalog on the path, so an operator ``=(text, text)`` made there after the
  open would run inside our statements. ``shared_schema=True`` accepts that risk
  (a warning on open, a finding of ``check()``).
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import attrs

from ..check import Violation
from ..errors import NotADatabase
from ..sync.schema import SCHEMA_TABLE, SYNC_TABLES, pg_delete_triggers

# Transaction-local: a pooled connection goes back with its own path.
PIN_SQL = "SELECT pg_catalog.set_config('search_path', %s, true)"
# What the verification itself runs under: nothing a user made can resolve.
CATALOG_PATH = "pg_catalog, pg_temp"
CURRENT_SCHEMA_SQL = "SELECT pg_catalog.current_schema()"


def quoted(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def pinned_path(schema: str) -> str:
    """The search path the library's statements run under."""
    return f"{quoted(schema)}, pg_catalog, pg_temp"


def schema_of(current: str | None, where: str) -> str:
    """The store's schema (``current_schema()`` of a new connection), or the error for none."""
    if current is None:
        raise NotADatabase(
            f"cannot open {where}: no schema of its search_path exists "
            "(create one, or name one with options=-csearch_path=...)"
        )
    return current


@functools.cache
def _sql(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


_FUNCTION = re.compile(r"CREATE FUNCTION (\w+)\(([^)]*)\).*?AS\s*\$\$(.*?)\$\$;", re.S)


@attrs.frozen
class Function:
    """One function the schema files declare: its CREATE statement, text and all."""

    name: str
    arguments: str
    body: str
    statement: str


@functools.cache
def functions() -> dict[str, Function]:
    """The functions postgresql.sql and postgresql_search.sql declare, by name."""
    found = {}
    for file in ("postgresql.sql", "postgresql_search.sql"):
        for match in _FUNCTION.finditer(_sql(file)):
            name, arguments, body = match.groups()
            found[name] = Function(name, arguments, body, match[0])
    return found


def refresh_statements(schema: str, names: list[str]) -> list[str]:
    """What brings the named functions to their current definition and pins their path
    (a store made before they did: same schema version, nothing else changes)."""
    statements = []
    for name in names:
        function = functions()[name]
        statements.append(
            function.statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
        )
        statements.append(
            f"ALTER FUNCTION {name}({function.arguments}) "
            f"SET search_path = pg_catalog, {quoted(schema)}, pg_temp"
        )
    return statements


_TRIGGER = re.compile(
    r"CREATE (?:OR REPLACE )?TRIGGER (\w+)\s.*?\bON (\w+)\b.*?EXECUTE FUNCTION (\w+)", re.S
)
_TABLE = re.compile(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", re.I)


@functools.cache
def triggers() -> dict[tuple[str, str], str]:
    """(table, trigger) -> the function it runs, for every trigger of ours (sync's too)."""
    texts = (_sql("postgresql.sql"), _sql("postgresql_search.sql"), *pg_delete_triggers(kinds=True))
    return {
        (table, trigger): function
        for text in texts
        for trigger, table, function in _TRIGGER.findall(text)
    }


@functools.cache
def tables() -> list[str]:
    """Every table of ours: the schema's, the search index's and offline sync's."""
    texts = (_sql("postgresql.sql"), _sql("postgresql_search.sql"), *SYNC_TABLES, SCHEMA_TABLE)
    return sorted({name for text in texts for name in _TABLE.findall(text)})


def our_functions() -> list[str]:
    """The names of our functions: the schema files' and sync's trigger functions."""
    return sorted({*functions(), *triggers().values()})


# The roles whose objects the library trusts: the role it connects as and the roles
# it is a member of (pg_has_role would say "every role" for a superuser), any
# superuser, and the schema's owner and its members (who could replace any object
# there anyway).
_TRUSTED = """WITH RECURSIVE mine(oid) AS (
    SELECT oid FROM pg_roles WHERE rolname = current_user
    UNION SELECT m.roleid FROM pg_auth_members AS m JOIN mine ON m.member = mine.oid),
ns AS (SELECT oid, nspowner FROM pg_namespace WHERE nspname = %(s)s),
trusted(oid) AS (
    SELECT r.oid FROM pg_roles AS r, ns WHERE r.rolsuper OR r.oid IN (SELECT oid FROM mine)
    OR r.oid = ns.nspowner OR pg_has_role(r.oid, ns.nspowner, 'MEMBER'))"""

# Objects in our schema that an untrusted role owns: a function, operator, type,
# collation, text search configuration or conversion there resolves before
# pg_catalog's in our statements; a table there that takes one of our names, or
# a catalog's, is read by them.
OWNERS_SQL = f"""{_TRUSTED},
objects(kind, name, owner) AS (
    SELECT CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
        WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' ELSE 'table' END,
        c.relname::text, c.relowner
    FROM pg_class AS c, ns WHERE c.relnamespace = ns.oid AND c.relkind <> 'i'
    AND (c.relname = ANY(%(t)s) OR EXISTS (SELECT 1 FROM pg_class AS k
        WHERE k.relnamespace = 'pg_catalog'::regnamespace AND k.relname = c.relname))
    UNION ALL SELECT CASE p.prokind WHEN 'a' THEN 'aggregate' WHEN 'p' THEN 'procedure'
        ELSE 'function' END, p.oid::regprocedure::text, p.proowner
    FROM pg_proc AS p, ns WHERE p.pronamespace = ns.oid
    UNION ALL SELECT 'operator', o.oid::regoperator::text, o.oprowner
    FROM pg_operator AS o, ns WHERE o.oprnamespace = ns.oid
    UNION ALL SELECT 'type', t.oid::regtype::text, t.typowner
    FROM pg_type AS t LEFT JOIN pg_class AS c ON c.oid = t.typrelid, ns
    WHERE t.typnamespace = ns.oid AND (t.typrelid = 0 OR c.relkind = 'c')
    AND NOT EXISTS (SELECT 1 FROM pg_type AS e WHERE e.typarray = t.oid)
    UNION ALL SELECT 'collation', k.collname::text, k.collowner
    FROM pg_collation AS k, ns WHERE k.collnamespace = ns.oid
    UNION ALL SELECT 'text search configuration', g.cfgname::text, g.cfgowner
    FROM pg_ts_config AS g, ns WHERE g.cfgnamespace = ns.oid
    UNION ALL SELECT 'text search dictionary', d.dictname::text, d.dictowner
    FROM pg_ts_dict AS d, ns WHERE d.dictnamespace = ns.oid
    UNION ALL SELECT 'conversion', v.conname::text, v.conowner
    FROM pg_conversion AS v, ns WHERE v.connamespace = ns.oid)
SELECT o.kind, o.name, r.rolname FROM objects AS o JOIN pg_roles AS r ON r.oid = o.owner
WHERE o.owner NOT IN (SELECT oid FROM trusted) ORDER BY 1, 2"""

_OURS = """ours AS (SELECT c.oid, c.relname::text AS relname FROM pg_class AS c, ns
    WHERE c.relnamespace = ns.oid AND c.relname = ANY(%(t)s) AND c.relkind IN ('r', 'p'))"""
_NS = "ns AS (SELECT oid FROM pg_namespace WHERE nspname = %(s)s)"

# Every trigger on our tables and the function it runs.
TRIGGER_FUNCTIONS_SQL = f"""WITH {_NS}, {_OURS}
SELECT o.relname, t.tgname::text, n.nspname::text, p.proname::text, p.oid::regprocedure::text
FROM pg_trigger AS t JOIN ours AS o ON o.oid = t.tgrelid JOIN pg_proc AS p ON p.oid = t.tgfoid
JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE NOT t.tgisinternal ORDER BY 1, 2"""

# Rules and row policies on our tables (we make none), and row-level security.
RULES_SQL = f"""WITH {_NS}, {_OURS}
SELECT 'rule', r.rulename::text, o.relname FROM pg_rewrite AS r JOIN ours AS o ON o.oid = r.ev_class
UNION ALL SELECT 'policy', p.polname::text, o.relname
FROM pg_policy AS p JOIN ours AS o ON o.oid = p.polrelid
UNION ALL SELECT 'row-level security', '', o.relname FROM ours AS o JOIN pg_class AS c
ON c.oid = o.oid WHERE c.relrowsecurity OR c.relforcerowsecurity ORDER BY 1, 2, 3"""

# The functions, operators and types that anything on our tables refers to (a
# default or generated column, a constraint, an index, a trigger's WHEN, a
# policy, a rule, a column's type), outside pg_catalog; a trigger's own function
# is TRIGGER_FUNCTIONS_SQL's.
REFERENCES_SQL = f"""WITH {_NS}, {_OURS},
parts(classid, objid, relname, own) AS (
    SELECT 'pg_attrdef'::regclass, a.oid, o.relname, 0::oid
    FROM pg_attrdef AS a JOIN ours AS o ON o.oid = a.adrelid
    UNION ALL SELECT 'pg_constraint'::regclass, k.oid, o.relname, 0::oid
    FROM pg_constraint AS k JOIN ours AS o ON o.oid = k.conrelid
    UNION ALL SELECT 'pg_class'::regclass, x.indexrelid, o.relname, 0::oid
    FROM pg_index AS x JOIN ours AS o ON o.oid = x.indrelid
    UNION ALL SELECT 'pg_trigger'::regclass, t.oid, o.relname, t.tgfoid
    FROM pg_trigger AS t JOIN ours AS o ON o.oid = t.tgrelid
    UNION ALL SELECT 'pg_policy'::regclass, p.oid, o.relname, 0::oid
    FROM pg_policy AS p JOIN ours AS o ON o.oid = p.polrelid
    UNION ALL SELECT 'pg_rewrite'::regclass, r.oid, o.relname, 0::oid
    FROM pg_rewrite AS r JOIN ours AS o ON o.oid = r.ev_class
    UNION ALL SELECT 'pg_class'::regclass, o.oid, o.relname, 0::oid FROM ours AS o)
SELECT DISTINCT p.relname, pg_describe_object(d.classid, d.objid, d.objsubid),
    coalesce(f.oid::regprocedure::text, op.oid::regoperator::text, ty.oid::regtype::text),
    n.nspname::text, coalesce(f.proname::text, ''), ty.oid IS NOT NULL
FROM parts AS p JOIN pg_depend AS d ON d.classid = p.classid AND d.objid = p.objid
LEFT JOIN pg_proc AS f ON d.refclassid = 'pg_proc'::regclass AND f.oid = d.refobjid
LEFT JOIN pg_operator AS op ON d.refclassid = 'pg_operator'::regclass AND op.oid = d.refobjid
LEFT JOIN pg_type AS ty ON d.refclassid = 'pg_type'::regclass AND ty.oid = d.refobjid
JOIN pg_namespace AS n ON n.oid = coalesce(f.pronamespace, op.oprnamespace, ty.typnamespace)
WHERE d.refobjid <> p.own AND n.nspname <> 'pg_catalog' ORDER BY 1, 2, 3"""

# Roles other than ours that may create objects in the schema (PUBLIC: every role).
CREATORS_SQL = f"""{_TRUSTED}
SELECT EXISTS (SELECT 1 FROM pg_namespace AS n,
        aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) AS a
        WHERE n.oid = (SELECT oid FROM ns) AND a.grantee = 0 AND a.privilege_type = 'CREATE'),
    ARRAY(SELECT r.rolname::text FROM pg_roles AS r
        WHERE r.oid NOT IN (SELECT oid FROM trusted)
        AND has_schema_privilege(r.oid, (SELECT oid FROM ns), 'CREATE') ORDER BY 1)"""

# Our functions' bodies and settings, against what the schema files declare now.
PINS_SQL = f"""WITH {_NS}
SELECT p.proname::text, p.prosrc, p.proconfig,
    ARRAY['search_path=pg_catalog, ' || quote_ident(%(s)s) || ', pg_temp'],
    pg_has_role(current_user, p.proowner, 'USAGE'), pg_get_userbyid(p.proowner)::text
FROM pg_proc AS p, ns WHERE p.pronamespace = ns.oid AND p.proname = ANY(%(f)s) ORDER BY 1"""

# The names the schema check compares (backends/postgresql.py, schema_violations_of).
_BASE = (
    "c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(s)s) "
    "AND c.relname = ANY(%(b)s)"
)
TRIGGER_NAMES_SQL = (
    "SELECT t.tgname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
    f"WHERE NOT t.tgisinternal AND {_BASE}"
)
INDEX_NAMES_SQL = (
    "SELECT i.relname::text FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
    f"JOIN pg_class c ON c.oid = x.indrelid WHERE {_BASE} "
    "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid "
    # a foreign key names the index it references (the search table's does)
    "AND k.conrelid = x.indrelid AND k.contype IN ('p', 'u', 'x'))"
)
BASE_TABLES = ("buffers", "messages", "tool_calls", "memory", "sessions", "session_viewers")

_QUERIES = (
    OWNERS_SQL,
    TRIGGER_FUNCTIONS_SQL,
    RULES_SQL,
    REFERENCES_SQL,
    CREATORS_SQL,
    PINS_SQL,
    TRIGGER_NAMES_SQL,
    INDEX_NAMES_SQL,
)


def verification_reads(schema: str) -> list[tuple[str, Any]]:
    """The verification's statements in order: under ``pg_catalog`` alone, then back on
    the store's own path (their rows go to :func:`verdict`)."""
    params = {"s": schema, "t": tables(), "f": sorted(functions()), "b": list(BASE_TABLES)}
    return [
        (PIN_SQL, (CATALOG_PATH,)),
        *((sql, params) for sql in _QUERIES),
        (PIN_SQL, (pinned_path(schema),)),
    ]


@attrs.frozen
class Verdict:
    """What the verification found.

    ``refused``: what could run inside our statements (the open refuses it);
    ``shared``: the roles other than ours that may create objects in the schema (the
    open refuses it unless ``shared_schema=True``, then warns; ``check()`` reports it);
    ``warned``: what the open warns about and ``check()`` reports; ``stale``: our
    functions that need :func:`refresh_statements` (and may get it); ``trigger_names``
    and ``index_names``: for the schema check by name.
    """

    refused: list[Violation]
    shared: list[Violation]
    warned: list[Violation]
    stale: list[str]
    trigger_names: set[str]
    index_names: set[str]


def verdict(schema: str, rows: list[list[Any]]) -> Verdict:
    """Judge the rows of :func:`verification_reads` (the two path statements' rows included)."""
    owners, trigger_rows, rules, references, creators, pins, names, indexes = rows[1:-1]
    refused: list[Violation] = []
    warned: list[Violation] = []

    def refuse(detail: str) -> None:
        refused.append(Violation("schema", detail))

    for kind, name, owner in owners:
        refuse(
            f"{kind} {name} in schema {schema} belongs to {owner}, a role flowdrop_local "
            "does not trust (not this role or one it is a member of, a superuser or the "
            "schema's owner): it could run inside flowdrop_local's statements"
        )
    declared = triggers()
    for table, trigger, namespace, function, signature in trigger_rows:
        expected = declared.get((table, trigger))
        if expected is None:
            if table not in BASE_TABLES:  # schema_violations_of names those
                refuse(f"trigger {trigger} on {table} is not flowdrop_local's")
        elif namespace != schema or function != expected:
            refuse(
                f"trigger {trigger} on {table} runs {signature}, which is not "
                f"flowdrop_local's ({expected})"
            )
    for kind, name, table in rules:
        if kind == "row-level security":
            refuse(f"row-level security is enabled on {table}; flowdrop_local sets none")
        else:
            refuse(f"{kind} {name} on {table} is not flowdrop_local's")
    ours = set(our_functions())
    for table, what, signature, namespace, function, is_type in references:
        if not is_type and namespace == schema and function in ours:
            continue
        refuse(
            f"{what} (on {table}) uses {signature}, which is not flowdrop_local's nor PostgreSQL's"
        )
    shared: list[Violation] = []
    for public, roles in creators:
        if public or roles:
            who = "every role (PUBLIC)" if public else ", ".join(roles[:5])
            more = f" and {len(roles) - 5} more" if not public and len(roles) > 5 else ""
            grantees = "PUBLIC" if public else ", ".join(quoted(role) for role in roles)
            shared.append(
                Violation(
                    "schema",
                    f"schema {schema} lets roles other than this one's create objects in "
                    f"it: {who}{more}; an operator or function they create there, even "
                    "after the open, comes before pg_catalog's on flowdrop_local's path "
                    "and would run inside its statements as this role (fix: REVOKE "
                    f"CREATE ON SCHEMA {quoted(schema)} FROM {grantees}; or give the "
                    "store a schema of its own, with ?options=-csearch_path%3D<schema>)",
                )
            )
    stale: list[str] = []
    for name, body, config, expected, may_alter, owner in pins:
        if body == functions()[name].body and config == expected:
            continue
        if may_alter:
            stale.append(name)
        else:
            warned.append(
                Violation(
                    "schema",
                    f"function {name} does not pin its search_path (a store made by an "
                    f"older flowdrop_local): open the store once as {owner}, its owner, "
                    "to update it",
                )
            )
    return Verdict(
        refused, shared, warned, stale, {row[0] for row in names}, {row[0] for row in indexes}
    )

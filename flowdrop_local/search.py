"""Full-text search over message text: opt-in per store, kept in the append's transaction.

The index is built by :func:`enable` (``Store.enable_search``, ``flowdrop-local
search --enable``) over the messages already stored, and from then on kept by
triggers on ``messages``, in the same transaction as each write: a committed
message is always findable and a rolled-back one never is. Whether a store has
it is whether its objects exist (``search.sql`` on SQLite, FTS5;
``backends/postgresql_search.sql`` on PostgreSQL, a tsvector under GIN); a store
without them has no trigger, so its appends pay nothing.

Only message text is indexed: a string content, or the ``text`` of the content
parts typed ``text``, ``input_text`` or ``output_text``. JSON keys, part types,
metadata and tool arguments are not.

Queries are words, not a query language: each whitespace-separated term that
holds a letter or digit is quoted, and a message matches when it holds every
term (phrase-wise within a term: ``output_text`` is the phrase "output text").
A query without any such term finds nothing. Snippets mark each matched term
between ``[`` and ``]``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources

from ._schema import search_sql as sqlite_search_sql
from ._schema import statements
from .backends.base import Backend, Tx
from .buffer import valid_address_part, valid_limit
from .errors import InvalidArgument, SearchNotEnabled, shown
from .model import SearchHit

__all__ = ["MARK_END", "MARK_START", "enable", "enabled", "fts_query", "search", "search_sql"]

MARK_START = "["
MARK_END = "]"
_RUN = 10_000  # messages indexed per statement by enable() (a progress step)
# Both backends' search objects are created under this lock (PostgreSQL).
_PG_LOCK = "SELECT pg_advisory_xact_lock(4604935513)"


@cache
def search_sql(kind: str) -> str:
    """The search objects' SQL of a backend kind (``"sqlite"`` or ``"postgresql"``)."""
    if kind == "sqlite":
        return sqlite_search_sql()
    folder = resources.files("flowdrop_local").joinpath("backends")
    return folder.joinpath("postgresql_search.sql").read_text("utf-8")


def fts_query(query: object) -> str:
    """The query as quoted terms (FTS5 syntax; PostgreSQL reads it as words); '' for none.

    Raises:
        InvalidArgument: ``query`` is not a string.
    """
    if not isinstance(query, str):
        raise InvalidArgument(f"a search query must be a string, not {shown(query)}")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("a search query must not hold a lone surrogate") from None
    terms = [
        '"' + term.replace('"', '""') + '"'
        for term in query.replace("\x00", " ").split()
        if any(c.isalnum() for c in term)
    ]
    return " ".join(terms)


def enabled_in(tx: Tx) -> bool:
    """Whether the store's search index exists, inside an open transaction."""
    return bool(tx.one("search_enabled")[0])


def enabled(backend: Backend) -> bool:
    """Whether the store's search index exists."""
    with backend.read(snapshot=False) as tx:
        return enabled_in(tx)


def enable(backend: Backend, progress: Callable[[int, int], None] | None = None) -> bool:
    """Create the search index and index every stored message, in one transaction.

    ``progress(done, total)`` is called after each run of messages. Returns False
    when the index existed already (nothing was done).
    """
    with backend.write() as tx:
        if backend.kind == "postgresql":
            tx.script(_PG_LOCK)
        if enabled_in(tx):
            return False
        for statement in (
            statements(search_sql(backend.kind))
            if backend.kind == "sqlite"
            else [search_sql(backend.kind)]
        ):
            tx.script(statement)
        total = tx.one("search_count_messages")[0]
        done, after = 0, (0, "")
        while done < total:
            end = tx.one("search_run_end", (*after, _RUN - 1))
            bound = (None, None) if end is None else (end[0], end[1])
            tx.write("search_index_run", (*after, *bound))
            done = total if end is None else done + _RUN
            if progress is not None:
                progress(done, total)
            if end is None:
                break
            after = (end[0], end[1])
        tx.write("search_finish")
    return True


def search(
    backend: Backend,
    query: str,
    *,
    scope: str | None = None,
    scope_id: str | None = None,
    key: str | None = None,
    limit: int = 20,
) -> list[SearchHit]:
    """The messages matching ``query``, best first (see the module docstring).

    Raises:
        SearchNotEnabled: the store has no search index.
        InvalidArgument: ``query`` is not a string, or ``limit`` is not a
            non-negative integer.
        InvalidAddress: a filter is not a string.
    """
    terms = fts_query(query)
    limit = valid_limit(limit)
    if scope is not None:
        valid_address_part("scope", scope, allow_empty=False)
    if scope_id is not None:
        valid_address_part("scope_id", scope_id, allow_empty=True)
    if key is not None:
        valid_address_part("key", key, allow_empty=False)
    with backend.read() as tx:
        if not enabled_in(tx):
            raise SearchNotEnabled(
                "search is not enabled on this store: run store.enable_search() "
                "or flowdrop-local search --enable"
            )
        if not terms or not limit:
            return []
        rows = tx.all("search", (terms, scope, scope_id, key, limit))
    return [
        SearchHit(scope_, scope_id_, key_, message_id, role, snippet, float(score))
        for scope_, scope_id_, key_, message_id, role, snippet, score in rows
    ]

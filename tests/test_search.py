"""Search (issue 13): opt-in index of message text, kept in the append's transaction."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import InvalidAddress, InvalidArgument, NotAFlowdropDatabase, Principal, Store
from flowdrop_local.errors import SearchNotEnabled
from flowdrop_local.search import fts_query


def _parts(kind: str, text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": kind, "text": text}]}


@pytest.fixture
def searchable(store: Store) -> Store:
    store.enable_search()
    return store


class TestEnable:
    def test_search_needs_enabling(self, store: Store) -> None:
        """Without enable_search(), search raises SearchNotEnabled (a RuntimeError)."""
        assert store.search_enabled is False
        with pytest.raises(SearchNotEnabled, match="enable_search"):
            store.search("anything")
        assert issubclass(SearchNotEnabled, RuntimeError)

    def test_enable_indexes_existing_messages_and_is_remembered(self, target: str) -> None:
        """Messages stored before enabling are found; the index persists across opens."""
        with Store(target) as store:
            store.buffer("chat", "u", "k").append({"role": "user", "content": "old umbrella"})
            calls: list[tuple[int, int]] = []
            assert store.enable_search(lambda done, total: calls.append((done, total))) is True
            assert calls[-1] == (1, 1)
            assert store.enable_search() is False  # already on: nothing done
        with Store(target) as store:
            assert store.search_enabled
            assert [h.snippet for h in store.search("umbrella")] == ["old [umbrella]"]
            store.buffer("chat", "u", "k").append({"role": "user", "content": "new umbrella"})
            assert len(store.search("umbrella")) == 2
            assert store.check() == []

    def test_enable_in_runs(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        """Building over more messages than a run indexes them all, telling progress per run."""
        from flowdrop_local import search

        monkeypatch.setattr(search, "_RUN", 4)
        for key in ("a", "b"):
            store.buffer("chat", "u", key).append(
                [{"role": "user", "content": f"word{i} common"} for i in range(5)]
            )
        calls: list[tuple[int, int]] = []
        store.enable_search(lambda done, total: calls.append((done, total)))
        assert calls == [(4, 10), (8, 10), (10, 10)]
        assert len(store.search("common", limit=100)) == 10
        assert {h.key for h in store.search("word4")} == {"a", "b"}


class TestWhatIsIndexed:
    @pytest.mark.parametrize(
        ("message", "query", "found"),
        [
            ({"role": "user", "content": "plain text here"}, "text", True),
            (_parts("text", "part words"), "words", True),
            (_parts("input_text", "input words"), "input", True),
            (_parts("output_text", "output words"), "words", True),
            # JSON keys and part types are not text: output_text must not match.
            (_parts("output_text", "hello"), "output_text", False),
            (_parts("output_text", "hello"), "type", False),
            (_parts("input_text", "hello"), "input_text", False),
            # Other parts' fields are not indexed (an image's URL).
            (
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/cat"}}],
                },
                "cat",
                False,
            ),
            # Metadata (tool arguments) is not message text.
            (
                {
                    "role": "assistant",
                    "content": "",
                    "metadata": {"tool_calls": [{"tool_call_id": "c1", "name": "lookup_weather"}]},
                },
                "lookup_weather",
                False,
            ),
            ({"role": "user", "content": "Café au lait"}, "café", True),
            ({"role": "user", "content": "MiXeD case"}, "mixed", True),
        ],
    )
    def test_text_only(
        self, searchable: Store, message: dict[str, Any], query: str, found: bool
    ) -> None:
        searchable.buffer("chat", "u", "k").append(message)
        assert bool(searchable.search(query)) is found

    def test_sqlite_folds_diacritics(self, tmp_path: Path) -> None:
        """SQLite's tokenizer folds diacritics (cafe finds Café); PostgreSQL's 'simple' does not."""
        with Store(tmp_path / "x.db") as store:
            store.enable_search()
            store.buffer("chat", "u", "k").append({"role": "user", "content": "Café au lait"})
            assert [h.snippet for h in store.search("cafe")] == ["[Café] au lait"]

    def test_hit_fields(self, searchable: Store) -> None:
        """A hit names the buffer, the message id (text UUID) and role; the snippet marks terms."""
        buf = searchable.buffer("chat", "u1", "k1")
        buf.append({"role": "user", "content": "Will it rain in Lisbon tomorrow?"})
        (hit,) = searchable.search("lisbon RAIN")
        assert (hit.scope, hit.scope_id, hit.key, hit.role) == ("chat", "u1", "k1", "user")
        assert hit.message_id == buf.messages()[0].id
        assert "[rain]" in hit.snippet and "[Lisbon]" in hit.snippet
        assert hit.score > 0

    def test_best_first(self, searchable: Store) -> None:
        """A message dense in the term ranks above one that mentions it once in passing."""
        buf = searchable.buffer("chat", "u", "k")
        buf.append({"role": "user", "content": "umbrella " + "filler words " * 30})
        buf.append({"role": "user", "content": "umbrella umbrella umbrella"})
        hits = searchable.search("umbrella")
        assert [h.message_id for h in hits] == [buf.messages()[1].id, buf.messages()[0].id]
        assert hits[0].score >= hits[1].score


class TestKeptInTheTransaction:
    def test_rolled_back_append_is_never_found(self, target: str) -> None:
        """A failed batch (rolled back) leaves nothing findable; the committed one is found."""
        with Store(target) as store:
            store.enable_search()
            buf = store.buffer("chat", "u", "k")
            with pytest.raises(KeyboardInterrupt), store.backend.write() as tx:
                buf.append_in(
                    tx,
                    __import__("flowdrop_local").buffer.validate_batch(
                        {"role": "user", "content": "ghost words"}
                    ),
                )
                raise KeyboardInterrupt
            assert store.search("ghost") == []
            buf.append({"role": "user", "content": "real words"})
            assert len(store.search("words")) == 1

    def test_placeholder_replacement_reindexes(self, searchable: Store) -> None:
        """MEM-10: the real result replacing a placeholder is found; the placeholder text is not."""
        buf = searchable.buffer("chat", "u", "k")
        buf.append(
            [
                {
                    "role": "assistant",
                    "content": "",
                    "metadata": {"tool_calls": [{"tool_call_id": "c1", "name": "f"}]},
                },
                {"role": "user", "content": "hello?"},
            ]
        )
        assert len(searchable.search("interrupted")) == 1
        buf.append({"role": "tool", "content": "sunny skies", "metadata": {"tool_call_id": "c1"}})
        assert searchable.search("interrupted") == []
        assert [h.role for h in searchable.search("sunny")] == ["tool"]

    def test_admin_edit_reindexes(self, searchable: Store) -> None:
        admin = searchable.sessions(Principal(admin=True))
        session = admin.create("wf", owner="o")
        admin.drive(session.id, {"role": "user", "content": "before edit"})
        message = admin.messages(session.id)[0]
        admin.update_message(message.id, "after change")
        assert searchable.search("before") == [] and len(searchable.search("change")) == 1

    def test_deletions_leave_the_index(self, searchable: Store) -> None:
        """pop, clear, delete and a window's eviction all remove their messages' text."""
        buf = searchable.buffer("chat", "u", "k")
        buf.append([{"role": "user", "content": f"gone{i}"} for i in range(4)])
        buf.pop()
        assert searchable.search("gone3") == []
        searchable.buffer("chat", "u", "k", window=2).append({"role": "user", "content": "kept"})
        assert searchable.search("gone0") == [] and len(searchable.search("gone2")) == 1
        buf.clear()
        assert searchable.search("gone2") == []
        buf.append({"role": "user", "content": "last"})
        buf.delete()
        assert searchable.search("last") == [] and searchable.check() == []

    def test_fork_copies_are_found(self, searchable: Store) -> None:
        buf = searchable.buffer("chat", "u", "k")
        buf.append({"role": "user", "content": "forked words"})
        buf.fork(at=buf.messages()[0].id, to=("chat", "u", "f"))
        assert {h.key for h in searchable.search("forked")} == {"k", "f"}


class TestQueries:
    @pytest.mark.parametrize(
        "query",
        [
            '"',
            "AND",
            "OR NOT",
            "(",
            "*",
            "a:b",
            "NEAR(x y)",
            "^start",
            "'; DROP TABLE x; --",
            "-x +y",
        ],
    )
    def test_query_syntax_cannot_fail(self, searchable: Store, query: str) -> None:
        """FTS5 operators and quotes in user input are words, never a syntax error."""
        searchable.buffer("chat", "u", "k").append({"role": "user", "content": "AND or NOT start"})
        searchable.search(query)  # no error

    @pytest.mark.parametrize("query", ["", "   ", "!!!", "?? -- ..", '"" ()'])
    def test_a_query_without_words_finds_nothing(self, searchable: Store, query: str) -> None:
        searchable.buffer("chat", "u", "k").append({"role": "user", "content": "text !!!"})
        assert searchable.search(query) == []

    def test_every_term_must_match(self, searchable: Store) -> None:
        buf = searchable.buffer("chat", "u", "k")
        buf.append(
            [{"role": "user", "content": "red apple"}, {"role": "user", "content": "green apple"}]
        )
        assert [h.snippet for h in searchable.search("apple red")] == ["[red] [apple]"]
        assert len(searchable.search("apple")) == 2

    @pytest.mark.parametrize(
        ("filters", "keys"),
        [
            ({}, {"a", "b", "c"}),
            ({"scope": "chat"}, {"a", "b"}),
            ({"scope": "chat", "scope_id": "u2"}, {"b"}),
            ({"scope_id": "u1"}, {"a", "c"}),
            ({"key": "c"}, {"c"}),
            ({"scope": "none"}, set()),
        ],
    )
    def test_filters(self, searchable: Store, filters: dict[str, str], keys: set[str]) -> None:
        searchable.buffer("chat", "u1", "a").append({"role": "user", "content": "shared"})
        searchable.buffer("chat", "u2", "b").append({"role": "user", "content": "shared"})
        searchable.buffer("notes", "u1", "c").append({"role": "user", "content": "shared"})
        assert {h.key for h in searchable.search("shared", **filters)} == keys

    def test_limit(self, searchable: Store) -> None:
        searchable.buffer("chat", "u", "k").append(
            [{"role": "user", "content": "same"} for _ in range(5)]
        )
        assert len(searchable.search("same", limit=3)) == 3
        assert searchable.search("same", limit=0) == []

    @pytest.mark.parametrize(
        ("kwargs", "error"),
        [
            ({"query": None}, InvalidArgument),
            ({"query": b"bytes"}, InvalidArgument),
            ({"query": "x", "limit": -1}, InvalidArgument),
            ({"query": "x", "limit": "3"}, InvalidArgument),
            ({"query": "x", "scope": 1}, InvalidAddress),
            ({"query": "x", "key": ""}, InvalidAddress),
            ({"query": "\udcff"}, InvalidArgument),  # a lone surrogate
        ],
    )
    def test_bad_arguments(self, searchable: Store, kwargs: dict[str, Any], error: type) -> None:
        rest = dict(kwargs)
        query = rest.pop("query")
        with pytest.raises(error):
            searchable.search(query, **rest)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("hello world", '"hello" "world"'),
        ('say "hi"', '"say" """hi"""'),
        ("output_text", '"output_text"'),
        ("!!! ok", '"ok"'),
        ("", ""),
    ],
)
def test_fts_query_quotes_every_term(query: str, expected: str) -> None:
    assert fts_query(query) == expected


class TestSchemaVerification:
    def test_appends_without_search_have_no_trigger(self, tmp_path: Path) -> None:
        """A store that never enabled search has none of its objects (appends pay nothing)."""
        path = tmp_path / "x.db"
        with Store(path) as store:
            store.buffer("chat", "u", "k").append({"role": "user", "content": "x"})
        conn = sqlite3.connect(path)
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        conn.close()
        assert not {n for n in names if "search" in n}

    @pytest.mark.parametrize(
        ("damage", "problem"),
        [
            (
                "DROP TRIGGER messages_search_update",
                "messages_search_update of the search index is missing",
            ),
            (
                "DROP TRIGGER messages_search_insert",
                "messages_search_insert of the search index is missing",
            ),
            (
                "DROP TRIGGER messages_search_delete; CREATE TRIGGER messages_search_delete "
                "AFTER DELETE ON messages BEGIN SELECT 1; END",
                "messages_search_delete is not the one flowdrop_local makes",
            ),
        ],
    )
    def test_a_damaged_search_index_is_refused(
        self, tmp_path: Path, damage: str, problem: str
    ) -> None:
        """Only the search objects exactly as search.sql makes them, all of them, are accepted."""
        path = tmp_path / "x.db"
        with Store(path) as store:
            store.enable_search()
        conn = sqlite3.connect(path)
        conn.executescript(damage)
        conn.close()
        with pytest.raises(NotAFlowdropDatabase, match=problem):
            Store(path)

    def test_postgresql_check_accepts_the_search_triggers(self, postgresql_url: str) -> None:
        import psycopg

        with Store(postgresql_url) as store:
            store.enable_search()
            assert store.check() == []
        with psycopg.connect(postgresql_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER messages_search_update ON messages")
        with pytest.raises(NotAFlowdropDatabase, match="messages_search_update of the search"):
            Store(postgresql_url)

"""Export and import under large work: streamed, bounded memory, one snapshot, one transaction."""

from __future__ import annotations

import gc
import json
import sqlite3
import threading
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowdrop_local import FlowdropError, InvalidImport, Store, export_import
from flowdrop_local.cli import cli
from flowdrop_local.errors import InvalidAddress, NotADatabase

from .conftest import snapshot

GOOD = {"scope": "s", "scope_id": "1", "key": "k", "role": "user", "content": "fine"}


def _fill(store: Store, total: int, key: str = "k") -> None:
    buffer = store.buffer("s", "1", key)
    for start in range(0, total, 1_000):
        buffer.append(
            [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 20}
                for i in range(start, min(total, start + 1_000))
            ]
        )


def _wal_pinned(path: Path) -> bool:
    """Whether some reader holds a snapshot that keeps the WAL from being checkpointed."""
    conn = sqlite3.connect(path, timeout=0)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return bool(busy)
    finally:
        conn.close()


# ------------------------------------------------------------------------ export


@pytest.mark.timeout(120)
def test_export_memory_stays_flat(tmp_path: Path) -> None:
    """Exporting 20,000 messages peaks under 4 MB of Python memory (was 14 MB: every row
    was fetched before the first record)."""
    with Store(tmp_path / "x.db") as store:
        _fill(store, 20_000)
        tracemalloc.start()
        try:
            count = sum(1 for _ in store.export())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert count == 20_000
    assert peak < 4 * 1024 * 1024, peak


@pytest.mark.timeout(60)
def test_export_is_one_snapshot_and_writers_go_on(tmp_path: Path) -> None:
    """While an export is iterated, appends and an import commit at once (from another
    thread) and the export shows none of them: the state when it began, whole."""
    with Store(tmp_path / "x.db") as store:
        _fill(store, 2_500)
        _fill(store, 10, key="other")
        expected = list(store.export())
        records = store.export()
        first = next(records)
        done = threading.Event()

        def write() -> None:
            store.buffer("s", "1", "k").append({"role": "user", "content": "new"})
            store.buffer("s", "1", "z-new").append({"role": "user", "content": "new"})
            store.import_records([{**GOOD, "key": "imported"}])
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        writer.join(timeout=30)
        assert done.is_set(), "a writer waited for the export"
        assert [first, *records] == expected
        assert len(list(store.export())) == len(expected) + 3


@pytest.mark.parametrize("how", ["finished", "closed", "dropped"])
def test_export_releases_its_snapshot(tmp_path: Path, how: str) -> None:
    """The export's own connection ends when the generator finishes, is closed or is
    garbage-collected: the WAL can be checkpointed again."""
    path = tmp_path / "x.db"
    with Store(path) as store:
        _fill(store, 1_200)
        records: Iterator[dict[str, Any]] | None = store.export()
        assert records is not None
        next(records)
        store.buffer("s", "1", "k").append({"role": "user", "content": "after"})
        assert _wal_pinned(path)  # the export holds its snapshot
        if how == "finished":
            assert sum(1 for _ in records) == 1_199
        elif how == "closed":
            records.close()  # type: ignore[attr-defined]
        else:
            records = None
            gc.collect()
        assert not _wal_pinned(path)


def test_export_of_a_rollback_journal_file_does_not_block_writers(tmp_path: Path) -> None:
    """Outside WAL (a read-only store keeps the file's journal mode) a held snapshot would
    block every commit: the export reads whole first, so another writer commits at once."""
    path = tmp_path / "x.db"
    with Store(path) as store:
        _fill(store, 1_200)
    conn = sqlite3.connect(path, timeout=0.2)
    conn.execute("PRAGMA journal_mode = DELETE")
    with Store(path, read_only=True) as store:
        records = store.export()
        next(records)
        conn.execute("CREATE TABLE mine (x)")  # the user's own table, through another connection
        conn.commit()  # "database is locked" if the export still held its read lock
        assert sum(1 for _ in records) == 1_199
    conn.close()


def test_read_only_store_export_streams(tmp_path: Path) -> None:
    """A read-only store (mode=ro) on a WAL file exports through its own snapshot too."""
    path = tmp_path / "x.db"
    with Store(path) as writer:
        _fill(writer, 1_200)
        with Store(path, read_only=True) as store:
            records = store.export()
            next(records)
            writer.buffer("s", "1", "k").append({"role": "user", "content": "after"})
            assert _wal_pinned(path)
            assert sum(1 for _ in records) == 1_199


def test_memory_store_export_reads_whole_first(store: Store) -> None:
    """ ":memory:" has no file for a second connection: the export reads every row, then
    yields, so writes during the iteration neither block nor show."""
    _fill(store, 30)
    records = store.export()
    next(records)
    store.buffer("s", "1", "k").append({"role": "user", "content": "new"})
    assert len(list(records)) == 29


@pytest.mark.parametrize(
    "address",
    [("global",), ("a", "b"), ("a", "b", "c", "d"), ("a", "b", 5), "abc", 5, {"scope": "a"}],
    ids=["one", "two", "four", "not-strings", "a-string", "an-int", "a-dict"],
)
def test_export_refuses_a_malformed_address_at_once(store: Store, address: Any) -> None:
    """An export address is None or three strings; anything else is InvalidAddress at the
    call (was sqlite3.ProgrammingError on iteration)."""
    with pytest.raises(InvalidAddress, match="three strings"):
        store.export(address)


@pytest.mark.parametrize(
    ("column", "value", "content_parts"),
    [
        ("content", "[not json", 1),
        ("content", "[" * 5_000 + "]" * 5_000, 1),  # deeper than json.loads recurses
        ("metadata", '{"a": ' + "[" * 1_500 + "]" * 1_500 + "}", 0),  # SQLite reads it
        ("metadata", '{"n": ' + "9" * 5_000 + "}", 0),  # more digits than int() reads
    ],
    ids=["content-parts", "deep-content", "deep-metadata", "huge-number"],
)
def test_a_damaged_row_on_export_is_named(
    tmp_path: Path, column: str, value: str, content_parts: int
) -> None:
    """A row holding invalid JSON (a damaged file) raises NotADatabase naming the message
    and its buffer (was JSONDecodeError / RecursionError / ValueError)."""
    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("s", "1", "k").append(
            [{"role": "user", "content": "ok"}, {"role": "user", "content": "bad"}]
        )
        bad_id = store.buffer("s", "1", "k").messages()[1].id
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute(
        f"UPDATE messages SET {column} = ?, content_parts = ? WHERE id = ?",
        (value, content_parts, uuid.UUID(bad_id).bytes),  # ids are stored as 16 bytes
    )
    conn.commit()
    conn.close()
    with Store(path) as store, pytest.raises(NotADatabase, match=f"message {bad_id} of buffer"):
        list(store.export())


# ------------------------------------------------------------------------ import


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.timeout(120)
def test_import_memory_stays_flat(tmp_path: Path) -> None:
    """Importing a 20,000-line file peaks under 8 MB of Python memory (was 46 MB: every
    line was parsed and planned before the first write)."""
    with Store(tmp_path / "a.db") as source:
        _fill(source, 20_000)
        dump = _jsonl(tmp_path / "dump.jsonl", list(source.export()))
    with Store(tmp_path / "b.db") as target, open(dump, encoding="utf-8") as lines:
        tracemalloc.start()
        try:
            report = target.import_jsonl(lines)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert report.imported == 20_000
    assert peak < 8 * 1024 * 1024, peak


def test_import_reads_its_input_once(tmp_path: Path) -> None:
    """A one-shot iterator (a pipe, stdin) is enough: import reads each line once, in order."""
    read: list[int] = []

    def lines() -> Iterator[str]:
        for i in range(5):
            read.append(i)
            yield json.dumps({**GOOD, "content": f"m{i}"})

    with Store(tmp_path / "x.db") as store:
        assert store.import_jsonl(lines()).imported == 5
        assert read == [0, 1, 2, 3, 4]
        assert [m["content"] for m in store.buffer("s", "1", "k").read()] == [
            f"m{i}" for i in range(5)
        ]


def test_cli_import_from_stdin(tmp_path: Path) -> None:
    """flowdrop-local import - reads the export from stdin."""
    a, b = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    with Store(a) as source:
        _fill(source, 50)
    dump = CliRunner().invoke(cli, ["--db", a, "export"]).stdout
    result = CliRunner().invoke(cli, ["--db", b, "import", "-"], input=dump)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["imported"] == 50
    assert CliRunner().invoke(cli, ["--db", b, "export"]).stdout == dump


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["r", "rb"], ids=["text-file", "binary-file"])
def test_an_overlong_line_is_refused_without_reading_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A line above MAX_LINE_CHARS is InvalidImport naming it; a file is read only up to
    the limit, never the whole line."""
    monkeypatch.setattr(export_import, "MAX_LINE_CHARS", 1_000)
    ok = json.dumps({**GOOD, "content": "x" * 900})  # under the limit
    long = json.dumps({**GOOD, "content": "x" * 5_000_000})
    path = tmp_path / "in.jsonl"
    path.write_text(f"{ok}\n{long}\n{ok}\n", encoding="utf-8")
    db = tmp_path / "x.db"
    with Store(db) as store:
        before = snapshot(db)
        with open(path, mode) as lines:
            tracemalloc.start()
            try:
                with pytest.raises(InvalidImport, match="longer than 1,000 characters") as caught:
                    store.import_jsonl(lines)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert caught.value.line == 2
        assert peak < 1_000_000  # the 5 MB line was never held
        assert snapshot(db) == before
        # A list of strings is measured after the fact, with the same error.
        with pytest.raises(InvalidImport, match="longer than") as caught:
            store.import_jsonl([ok, long])
        assert caught.value.line == 2


def test_the_line_limit_is_the_documented_one() -> None:
    """32 MiB characters, Anthropic's request limit: an image-laden turn fits."""
    assert export_import.MAX_LINE_CHARS == 32 * 1024 * 1024


@pytest.mark.parametrize("bad_at", [1, 9, 25])
def test_a_bad_line_after_written_chunks_rolls_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad_at: int
) -> None:
    """Chunks are appended as the file is read; a bad line anywhere (here after several
    chunks of two buffers went in) rolls back the one transaction: nothing is written."""
    monkeypatch.setattr(export_import, "_CHUNK", 3)
    lines = [json.dumps({**GOOD, "key": f"k{i // 10}", "content": f"m{i}"}) for i in range(30)]
    lines[bad_at - 1] = json.dumps({**GOOD, "role": "robot"})
    path = tmp_path / "x.db"
    with Store(path) as store:
        store.buffer("other", "", "k").append({"role": "user", "content": "before"})
        before = snapshot(path)
        with pytest.raises(InvalidImport, match="role") as caught:
            store.import_jsonl(lines)
        assert caught.value.line == bad_at
        assert snapshot(path) == before


OTHER_TOOL = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "w1", "name": "forecast"}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "w2", "name": "radar"}]},
    {"role": "tool", "tool_call_id": "w2", "content": "dry"},
    {"role": "user", "content": "hello?"},
    {"role": "tool", "tool_call_id": "w2", "content": "dry again"},
    {"role": "tool", "tool_call_id": "w1", "content": "late, replaces its placeholder"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "w2", "name": "again"}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "w3", "name": "x"}]},
    {"role": "user", "content": "bye"},
]


@pytest.mark.parametrize("chunk", [1, 2, 3, 1000])
@pytest.mark.parametrize("with_positions", [False, True], ids=["file-order", "given-positions"])
def test_chunk_boundaries_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, with_positions: bool
) -> None:
    """Healing (MEM-3), duplicate results (MEM-1), late results (MEM-10) and re-declared
    calls (MEM-2) come out the same whatever the chunk size, as message-by-message appends."""
    with Store(tmp_path / "appended.db") as store:
        buffer = store.buffer("s", "1", "k")
        for message in OTHER_TOOL:
            buffer.append(message)
        expected = buffer.read()
    monkeypatch.setattr(export_import, "_CHUNK", chunk)
    records: list[dict[str, Any]] = [
        {"scope": "s", "scope_id": "1", "key": "k", **m} for m in OTHER_TOOL
    ]
    if with_positions:
        for i, record in enumerate(records):
            record["position"] = f"b{i:02d}"
    with Store(tmp_path / "imported.db") as store:
        report = store.import_records(records)
        assert (report.imported, report.healed, report.dropped) == (7, 2, 2)
        assert store.buffer("s", "1", "k").read() == expected
        assert store.check() == []


@pytest.mark.parametrize("replace", [False, True])
def test_a_buffer_in_two_runs_goes_on_where_it_stopped(tmp_path: Path, replace: bool) -> None:
    """Lines of a buffer split by another buffer's lines are imported as if consecutive
    (positions kept); the second run neither counts as 'already holds messages' nor
    replaces the first."""
    a = [{**GOOD, "content": f"a{i}", "position": f"a{i}"} for i in range(4)]
    b = [{**GOOD, "key": "b", "content": "b0"}]
    with Store(tmp_path / "x.db") as store:
        if replace:
            store.buffer("s", "1", "k").append({"role": "user", "content": "old"})
        report = store.import_records([*a[:2], *b, *a[2:]], replace=replace)
        assert (report.buffers, report.imported, report.replaced_buffers) == (2, 5, int(replace))
        stored = store.buffer("s", "1", "k").messages()
        assert [(m.content, m.position) for m in stored] == [(f"a{i}", f"a{i}") for i in range(4)]


@pytest.mark.parametrize(
    ("positions", "words", "line"),
    [
        (["a1", "a0"], "comes before 'a1'", 2),
        (["a0", "a0"], "appears twice", 2),
        (["a0", None], "on every line or on none", 2),
        (["a2", "SPLIT", "a1"], "comes before 'a2'", 3),  # across two runs of the buffer
    ],
)
def test_a_buffer_s_positions_must_increase(
    tmp_path: Path, positions: list[str | None], words: str, line: int
) -> None:
    """A buffer's lines come in position order, as export writes them; a line whose
    position does not increase is InvalidImport naming it, and nothing is written."""
    records: list[dict[str, Any]] = []
    for position in positions:
        if position == "SPLIT":
            records.append({**GOOD, "key": "other"})
        elif position is None:
            records.append(dict(GOOD))
        else:
            records.append({**GOOD, "position": position})
    with Store(tmp_path / "x.db") as store:
        with pytest.raises(InvalidImport, match=words) as caught:
            store.import_records(records)
        assert caught.value.line == line
        assert store.buffers() == []


def test_ids_are_unique_across_chunks_and_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An id seen in an earlier chunk is 'appears twice' naming the later line; an id a
    message of another buffer already holds is named with that buffer."""
    monkeypatch.setattr(export_import, "_CHUNK", 2)
    ids = [f"00000000-0000-7000-8000-{i:012d}" for i in range(6)]
    records = [{**GOOD, "id": i, "content": f"m{n}"} for n, i in enumerate(ids)]
    with Store(tmp_path / "x.db") as store:
        with pytest.raises(InvalidImport, match="appears twice") as caught:
            store.import_records([*records, {**GOOD, "id": ids[1]}])
        assert caught.value.line == 7
        store.import_records([{**GOOD, "key": "first", "id": ids[0]}])
        with pytest.raises(InvalidImport, match="already used by a message of buffer s/1/first"):
            store.import_records(records)
        assert len(store.buffer("s", "1", "k")) == 0


# ------------------------------------------- every error from the public API is typed


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda s: s.import_records([5]), "a record must be a mapping"),
        (lambda s: s.import_records([("a", "b")]), "a record must be a mapping"),
        (lambda s: s.import_records(5), "an iterable of mappings"),
        (lambda s: s.import_records({"scope": "s"}), "an iterable of mappings"),
        (lambda s: s.import_jsonl([5]), "a line must be a string"),
        (lambda s: s.import_jsonl(5), "an iterable of strings"),
        (lambda s: s.import_jsonl(json.dumps(GOOD)), "an iterable of strings"),
        (lambda s: s.import_jsonl([b"\xff\xfe"]), "not UTF-8"),
        (lambda s: s.import_records([{**GOOD, "scope": "s\ud800"}]), "must be strings"),
        (lambda s: s.import_records([{**GOOD, "id": "\ud800" * 36}]), "id must be a string"),
    ],
    ids=[
        "int-record",
        "tuple-record",
        "int-records",
        "a-mapping-for-records",
        "int-line",
        "int-lines",
        "one-string-for-lines",
        "bytes-not-utf8",
        "surrogate-address",
        "surrogate-id",
    ],
)
def test_wrong_arguments_get_invalid_import(store: Store, call: Any, words: str) -> None:
    """Wrong types give InvalidImport (a FlowdropError), not AttributeError or TypeError."""
    with pytest.raises(InvalidImport, match=words):
        call(store)
    assert store.buffers() == []


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"n": ' + "1" * 5_000 + "}", "more than 4,300 digits"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"content": ' + "[" * 2_000 + "]" * 2_000 + "}", "nested too deeply"),
    ],
    ids=["huge-number", "deep-array", "deep-in-object"],
)
def test_hostile_json_lines_are_named(store: Store, line: str, words: str) -> None:
    """A number of more than 4,300 digits or nesting deeper than json.loads recurses is
    InvalidImport naming the line (was ValueError / RecursionError)."""
    with pytest.raises(InvalidImport, match=words) as caught:
        store.import_jsonl([json.dumps(GOOD), line])
    assert caught.value.line == 2
    assert store.buffers() == []


def test_cli_import_of_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    """A non-UTF-8 import file prints one Error: line and exits 2, no traceback."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"content": "\xff\xfe"}\n')
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "x.db"), "import", str(path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and "not UTF-8" in result.stderr
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
    assert issubclass(InvalidImport, FlowdropError)

"""The append path's cached tail (count, last position, unanswered calls) is never stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowdrop_local import InvalidArgument, Store


def test_writes_through_store_db_invalidate_the_cache(tmp_path: Path) -> None:
    """A delete or insert through a kept store.db handle is seen by the next append."""
    with Store(tmp_path / "x.db") as store:
        db = store.db
        buffer = store.buffer("s", "", "k")
        buffer.append([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        db.execute("DELETE FROM messages WHERE content = 'a'")
        result = buffer.append({"role": "user", "content": "c"})
        assert result.count == len(buffer) == 2
        assert store.check() == []


def test_two_stores_in_one_process_see_each_others_appends(tmp_path: Path) -> None:
    """Interleaved appends through two Store objects keep positions and counts right."""
    with Store(tmp_path / "x.db") as first, Store(tmp_path / "x.db") as second:
        a, b = first.buffer("s", "", "k"), second.buffer("s", "", "k")
        for i in range(20):
            (a if i % 3 else b).append({"role": "assistant", "tool_calls": [{"id": f"c{i}"}]})
            assert (b if i % 3 else a).append({"role": "user", "content": str(i)}).count == 3 * (
                i + 1
            )
        assert first.check() == []


def test_a_rolled_back_append_leaves_the_cache_right(tmp_path: Path) -> None:
    """After an append that failed half way, the next one reports the true count."""
    with Store(tmp_path / "x.db") as store:
        buffer = store.buffer("s", "", "k")
        buffer.append({"role": "assistant", "tool_calls": [{"id": "c1"}]})
        conn = store.backend.connection()
        conn.execute(
            "CREATE TEMP TRIGGER boom AFTER INSERT ON main.messages "
            "WHEN NEW.content = 'boom' BEGIN SELECT RAISE(ABORT, 'boom'); END"
        )
        with pytest.raises(Exception, match="boom"):
            buffer.append(
                [{"role": "user", "content": "heals"}, {"role": "user", "content": "boom"}]
            )
        result = buffer.append({"role": "user", "content": "ok"})
        assert (result.count, len(result.healed_ids)) == (3, 1)


def test_an_empty_append_writes_nothing(tmp_path: Path) -> None:
    """append([]) reports the count and creates no buffer row."""
    with Store(tmp_path / "x.db") as store:
        assert store.buffer("s", "", "k").append([]).count == 0
        assert store.db["buffers"].count == 0


@pytest.mark.parametrize("value", [0, -1, "5", None])
def test_lock_warning_after_must_be_positive(tmp_path: Path, value: object) -> None:
    """A zero or negative wait would spin on the lock: refused."""
    with pytest.raises(InvalidArgument):
        Store(tmp_path / "x.db", lock_warning_after=value)  # type: ignore[arg-type]


def test_appending_while_an_export_is_iterated(tmp_path: Path) -> None:
    """An export in progress holds neither the lock nor a transaction."""
    with Store(tmp_path / "x.db") as store:
        buffer = store.buffer("s", "", "k")
        buffer.append([{"role": "user", "content": str(i)} for i in range(5)])
        records = store.export()
        first = next(records)
        buffer.append({"role": "user", "content": "during"})
        assert store.check() == []
        assert [first["content"], *(r["content"] for r in records)] == ["0", "1", "2", "3", "4"]

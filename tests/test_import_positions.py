"""Imported positions: ordinary keys are kept exactly, keys without room are re-keyed in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowdrop_local import Store, export_import
from flowdrop_local.export_import import MAX_POSITION_LENGTH, keeps_position

ADDRESS = {"scope": "s", "scope_id": "1", "key": "k"}
LARGEST = "z" * 27  # the largest integer key: after it every append lengthens its key


def _lines(positions: list[str]) -> list[dict[str, Any]]:
    return [
        {
            **ADDRESS,
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"m{i}",
            "position": p,
        }
        for i, p in enumerate(positions)
    ]


def _stored(store: Store) -> list[tuple[str, str]]:
    """(content, position) in position order."""
    return [(str(m.content), m.position) for m in store.buffer("s", "1", "k").messages()]


@pytest.mark.parametrize(
    ("key", "kept"),
    [
        ("a0", True),  # the first key
        ("a0V", True),  # a healed placeholder between two appends
        ("d0000", True),  # after 1,000,000 appends
        ("az", True),  # the largest two-character integer: the next append is "b00", fine
        ("Zz", True),  # below "a0" (a key placed before the first)
        ("a0" + "V" * 14, True),  # 16 characters, its successor "a1" is short
        ("o" + "0" * 15, True),  # an integer part of 16 characters, successor too
        ("o" + "z" * 15, False),  # the largest such integer: the next key needs 17
        ("a0" + "V" * 15, False),  # 17 characters: longer than the documented maximum
        (LARGEST, False),  # no room after it at all
        ("z" * 26 + "y", False),  # one append of room, then none
    ],
)
def test_which_positions_an_import_keeps(key: str, kept: bool) -> None:
    """A well-formed key is kept iff it and the key appended after it fit MAX_POSITION_LENGTH."""
    assert MAX_POSITION_LENGTH == 16
    assert keeps_position(key) is kept


@pytest.mark.timeout(120)
def test_a_largest_key_import_does_not_lengthen_later_appends(tmp_path: Path) -> None:
    """Importing "z"*27 then appending 3,000 messages keeps every key short (was 627 chars)."""
    with Store(tmp_path / "x.db") as store:
        store.import_records(_lines([LARGEST]))
        buffer = store.buffer("s", "1", "k")
        for _ in range(3_000):
            buffer.append({"role": "user", "content": "again"})
        positions = [m.position for m in buffer.messages()]
        assert len(positions) == 3_001
        assert max(len(p) for p in positions) <= 3  # before the fix: 627, ~1 MB of keys
        assert positions == sorted(positions)
        assert store.check() == []


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        # poison at the end: re-keyed after the last kept key
        (["a0", "a1", LARGEST], [True, True, False]),
        # too long in the middle: re-keyed between its neighbours, which stay as given
        (["a0", "a0" + "V" * 20, "a0" + "W" * 20, "a1"], [True, False, False, True]),
        # no room after it, first of the buffer: re-keyed before the next kept key
        (["o" + "z" * 15, "p" + "0" * 16], [False, False]),
        (["z" * 26 + "y", LARGEST], [False, False]),
        # everything ordinary: kept byte for byte
        (["Zz", "a0", "a0V", "a1", "az", "b00", "d0000"], [True] * 7),
    ],
)
def test_rekeyed_lines_keep_their_order(tmp_path: Path, given: list[str], kept: list[bool]) -> None:
    """Ordinary keys are stored as given; the others get short keys in the same order."""
    with Store(tmp_path / "x.db") as store:
        store.import_records(_lines(given))
        stored = _stored(store)
        assert [content for content, _ in stored] == [f"m{i}" for i in range(len(given))]
        for (_, position), original, keep in zip(stored, given, kept, strict=True):
            assert (position == original) is keep
            assert len(position) <= MAX_POSITION_LENGTH
        assert store.check() == []


def test_a_long_run_of_bad_keys_is_rekeyed_at_the_end_and_order_still_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More bad keys in a row than a chunk holds are placed at the end; a later key below them
    is re-keyed too, so the file's order is the stored order."""
    monkeypatch.setattr(export_import, "_CHUNK", 3)
    given = ["a0", *(f"a0{'V' * 20}{d}" for d in "123456"), "a0W", "b00"]
    with Store(tmp_path / "x.db") as store:
        store.import_records(_lines(given))
        stored = _stored(store)
        assert [content for content, _ in stored] == [f"m{i}" for i in range(len(given))]
        assert stored[0][1] == "a0" and stored[-1][1] == "b00"
        assert stored[-2][1] != "a0W"  # below the six re-keyed at the end: re-keyed as well
        assert max(len(p) for _, p in stored) <= 3


def test_a_copy_keeps_every_position_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """export -> import keeps each position byte for byte, also keys made by healing
    between rows and across many chunks."""
    monkeypatch.setattr(export_import, "_CHUNK", 7)
    with Store(tmp_path / "a.db") as source:
        buffer = source.buffer("s", "1", "k")
        for i in range(60):
            buffer.append(
                [
                    {"role": "assistant", "tool_calls": [{"id": f"c{i}", "name": "f"}]},
                    {"role": "assistant", "content": "goes on"},
                    {"role": "user", "content": f"u{i}"},  # heals c{i} between the two
                ]
            )
        exported = list(source.export())
    assert any(len(r["position"]) > 2 and r["metadata"].get("healed") for r in exported)
    with Store(tmp_path / "b.db") as target:
        target.import_records(exported)
        assert [r["position"] for r in target.export()] == [r["position"] for r in exported]
        assert list(target.export()) == exported

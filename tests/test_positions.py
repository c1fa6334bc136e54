"""Fractional position keys: the rocicorp format, checked against the PyPI port."""

from __future__ import annotations

import sqlite3

import fractional_indexing as oracle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowdrop_local import InvalidPositionKey
from flowdrop_local.positions import is_valid_key, key_between, keys_between

# (a, b, expected key or the error it raises): rows from the reference test table.
BETWEEN = [
    (None, None, "a0"),
    (None, "a0", "Zz"),
    (None, "Zz", "Zy"),
    ("a0", None, "a1"),
    ("a1", None, "a2"),
    ("a0", "a1", "a0V"),
    ("a1", "a2", "a1V"),
    ("a0V", "a1", "a0l"),
    ("Zz", "a0", "ZzV"),
    ("Zz", "a1", "a0"),
    (None, "Y00", "Xzzz"),
    ("bzz", None, "c000"),
    ("a0", "a0V", "a0G"),
    ("a0", "a0G", "a08"),
    ("b125", "b129", "b127"),
    ("a0", "a1V", "a1"),
    ("Zz", "a01", "a0"),
    (None, "a0V", "a0"),
    (None, "b999", "b99"),
    ("zzzzzzzzzzzzzzzzzzzzzzzzzzy", None, "zzzzzzzzzzzzzzzzzzzzzzzzzzz"),
    ("zzzzzzzzzzzzzzzzzzzzzzzzzzz", None, "zzzzzzzzzzzzzzzzzzzzzzzzzzzV"),
    ("a00", None, InvalidPositionKey),  # trailing zero in the fraction
    ("a00", "a1", InvalidPositionKey),
    ("0", "1", InvalidPositionKey),  # no letter head
    ("a1", "a0", InvalidPositionKey),  # a >= b
    ("a0", "a0", InvalidPositionKey),
    ("", None, InvalidPositionKey),
    ("a", None, InvalidPositionKey),  # integer part too short
    ("a0!", None, InvalidPositionKey),  # outside the base-62 alphabet
    ("A00000000000000000000000000", None, InvalidPositionKey),  # the reserved smallest integer
]


@pytest.mark.parametrize(("a", "b", "expected"), BETWEEN)
def test_key_between_table(a: str | None, b: str | None, expected: object) -> None:
    """Each row gives the reference key, or the typed error."""
    if isinstance(expected, type):
        with pytest.raises(expected):
            key_between(a, b)
    else:
        assert key_between(a, b) == expected


N_KEYS = [
    (None, None, 5, ["a0", "a1", "a2", "a3", "a4"]),
    ("a4", None, 10, ["a5", "a6", "a7", "a8", "a9", "aA", "aB", "aC", "aD", "aE"]),
    (None, "a0", 5, ["Zv", "Zw", "Zx", "Zy", "Zz"]),
    ("a0", "a2", 20, None),  # compared with the oracle below
    ("a0", "a1", 0, []),
    ("a1", "a0", 2, InvalidPositionKey),
    ("a0", "a1", -1, InvalidPositionKey),
]


@pytest.mark.parametrize(("a", "b", "n", "expected"), N_KEYS)
def test_keys_between_table(a: str | None, b: str | None, n: int, expected: object) -> None:
    """n keys between two bounds match the reference, or raise the typed error."""
    if isinstance(expected, type):
        with pytest.raises(expected):
            keys_between(a, b, n)
        return
    keys = keys_between(a, b, n)
    assert keys == (expected if expected is not None else oracle.generate_n_keys_between(a, b, n))


def _sorted_by_sqlite(keys: list[str]) -> list[str]:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE k (v TEXT) STRICT")
    conn.executemany("INSERT INTO k VALUES (?)", [(k,) for k in keys])
    return [row[0] for row in conn.execute("SELECT v FROM k ORDER BY v COLLATE BINARY")]


@st.composite
def ordered_pairs(draw: st.DrawFn) -> tuple[str | None, str | None]:
    """Two valid keys (or open ends) with a < b, built through the public API."""
    keys: list[str] = []
    for _ in range(draw(st.integers(min_value=2, max_value=12))):
        lo = draw(st.sampled_from([None, *keys]))
        his = [k for k in keys if lo is None or k > lo]
        hi = draw(st.sampled_from([None, *his]))
        keys.append(key_between(lo, hi))
    keys.sort()
    a = draw(st.sampled_from([None, *keys]))
    b = draw(st.sampled_from([None, *[k for k in keys if a is None or k > a]]))
    return a, b


@settings(max_examples=300, deadline=None)
@given(ordered_pairs())
def test_key_between_matches_the_oracle_and_is_strictly_between(
    pair: tuple[str | None, str | None],
) -> None:
    """Same key as the PyPI port, strictly between the bounds, and well formed."""
    a, b = pair
    key = key_between(a, b)
    assert key == oracle.generate_key_between(a, b)
    assert is_valid_key(key)
    assert (a is None or a < key) and (b is None or key < b)


@settings(max_examples=200, deadline=None)
@given(ordered_pairs(), st.integers(min_value=0, max_value=40))
def test_n_keys_distinct_ordered_and_sorted_by_sqlite(
    pair: tuple[str | None, str | None], n: int
) -> None:
    """n keys are distinct, ascending, inside the bounds, and SQLite sorts them the same way."""
    a, b = pair
    keys = keys_between(a, b, n)
    assert keys == oracle.generate_n_keys_between(a, b, n)
    assert len(set(keys)) == n
    assert keys == sorted(keys) == _sorted_by_sqlite(keys)
    bounded = ([a] if a else []) + keys + ([b] if b else [])
    assert bounded == _sorted_by_sqlite(bounded)


def test_ten_thousand_appends_keep_keys_at_four_characters() -> None:
    """Appending at the end 10,000 times never needs a key longer than 4 characters."""
    key = None
    longest = 0
    for _ in range(10_000):
        key = key_between(key, None)
        longest = max(longest, len(key))
    assert longest <= 4


def test_long_keys_need_no_recursion() -> None:
    """Inserting 10,000 times just after the same key makes long keys without recursion."""
    low, high = "a0", "a1"
    for _ in range(10_000):
        high = key_between(low, high)
    assert len(high) > 1_500  # deeper than Python's default recursion limit
    assert low < key_between(low, high) < high


def test_n_keys_between_neighbours_are_balanced() -> None:
    """10,000 keys between two neighbours need about log62(10,000) more digits, not 10,000."""
    keys = keys_between("a0", "a1", 10_000)
    assert len(set(keys)) == 10_000 and keys == sorted(keys)
    assert max(len(k) for k in keys) <= 6


def test_healing_many_calls_between_rows_keeps_positions_short() -> None:
    """Through the public API: 5,000 placeholders placed between a turn and its successor."""
    from flowdrop_local import Store

    with Store(":memory:") as store:
        buffer = store.buffer("s", "", "k")
        calls = [{"id": f"c{i}"} for i in range(5_000)]
        buffer.append(
            [{"role": "assistant", "tool_calls": calls}, {"role": "assistant", "content": "x"}]
        )
        result = buffer.append({"role": "user", "content": "heal"})
        assert len(result.healed_ids) == 5_000
        positions = [m.position for m in buffer.messages()]
        assert positions == sorted(positions)
        assert max(len(p) for p in positions) <= 6
        assert [m.tool_call_id for m in buffer.messages()[1:5001]] == [
            f"c{i}" for i in range(5_000)
        ]

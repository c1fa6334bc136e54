"""Fractional position keys: text keys that sort under SQLite's BINARY collation.

The format is the one of rocicorp's ``fractional-indexing`` (base-62 digits, an
integer part whose head letter encodes its length, then an optional fraction
with no trailing zero), so JavaScript clients can generate and read the same keys.

Pure functions, no I/O. Every function is iterative: a long key never meets the
recursion limit.

>>> key_between(None, None)
'a0'
>>> key_between('a0', None)
'a1'
>>> key_between('a0', 'a1')
'a0V'
>>> keys_between('a0', 'a1', 3)
['a0G', 'a0V', 'a0l']
"""

from __future__ import annotations

from .errors import InvalidPositionKey

__all__ = ["is_valid_key", "key_between", "keys_between", "validate_key"]

DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BASE = len(DIGITS)
_DIGIT_VALUE = {c: i for i, c in enumerate(DIGITS)}
_SMALLEST_INTEGER = "A" + "0" * 26


def _midpoint(a: str, b: str | None) -> str:
    """A fraction strictly between fractions ``a`` and ``b`` (``None``: no upper bound).

    Both are digit strings without trailing zeros and ``a < b``.
    """
    prefix = ""
    while True:
        if b is not None:
            # Skip the common prefix; a missing digit of `a` reads as zero.
            n = 0
            while n < len(b) and (a[n] if n < len(a) else "0") == b[n]:
                n += 1
            if n:
                prefix += b[:n]
                a, b = a[n:], b[n:]
        digit_a = _DIGIT_VALUE[a[0]] if a else 0
        digit_b = _DIGIT_VALUE[b[0]] if b else _BASE
        if digit_b - digit_a > 1:
            # Round half up, as the JavaScript original does.
            return prefix + DIGITS[(digit_a + digit_b + 1) // 2]
        if b is not None and len(b) > 1:
            return prefix + b[0]
        # The first digits are adjacent: keep a's digit and look past it.
        prefix += DIGITS[digit_a]
        a, b = a[1:], None


def _integer_length(head: str) -> int:
    if "a" <= head <= "z":
        return ord(head) - ord("a") + 2
    if "A" <= head <= "Z":
        return ord("Z") - ord(head) + 2
    raise InvalidPositionKey(f"invalid order key head: {head!r}")


def _integer_part(key: str) -> str:
    length = _integer_length(key[0])
    if length > len(key):
        raise InvalidPositionKey(f"invalid order key: {key!r}")
    return key[:length]


def validate_key(key: str) -> None:
    """Raise :class:`InvalidPositionKey` unless ``key`` is a well-formed order key."""
    if not isinstance(key, str) or not key:
        raise InvalidPositionKey(f"invalid order key: {key!r}")
    if key == _SMALLEST_INTEGER:
        raise InvalidPositionKey(f"invalid order key: {key!r}")
    if any(c not in _DIGIT_VALUE for c in key):
        raise InvalidPositionKey(f"invalid order key: {key!r}")
    integer = _integer_part(key)
    if key[len(integer) :].endswith("0"):
        raise InvalidPositionKey(f"invalid order key: {key!r}")


def is_valid_key(key: object) -> bool:
    """True when ``key`` is a well-formed order key."""
    try:
        validate_key(key)  # type: ignore[arg-type]
    except InvalidPositionKey:
        return False
    return True


def _increment_integer(x: str) -> str | None:
    head, digits = x[0], list(x[1:])
    i = len(digits) - 1
    while i >= 0:
        value = _DIGIT_VALUE[digits[i]] + 1
        if value < _BASE:
            digits[i] = DIGITS[value]
            return head + "".join(digits)
        digits[i] = "0"
        i -= 1
    # Every digit carried: the integer part grows by one digit.
    if head == "Z":
        return "a0"
    if head == "z":
        return None
    new_head = chr(ord(head) + 1)
    if new_head > "a":
        digits.append("0")
    else:
        digits.pop()
    return new_head + "".join(digits)


def _decrement_integer(x: str) -> str | None:
    head, digits = x[0], list(x[1:])
    i = len(digits) - 1
    while i >= 0:
        value = _DIGIT_VALUE[digits[i]] - 1
        if value >= 0:
            digits[i] = DIGITS[value]
            return head + "".join(digits)
        digits[i] = DIGITS[-1]
        i -= 1
    if head == "a":
        return "Z" + DIGITS[-1]
    if head == "A":
        return None
    new_head = chr(ord(head) - 1)
    if new_head < "Z":
        digits.append(DIGITS[-1])
    else:
        digits.pop()
    return new_head + "".join(digits)


def _check_bounds(a: str | None, b: str | None) -> None:
    if a is not None:
        validate_key(a)
    if b is not None:
        validate_key(b)
    if a is not None and b is not None and a >= b:
        raise InvalidPositionKey(f"{a!r} is not less than {b!r}")


def key_between(a: str | None, b: str | None) -> str:
    """Return a key that sorts strictly between ``a`` and ``b``.

    ``None`` for ``a`` means "before everything", for ``b`` "after everything".

    Raises:
        InvalidPositionKey: a key is malformed, or ``a >= b``.
    """
    if (
        b is None
        and a
        and "a" <= a[0] <= "z"
        and len(a) == ord(a[0]) - 95  # an integer key, no fraction: 'a7', 'b0Z', ...
        and a[-1] != "z"
        and a.isascii()
        and a.isalnum()  # the base-62 alphabet
    ):
        # The append fast path: the next integer only bumps the last digit.
        return a[:-1] + DIGITS[_DIGIT_VALUE[a[-1]] + 1]
    _check_bounds(a, b)
    if a is None:
        if b is None:
            return "a0"
        integer_b = _integer_part(b)
        fraction_b = b[len(integer_b) :]
        if integer_b == _SMALLEST_INTEGER:
            return integer_b + _midpoint("", fraction_b)
        if integer_b < b:
            return integer_b
        decremented = _decrement_integer(integer_b)
        if decremented is None:
            raise InvalidPositionKey("cannot decrement any more")
        return decremented
    integer_a = _integer_part(a)
    fraction_a = a[len(integer_a) :]
    if b is None:
        incremented = _increment_integer(integer_a)
        return integer_a + _midpoint(fraction_a, None) if incremented is None else incremented
    integer_b = _integer_part(b)
    fraction_b = b[len(integer_b) :]
    if integer_a == integer_b:
        return integer_a + _midpoint(fraction_a, fraction_b)
    incremented = _increment_integer(integer_a)
    if incremented is None:
        raise InvalidPositionKey("cannot increment any more")
    if incremented < b:
        return incremented
    return integer_a + _midpoint(fraction_a, None)


def keys_between(a: str | None, b: str | None, n: int) -> list[str]:
    """Return ``n`` distinct keys in ascending order, all strictly between ``a`` and ``b``.

    Between two bounds the keys are placed by bisection (balanced), so the longest
    grows with log(n); toward an open end they are consecutive, as appends are.

    Raises:
        InvalidPositionKey: a key is malformed, ``a >= b``, or ``n`` is negative.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise InvalidPositionKey(f"n must be a non-negative integer, got {n!r}")
    if n == 0:
        _check_bounds(a, b)
        return []
    if b is None:
        keys = [key_between(a, None)]
        for _ in range(n - 1):
            keys.append(key_between(keys[-1], None))
        return keys
    if a is None:
        keys = [key_between(None, b)]
        for _ in range(n - 1):
            keys.append(key_between(None, keys[-1]))
        keys.reverse()
        return keys
    # Bisection with an explicit work list: slot i of `keys` is filled by the
    # midpoint of its nearest filled neighbours.
    result: list[str | None] = [None] * n
    work = [(a, b, 0, n)]  # (low key, high key, first slot, slot count)
    while work:
        low, high, first, count = work.pop()
        if count == 0:
            continue
        middle = first + count // 2
        key = key_between(low, high)
        result[middle] = key
        work.append((low, key, first, middle - first))
        work.append((key, high, middle + 1, first + count - middle - 1))
    return [key for key in result if key is not None]

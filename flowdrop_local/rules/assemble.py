"""MEM-4: assembling message inputs concatenates them in declared order.

Python's argument order is the declared port order. An input that carries no
value (``None``, an empty list, the empty object MEM-16 emits for empty text)
adds nothing at all: no placeholder takes its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidMessage


def assemble(*inputs: object) -> list[dict[str, Any]]:
    """Flatten ``inputs`` into one message list, in the order given.

    A list (or tuple) adds its messages in order, a single message (a mapping)
    adds itself, and ``None``, ``[]`` or ``{}`` adds nothing. An empty mapping
    inside a list is MEM-16's "no message" too and adds nothing. Messages are
    passed on as they are (normalising them is MEM-5's job).

    Raises:
        InvalidMessage: an input, or an item of a list input, is not a message;
            ``index`` is the input's position and ``field`` names the item.
    """
    assembled: list[dict[str, Any]] = []
    for index, value in enumerate(inputs):
        if value is None:
            continue
        if isinstance(value, Mapping):
            if value:
                assembled.append(dict(value))
            continue
        if not isinstance(value, list | tuple):
            raise InvalidMessage(
                index,
                "input",
                f"expected a message or a list of messages, not {type(value).__name__}",
            )
        for position, item in enumerate(value):
            if not isinstance(item, Mapping):
                raise InvalidMessage(
                    index, f"input[{position}]", f"expected a message, not {type(item).__name__}"
                )
            if item:
                assembled.append(dict(item))
    return assembled

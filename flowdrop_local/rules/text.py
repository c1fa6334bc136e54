"""MEM-16: text becomes one message under three closed rules.

The message is emitted twice, as MEM-16 asks: as a one-element list (the
message-typed output) and as the same row (the object-typed output). It is
written in the flat shape of the spec's examples, ``{"role", "content"}`` plus
``tool_call_id`` on a ``tool`` row, which ``Buffer.append`` and
:func:`~.normalize.normalize` both accept.
"""

from __future__ import annotations

from typing import Any

from .incoming import ROLES
from .normalize import coerce_content, is_empty_content


def text_to_message(
    text: object, role: object = None, tool_call_id: object = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Turn ``text`` and ``role`` into ``([message], message)``.

    * ``role`` outside ``user``, ``assistant``, ``system``, ``tool`` (compared
      exactly; ``None`` included) becomes ``user``: a role a provider would
      reject never leaves.
    * ``tool_call_id`` is kept on a ``tool`` row only, trimmed, and omitted when
      it is not a non-blank string: elsewhere it would claim a pairing that is
      not real.
    * Content is coerced as MEM-5 coerces it
      (:func:`~.normalize.coerce_content`). Empty content (``""``, blank text,
      ``[]``) gives ``([], {})``, a ``tool`` row included: answering an
      unanswered call is tool-pairing repair's job, not this one's.
    """
    content = coerce_content(text)
    if is_empty_content(content):
        return [], {}
    resolved = role if isinstance(role, str) and role in ROLES else "user"
    message: dict[str, Any] = {"role": resolved, "content": content}
    if resolved == "tool" and isinstance(tool_call_id, str) and tool_call_id.strip():
        message["tool_call_id"] = tool_call_id.strip()
    return [message], dict(message)

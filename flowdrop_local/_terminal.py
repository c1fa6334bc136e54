"""Make stored text safe to print on a terminal.

Stored content is untrusted: a message holding ``ESC]0;...BEL`` would retitle the
window, ``ESC[2J`` would clear the screen, ``\\r`` would overwrite what was
printed before it, and a right-to-left override would disguise what follows it.
Human-readable output (``show``, ``check``, error lines) passes every stored or
user-given string through :func:`visible`, which prints such characters as
escapes (``\\x1b``, ``\\u202e``) instead of sending them to the terminal. JSON
output needs no escaping: ``json.dumps`` already writes control characters as
``\\u00XX`` (only the bidi and line-separator characters pass through as text).
"""

from __future__ import annotations

import re
from typing import Final

# C0 controls, DEL and C1 controls (0x9b is a one-byte CSI on some terminals),
# then the Unicode line/paragraph separators and the bidi embeddings, overrides
# and isolates, which reorder what is displayed.
_UNSAFE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_LINES: Final = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every terminal control character written as an escape.

    ``keep_newlines`` keeps ``\\n`` and ``\\t`` as they are (a message's own
    line breaks); otherwise the result is one line, as an error or report line
    must be. A lone surrogate (an undecodable byte in an argument) is shown as
    ``\\udcff`` rather than failing the print.
    """
    pattern = _UNSAFE_KEEP_LINES if keep_newlines else _UNSAFE
    escaped = pattern.sub(_escape, text)
    if not escaped.isascii():
        try:
            escaped.encode("utf-8")
        except UnicodeEncodeError:
            escaped = escaped.encode("utf-8", "backslashreplace").decode("utf-8")
    return escaped

"""Stored text printed for a person: terminal controls come out as visible escapes."""

from __future__ import annotations

import pytest

from flowdrop_local._terminal import visible


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, café, 日本", "plain text, café, 日本"),  # printable text is kept
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # OSC: would retitle the window
        ("\x1b[2J", "\\x1b[2J"),  # CSI: would clear the screen
        ("\x9b2J", "\\x9b2J"),  # one-byte CSI (C1)
        ("over\rwrite", "over\\x0dwrite"),  # carriage return: would overwrite the line
        ("a\x00b\x7f", "a\\x00b\\x7f"),  # NUL, DEL
        ("\u202eevil\u2066", "\\u202eevil\\u2066"),  # bidi override and isolate
        ("line\u2028sep", "line\\u2028sep"),  # Unicode line separator
        ("two\nlines\tand tab", "two\\x0alines\\x09and tab"),  # one line unless asked
        ("\udcff", "\\udcff"),  # a lone surrogate (undecodable argv byte) cannot fail the print
    ],
)
def test_visible_escapes_controls(text: str, shown: str) -> None:
    """Each control character is written as an escape; everything else is left alone."""
    assert visible(text) == shown


def test_keep_newlines_keeps_line_breaks_and_tabs_only() -> None:
    """A message's own line breaks stay for show; a carriage return still does not."""
    assert visible("a\nb\tc\r\x1b", keep_newlines=True) == "a\nb\tc\\x0d\\x1b"

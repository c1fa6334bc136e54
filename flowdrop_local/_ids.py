"""Message ids: UUID text in the API, 16 bytes where SQLite stores them (schema version 3)."""

from __future__ import annotations


def id_blob(text: object) -> bytes | None:
    """A message id's stored form (16 bytes) from its text; None when it is not a UUID."""
    if (
        isinstance(text, str)
        and len(text) == 36
        and text[8] == text[13] == text[18] == text[23] == "-"
    ):
        try:
            value = bytes.fromhex(text.replace("-", ""))
        except ValueError:
            return None
        if len(value) == 16:
            return value
    return None


def id_text(value: object) -> str | None:
    """A stored message id's text form (lower-case, hyphenated)."""
    if not isinstance(value, bytes) or len(value) != 16:
        return None
    h = value.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

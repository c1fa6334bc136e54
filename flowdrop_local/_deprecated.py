"""The one way a renamed public name says so: a ``DeprecationWarning`` pointing at the
caller, for the one release the old name is kept (the renames are in CHANGELOG.md)."""

from __future__ import annotations

import warnings


def renamed(what: str, *, stacklevel: int = 3) -> None:
    """Warn that ``what`` (for example ``"Buffer.db is now Buffer.backend"``) is an
    old name; ``stacklevel`` 3 names the caller of the function that calls this."""
    warnings.warn(
        f"{what}; this alias goes in the next release", DeprecationWarning, stacklevel=stacklevel
    )

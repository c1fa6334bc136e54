"""The library's exceptions: one root, subclassed only for real distinctions.

Each error also inherits the built-in exception it resembles, so an existing
``except ValueError`` (or ``LookupError``, ``RuntimeError``) still catches it.
"""

from __future__ import annotations


class FlowdropError(Exception):
    """Root of every error flowdrop_local raises on purpose."""


class InvalidMessage(FlowdropError, ValueError):
    """An incoming message is malformed; nothing of its append was written.

    ``index`` is the message's place in the batch (0 for a single message) and
    ``field`` the offending field, dotted (``metadata.tool_calls[1].id``).
    """

    def __init__(self, index: int, field: str, problem: str) -> None:
        self.index = index
        self.field = field
        self.problem = problem
        super().__init__(f"message {index}: {field}: {problem}")


class InvalidPositionKey(FlowdropError, ValueError):
    """A fractional position key is malformed, or the bounds are out of order."""


class InvalidAddress(FlowdropError, ValueError):
    """A buffer address (scope, scope_id, key) is not three usable strings."""


class StoreClosed(FlowdropError, RuntimeError):
    """The store was closed, or was inherited across ``os.fork()``."""


class NotADatabase(FlowdropError, ValueError):
    """The file is not an SQLite database, or it is truncated or corrupt."""


class NotAFlowdropDatabase(FlowdropError, ValueError):
    """The file is an SQLite database written by something other than flowdrop_local."""


class SchemaTooNew(FlowdropError, RuntimeError):
    """The file was written by a newer flowdrop_local; upgrade the library to open it."""


class ReadOnlyStore(FlowdropError, PermissionError):
    """A write was asked of a store whose file or folder is read-only."""


class MessageNotFound(FlowdropError, LookupError):
    """No message with that id in this buffer."""

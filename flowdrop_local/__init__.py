"""flowdrop_local: a local SQLite store that keeps LLM conversation buffers sendable.

See README.md for the rules it keeps (FlowDrop GR-MEM) and the API.
"""

from .buffer import Buffer
from .errors import (
    FlowdropError,
    InvalidAddress,
    InvalidMessage,
    InvalidPositionKey,
    NotADatabase,
    NotAFlowdropDatabase,
    ReadOnlyStore,
    SchemaTooNew,
    StoreClosed,
)
from .model import AppendResult, BufferRef, Message, ToolCall
from .positions import key_between, keys_between
from .rules.pairing import PLACEHOLDER_CONTENT, call_id_of
from .store import Store

__all__ = [
    "PLACEHOLDER_CONTENT",
    "AppendResult",
    "Buffer",
    "BufferRef",
    "FlowdropError",
    "InvalidAddress",
    "InvalidMessage",
    "InvalidPositionKey",
    "Message",
    "NotADatabase",
    "NotAFlowdropDatabase",
    "ReadOnlyStore",
    "SchemaTooNew",
    "Store",
    "StoreClosed",
    "ToolCall",
    "call_id_of",
    "key_between",
    "keys_between",
]

"""flowdrop_local: a local-first store (SQLite or PostgreSQL) that keeps LLM
conversation histories sendable.

The docs (``docs/``: the API, the rules it keeps, FlowDrop GR-MEM, and their
standing) say how to use it; this module re-exports what an application calls.
"""

import importlib
from typing import Any

from ._deprecated import renamed
from .access import (
    AccessDenied,
    AccessRequest,
    ExecutionContext,
    Principal,
    ScopeResolution,
)
from .aio import AsyncBuffer, AsyncStore
from .buffer import Buffer
from .check import Violation
from .errors import (
    BackupTargetExists,
    BufferNotEmpty,
    CorruptRow,
    DatabaseNotFound,
    FlowdropError,
    InvalidAddress,
    InvalidArgument,
    InvalidContext,
    InvalidImport,
    InvalidMessage,
    InvalidPayload,
    InvalidPositionKey,
    InvalidSession,
    InvalidValue,
    LockTimeout,
    MessageIdTaken,
    MessageNotFound,
    NotADatabase,
    NotAFlowdropDatabase,
    ReadOnlyStore,
    ReplicaConflict,
    ReplicaRetired,
    SchemaTooNew,
    SearchNotEnabled,
    ServerUnreachable,
    SessionStopped,
    SharedSchemaRefused,
    StoreClosed,
    SymlinkRefused,
    SyncIdConflict,
    SyncRefused,
    TooLarge,
    UnsafeFile,
    UnsupportedOperation,
)
from .export_import import ImportReport
from .memory import MemoryRead, MemoryWrite
from .model import AppendResult, BufferInfo, BufferRef, Message, Page, SearchHit, ToolCall
from .refused_buffer import RefusedBuffer
from .sessions import Session, Sessions, Turn
from .store import Store
from .syncing import SyncReport, sync

__all__ = [
    "AccessDenied",
    "AccessRequest",
    "AppendResult",
    "AsyncBuffer",
    "AsyncStore",
    "BackupTargetExists",
    "Buffer",
    "BufferInfo",
    "BufferNotEmpty",
    "BufferRef",
    "CorruptRow",
    "DatabaseNotFound",
    "ExecutionContext",
    "FlowdropError",
    "ImportReport",
    "InvalidAddress",
    "InvalidArgument",
    "InvalidContext",
    "InvalidImport",
    "InvalidMessage",
    "InvalidPayload",
    "InvalidPositionKey",
    "InvalidSession",
    "InvalidValue",
    "LockTimeout",
    "MemoryRead",
    "MemoryWrite",
    "Message",
    "MessageIdTaken",
    "MessageNotFound",
    "NotADatabase",
    "NotAFlowdropDatabase",
    "Page",
    "Principal",
    "ReadOnlyStore",
    "RefusedBuffer",
    "ReplicaConflict",
    "ReplicaRetired",
    "SchemaTooNew",
    "ScopeResolution",
    "SearchHit",
    "SearchNotEnabled",
    "ServerUnreachable",
    "Session",
    "SessionStopped",
    "Sessions",
    "SharedSchemaRefused",
    "Store",
    "StoreClosed",
    "SymlinkRefused",
    "SyncIdConflict",
    "SyncRefused",
    "SyncReport",
    "TooLarge",
    "ToolCall",
    "Turn",
    "UnsafeFile",
    "UnsupportedOperation",
    "Violation",
    "sync",
]


# Names the root exported before 1.x kept it to what an application calls (issue 22
# C); each now lives in its public module, and the root alias goes in the next release.
_MOVED: dict[str, str] = {
    "IDENTITY_SCOPES": "flowdrop_local.access",
    "SCOPES": "flowdrop_local.access",
    "resolve_scope": "flowdrop_local.access",
    "usable_identity": "flowdrop_local.access",
    "PLACEHOLDER_CONTENT": "flowdrop_local.rules",
    "call_id_of": "flowdrop_local.rules",
    "assemble": "flowdrop_local.rules",
    "normalize": "flowdrop_local.rules",
    "validate_pairing": "flowdrop_local.rules",
    "text_to_message": "flowdrop_local.rules",
    "key_between": "flowdrop_local.positions",
    "keys_between": "flowdrop_local.positions",
    "from_anthropic": "flowdrop_local.providers",
    "from_openai_chat": "flowdrop_local.providers",
    "to_anthropic": "flowdrop_local.providers",
    "to_openai_chat": "flowdrop_local.providers",
    "to_openai_responses": "flowdrop_local.providers",
    "validate_anthropic": "flowdrop_local.providers",
    "validate_openai_chat": "flowdrop_local.providers",
    "validate_openai_responses": "flowdrop_local.providers",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'flowdrop_local' has no attribute {name!r}")
    renamed(f"flowdrop_local.{name} moved to {module}.{name}")
    return getattr(importlib.import_module(module), name)

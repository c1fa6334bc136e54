"""flowdrop_local: a local SQLite store that keeps LLM conversation buffers sendable.

See README.md for the rules it keeps (FlowDrop GR-MEM) and the API.
"""

from .access import (
    IDENTITY_SCOPES,
    SCOPES,
    AccessDenied,
    AccessRequest,
    ExecutionContext,
    Principal,
    ScopeResolution,
    resolve_scope,
    usable_identity,
)
from .aio import AsyncBuffer, AsyncStore
from .buffer import Buffer
from .check import Violation
from .errors import (
    BackupTargetExists,
    BufferNotEmpty,
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
    MessageIdTaken,
    MessageNotFound,
    NotADatabase,
    NotAFlowdropDatabase,
    ReadOnlyStore,
    ReplicaConflict,
    ReplicaRetired,
    SchemaTooNew,
    SearchNotEnabled,
    SessionStopped,
    StoreClosed,
    SymlinkRefused,
    SyncIdConflict,
    SyncRefused,
    UnsupportedOperation,
)
from .memory import MemoryRead, MemoryWrite
from .model import AppendResult, BufferInfo, BufferRef, Message, Page, SearchHit, ToolCall
from .portability import ImportReport
from .positions import key_between, keys_between
from .providers import (
    from_anthropic,
    from_openai_chat,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
    validate_anthropic,
    validate_openai_chat,
    validate_openai_responses,
)
from .refused import RefusedBuffer
from .rules.assemble import assemble
from .rules.normalize import normalize, validate_pairing
from .rules.pairing import PLACEHOLDER_CONTENT, call_id_of
from .rules.text import text_to_message
from .sessions import Session, Sessions, Turn
from .store import Store
from .syncing import SyncReport, sync

__all__ = [
    "IDENTITY_SCOPES",
    "PLACEHOLDER_CONTENT",
    "SCOPES",
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
    "Session",
    "SessionStopped",
    "Sessions",
    "Store",
    "StoreClosed",
    "SymlinkRefused",
    "SyncIdConflict",
    "SyncRefused",
    "SyncReport",
    "ToolCall",
    "Turn",
    "UnsupportedOperation",
    "Violation",
    "assemble",
    "call_id_of",
    "from_anthropic",
    "from_openai_chat",
    "key_between",
    "keys_between",
    "normalize",
    "resolve_scope",
    "sync",
    "text_to_message",
    "to_anthropic",
    "to_openai_chat",
    "to_openai_responses",
    "usable_identity",
    "validate_anthropic",
    "validate_openai_chat",
    "validate_openai_responses",
    "validate_pairing",
]

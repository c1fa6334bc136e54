"""Provider payloads from stored messages, and back: OpenAI Chat, OpenAI Responses, Anthropic.

Pure functions over ``Buffer.read()`` dicts; ``Buffer.to_openai_chat()`` and its
siblings read a buffer and call them. Every export is windowed to whole turns,
normalised (MEM-5) and then mapped, so it passes the format's validator.
"""

from ._common import UNNAMED_TOOL, read_window, window
from .anthropic import OPENING_USER_TEXT, from_anthropic, to_anthropic, validate_anthropic
from .openai_chat import from_openai_chat, to_openai_chat, validate_openai_chat
from .openai_responses import (
    item_to_message,
    message_to_items,
    to_openai_responses,
    validate_openai_responses,
)

__all__ = [
    "OPENING_USER_TEXT",
    "UNNAMED_TOOL",
    "from_anthropic",
    "from_openai_chat",
    "item_to_message",
    "message_to_items",
    "read_window",
    "to_anthropic",
    "to_openai_chat",
    "to_openai_responses",
    "validate_anthropic",
    "validate_openai_chat",
    "validate_openai_responses",
    "window",
]

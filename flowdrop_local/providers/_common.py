"""What every exporter shares: the window, MEM-5, and content parts.

An export runs in two steps over ``Buffer.read()`` dicts (pure, no I/O):

1. :func:`last_turns`: the last ``limit`` messages, widened to whole turns (a
   buffer reads only that window: :func:`read_last_turns`);
2. MEM-5 :func:`~flowdrop_local.rules.normalize.normalize`: system messages
   first, results right after their turn (a result stored *before* its call, which
   the store's MEM-3 ledger counts as the answer, included), a placeholder for
   each call with no result anywhere (mid-loop history stays sendable), orphans
   and duplicates dropped.

Then each format maps the messages; content parts are mapped part by part, never
flattened to text: a part the target format has no place for becomes a short
text saying what was left out (:func:`omitted`), never a part the provider
would refuse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Final

from ..errors import InvalidArgument, shown
from ..model import ToolCall
from ..rules.normalize import MessageDict, is_empty_content, normalize
from ..rules.pairing import call_id_of, is_usable_call_id

# A declared call without a name still needs one to be sent; providers require it.
UNNAMED_TOOL: Final = "unnamed_tool"
# Metadata key under which the Agents SDK session keeps a Responses item verbatim.
RESPONSES_ITEM: Final = "responses_item"
RESPONSES_MESSAGE_TYPES: Final = frozenset({"message", "function_call", "function_call_output"})
TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})
IMAGE_PARTS: Final = frozenset({"image_url", "input_image", "image"})
# Reasoning belongs to the provider that produced it (signed or encrypted): it is
# not carried into another provider's format.
REASONING_PARTS: Final = frozenset(
    {"thinking", "redacted_thinking", "reasoning", "reasoning_text", "summary_text"}
)
# Every content block type the Anthropic Messages API defines (the ``anthropic``
# package's ``ContentBlockParam`` union), and those a ``tool_result`` may hold
# (``ToolResultBlockParam.Content``).
ANTHROPIC_BLOCKS: Final = frozenset(
    {
        "text",
        "image",
        "document",
        "search_result",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
    }
)
ANTHROPIC_RESULT_BLOCKS: Final = frozenset(
    {"text", "image", "search_result", "document", "tool_reference", "browser_state"}
)
_FILE_FIELDS: Final = ("file_id", "file_data", "filename", "file_url")
_DATA_URL = re.compile(r"data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)


# ---------------------------------------------------------------- windowing


def _check_window_limit(limit: object) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InvalidArgument(f"limit must be a non-negative integer or None, got {shown(limit)}")


def _ids_of(message: MessageDict) -> list[Any]:
    """The call ids a message names: its result's, or the calls it declares."""
    metadata = message.get("metadata") or {}
    ids: list[Any] = [metadata.get("tool_call_id")] if message.get("role") == "tool" else []
    return ids + [call_id_of(c) for c in metadata.get("tool_calls") or () if isinstance(c, Mapping)]


def _window_start(messages: Sequence[MessageDict], limit: int) -> int:
    """Where the window of the last ``limit`` messages starts, widened to whole turns."""
    declared_at: dict[str, int] = {}
    answered_at: dict[str, int] = {}
    for index, message in enumerate(messages):
        metadata = message.get("metadata") or {}
        if message.get("role") == "tool":
            call_id = metadata.get("tool_call_id")
            if isinstance(call_id, str):
                answered_at.setdefault(call_id, index)
        for call in metadata.get("tool_calls") or ():
            call_id = call_id_of(call) if isinstance(call, Mapping) else None
            if is_usable_call_id(call_id):
                assert isinstance(call_id, str)
                declared_at.setdefault(call_id, index)
    start = max(len(messages) - limit, 0) if limit else len(messages)
    while limit:
        while start > 0 and messages[start].get("role") != "user":
            start -= 1
        earliest = start
        for message in messages[start:]:
            for call_id in _ids_of(message):
                if isinstance(call_id, str):
                    earliest = min(
                        earliest,
                        declared_at.get(call_id, start),
                        answered_at.get(call_id, start),
                    )
        if earliest == start:
            break
        start = earliest
    return start


def last_turns(messages: Sequence[MessageDict], limit: int | None) -> list[MessageDict]:
    """The last ``limit`` messages, widened so that the window is whole turns.

    The start moves back to the user message that opens its turn (or to the
    first message), and further back while a call in the window has a result
    before it, or a result in the window answers a call before it: a payload
    never starts with a result whose call was cut off, and never separates a call
    from its results. System messages inside the window are kept (MEM-5 moves
    them to the front), and so are the system messages that open the history (the
    system prompt), wherever the window starts; a system message between two
    turns before the window is not. ``limit=None`` is the whole list.

    Raises:
        InvalidArgument: ``limit`` is not a non-negative integer (a ``ValueError``).
    """
    if limit is None:
        return list(messages)
    _check_window_limit(limit)
    if limit == 0:
        return []
    start = _window_start(messages, limit)
    return _with_prompt(messages[: _leading_system(messages)], messages[start:], start)


def _leading_system(messages: Sequence[MessageDict]) -> int:
    """How many system messages open ``messages``."""
    count = 0
    for message in messages:
        if message.get("role") != "system":
            break
        count += 1
    return count


def _with_prompt(
    prompt: Sequence[MessageDict], rest: Sequence[MessageDict], start: int
) -> list[MessageDict]:
    """The opening system messages, then the window (which starts at ``start``)."""
    if start <= len(prompt):  # the window reaches back into them already
        return list(prompt[:start]) + list(rest)
    return list(prompt) + list(rest)


def _settled(chunk: Sequence[MessageDict], start: int) -> bool:
    """True when nothing in ``chunk[start:]`` pairs with a message before ``chunk``.

    A call followed by a user turn was healed, so its result is stored somewhere;
    if not in ``chunk``, it is before it. A result whose call ``chunk`` does not
    declare may answer a call before it.
    """
    declared: set[Any] = set()
    answered: set[Any] = set()
    for message in chunk:
        if message.get("role") == "tool":
            answered.update(_ids_of(message))
        else:
            declared.update(_ids_of(message))
    user_after = False
    for message in reversed(chunk[start:]):
        role = message.get("role")
        if role == "user":
            user_after = True
        elif role == "tool":
            if not declared.issuperset(_ids_of(message)):
                return False
        elif user_after and not answered.issuperset(
            i for i in _ids_of(message) if is_usable_call_id(i)
        ):
            return False
    return True


def read_last_turns(
    read: Callable[[int | None], list[MessageDict]],
    limit: int | None,
    head: Callable[[int], list[MessageDict]] | None = None,
) -> list[MessageDict]:
    """The window of ``limit`` messages (:func:`last_turns`), reading only what it needs.

    ``read(n)`` returns the last ``n`` messages (``Buffer.read``). The read
    starts at ``limit`` messages and doubles until the window starts at a user
    turn inside what was read and pairs nothing before it, or the whole buffer
    was read: the cost follows the window, not the buffer. ``head(n)`` returns
    the first ``n`` messages: the system messages that open the history are read
    through it and kept, as :func:`last_turns` keeps them. ``limit=None`` reads
    everything.

    Raises:
        InvalidArgument: ``limit`` is not a non-negative integer (a ``ValueError``).
    """
    reads = last_turns_reads(limit, with_head=head is not None)
    answer: Any = None  # nothing is sent to start the plan
    try:
        while True:
            kind, n = reads.send(answer)
            answer = read(n) if kind == "read" or head is None else head(n or 0)
    except StopIteration as done:
        result: list[MessageDict] = done.value
        return result


def last_turns_reads(
    limit: int | None, *, with_head: bool
) -> Generator[tuple[str, int | None], list[MessageDict], list[MessageDict]]:
    """:func:`read_last_turns` as a plan: it yields ``("read", n)`` (the last ``n``) and
    ``("head", n)`` (the first ``n``), is sent the messages, and returns the window.

    The async buffer drives the same plan with awaited reads.
    """
    if limit is None:
        return (yield "read", None)
    _check_window_limit(limit)
    if limit == 0:
        return []
    size = limit
    while True:
        chunk = yield "read", size
        start = _window_start(chunk, limit)
        if len(chunk) < size:  # the whole history
            return last_turns(chunk, limit)
        if start > 0 and _settled(chunk, start):
            break
        size *= 2
    if not with_head:
        return chunk[start:]
    n = 4
    while True:  # the opening system messages, however many there are
        first = yield "head", n
        prompt = first[: _leading_system(first)]
        if len(prompt) < n or len(first) < n:
            break
        n *= 2
    return prompt + chunk[start:]


def prepare(messages: Sequence[MessageDict], limit: int | None = None) -> list[MessageDict]:
    """Window and normalise (MEM-5): the sendable flat history."""
    return normalize(last_turns(messages, limit))[0]


# ------------------------------------------------------------ reading messages


def responses_item(message: MessageDict) -> dict[str, Any] | None:
    """The Responses item the Agents SDK session stored for this message, if any."""
    item = message["metadata"].get(RESPONSES_ITEM)
    return item if isinstance(item, dict) else None


def is_opaque(message: MessageDict) -> bool:
    """True for an assistant entry that is only a stored Responses item with no chat meaning.

    Reasoning or a hosted tool call, with no content and no calls of its own: only
    the Responses export carries it; the others skip it. A message that declares
    calls, answers one or holds content is never skipped, whatever its metadata.
    """
    item = responses_item(message)
    return (
        item is not None
        and item.get("type", "message") not in RESPONSES_MESSAGE_TYPES
        and message["role"] == "assistant"
        and not message["metadata"].get("tool_calls")
        and is_empty_content(message["content"])
    )


def tool_calls(message: MessageDict) -> list[ToolCall]:
    """The calls an assistant turn declares, read through either id spelling (MEM-11)."""
    calls = message["metadata"].get("tool_calls") or ()
    return [ToolCall.from_declaration(c) for c in calls if isinstance(c, Mapping)]


def call_name(call: ToolCall) -> str:
    """The call's name, or :data:`UNNAMED_TOOL` when the stored call has none."""
    return call.name if call.name and call.name.strip() else UNNAMED_TOOL


def arguments_text(arguments: object) -> str:
    """Arguments as the JSON text OpenAI sends: kept if text, ``{}`` if absent."""
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return "{}"
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError):
        return "{}"


def arguments_object(arguments: object) -> dict[str, Any]:
    """Arguments as the JSON object Anthropic's ``tool_use.input`` needs.

    An object is kept; JSON text of an object is parsed; absent is ``{}``; any
    other value is kept under ``"arguments"`` rather than lost.
    """
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {"arguments": arguments}
        return parsed if isinstance(parsed, dict) else {"arguments": parsed}
    return {"arguments": arguments}


# --------------------------------------------------------------- content parts


def part_text(part: Mapping[str, Any]) -> str | None:
    """The text of a text-like part (``text``, ``input_text``, ``output_text``)."""
    text = part.get("text")
    return text if part.get("type") in TEXT_PARTS and isinstance(text, str) else None


def part_image_url(part: Mapping[str, Any]) -> str | None:
    """The URL (or ``data:`` URL) of an image part in any of the three formats."""
    kind = part.get("type")
    if kind == "image_url":
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, Mapping) else value
        return url if isinstance(url, str) else None
    if kind == "input_image":
        url = part.get("image_url")
        return url if isinstance(url, str) else None
    if kind == "image":
        source = part.get("source")
        if isinstance(source, Mapping):
            if source.get("type") == "base64":
                media, data = source.get("media_type"), source.get("data")
                if isinstance(media, str) and isinstance(data, str):
                    return f"data:{media};base64,{data}"
            elif source.get("type") == "url" and isinstance(source.get("url"), str):
                return str(source["url"])
    return None


def data_url(url: str) -> tuple[str, str] | None:
    """The media type and base64 data of a ``data:`` URL, or ``None``."""
    match = _DATA_URL.fullmatch(url)
    return (match["media"], match["data"]) if match else None


def anthropic_image_source(url: str) -> dict[str, Any]:
    """An Anthropic image ``source`` for a URL or a base64 ``data:`` URL."""
    parsed = data_url(url)
    if parsed:
        return {"type": "base64", "media_type": parsed[0], "data": parsed[1]}
    return {"type": "url", "url": url}


def part_image_file_id(part: Mapping[str, Any]) -> str | None:
    """The OpenAI file id of a Responses ``input_image`` given by ``file_id``."""
    file_id = part.get("file_id")
    return file_id if part.get("type") == "input_image" and isinstance(file_id, str) else None


def part_file(part: Mapping[str, Any]) -> dict[str, str] | None:
    """An OpenAI file reference (``file_id``, ``file_data`` + ``filename``, or ``file_url``).

    Read from a Chat ``file`` part, a Responses ``input_file`` part, or an
    Anthropic ``document`` with a base64 or URL source; ``None`` for anything else
    (an Anthropic file id is not an OpenAI one).
    """
    kind = part.get("type")
    if kind in ("file", "input_file"):
        source = part.get("file") if kind == "file" else part
        if not isinstance(source, Mapping):
            return None
        found = {k: source[k] for k in _FILE_FIELDS if isinstance(source.get(k), str)}
        if kind == "file":
            found.pop("file_url", None)  # Chat takes no file URL
        return found if found.keys() & {"file_id", "file_data", "file_url"} else None
    if kind == "document":
        source = part.get("source")
        if not isinstance(source, Mapping):
            return None
        title = part.get("title")
        filename = title if isinstance(title, str) and title.strip() else "document.pdf"
        media, data = source.get("media_type"), source.get("data")
        if source.get("type") == "base64" and isinstance(media, str) and isinstance(data, str):
            return {"file_data": f"data:{media};base64,{data}", "filename": filename}
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return {"file_url": source["url"]}
    return None


def document_text(part: Mapping[str, Any]) -> str | None:
    """The text of an Anthropic ``document`` whose source is plain text."""
    source = part.get("source")
    if part.get("type") == "document" and isinstance(source, Mapping):
        data = source.get("data")
        if source.get("type") == "text" and isinstance(data, str):
            return data
    return None


def refusal_text(part: Mapping[str, Any]) -> str | None:
    """The text of an OpenAI ``refusal`` part."""
    refusal = part.get("refusal")
    return refusal if part.get("type") == "refusal" and isinstance(refusal, str) else None


def omitted(part: Mapping[str, Any]) -> str:
    """The text that stands in for a part the target format cannot carry: says what was dropped."""
    kind = str(part.get("type"))
    return f"[{kind[:40]} omitted]"

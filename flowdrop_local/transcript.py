"""The transcript model: what a person sees of stored messages, as plain JSON data.

One function, :func:`transcript`, turns :class:`~flowdrop_local.model.Message`
records into entries; the web page (``static/app.js``) and
``Buffer._repr_html_`` (:func:`transcript_html`) both draw these entries, so the
rules live here once:

* each entry is one stored message in position order: its role, its content as
  parts (text, an image, a link, or another part shown as JSON);
* an assistant turn's tool calls carry their arguments and, when the result is
  among the given messages, that result: a result is drawn next to its call, not
  again on its own; a result whose call is not among them stays an entry that
  says which call it answers;
* a placeholder that healing inserted (MEM-3) is marked ``interrupted``; one that
  a late result replaced (MEM-10) is simply that result, as the buffer holds it;
* an image is shown only from a ``data:`` URL: an image that points to a remote
  URL becomes a link part (its text), never fetched, since fetching it would tell
  that server the conversation was opened.

Everything stored is data, never markup: the page sets ``textContent`` and
:func:`transcript_html` escapes with :func:`html.escape`.

Pure functions of messages, as the provider formats are: the handles
(``Buffer._repr_html_``) and the faces (the viewer, the CLI's ``show``) draw with
them, so this module sits below both.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from .model import Message, ToolCall
from .providers._common import IMAGE_PARTS, RESPONSES_ITEM, TEXT_PARTS, part_image_url

_TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text", "summary_text"})


def _part_text(part: object) -> str:
    if not isinstance(part, dict):
        return f"[{type(part).__name__}]"
    kind = part.get("type")
    text = part.get("text")
    if kind in _TEXT_PARTS and isinstance(text, str):
        return text
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return f"[refusal] {part['refusal']}"
    return f"[{kind}]"


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_part_text(part) for part in content)
    return json.dumps(content, ensure_ascii=False)


def message_text(message: dict[str, Any]) -> str:
    """A stored message's content as a person reads it (parts as text, items named).

    An opaque Responses item (reasoning, a hosted tool call), as the Agents SDK
    session stores them, has no content: it is shown as ``[its type]`` and, for
    reasoning, its summary.
    """
    text = _content_text(message["content"])
    item = message["metadata"].get(RESPONSES_ITEM)
    if text or not isinstance(item, dict):
        return text
    kind = item.get("type")
    if kind in (None, "message", "function_call", "function_call_output"):
        return text
    summary = item.get("summary")
    if isinstance(summary, list) and summary:
        return f"[{kind}] " + _content_text(summary)
    return f"[{kind}]"


class _History(Protocol):
    """What :func:`buffer_html` reads of a buffer (a ``Buffer``; no import of it here,
    since ``Buffer._repr_html_`` imports this module)."""

    @property
    def address(self) -> tuple[str, str, str]: ...
    def messages(self, limit: int | None = None) -> list[Message]: ...
    def __len__(self) -> int: ...


__all__ = ["Entry", "Part", "buffer_html", "transcript", "transcript_html"]

Part = dict[str, Any]
Entry = dict[str, Any]

# Images a browser draws without running anything (an SVG in an <img> runs no script).
_SHOWN_IMAGE: Final = "data:image/"
INTERRUPTED: Final = "interrupted"


def _parts(content: str | list[Any]) -> list[Part]:
    """Content as display parts: ``text``, ``image`` (a data: URL), ``link``, ``json``."""
    if isinstance(content, str):
        return [{"kind": "text", "text": content}] if content else []
    parts: list[Part] = []
    for part in content:
        if not isinstance(part, Mapping):
            parts.append({"kind": "json", "type": type(part).__name__, "text": _json(part)})
            continue
        kind = part.get("type")
        text = part.get("text")
        if kind in TEXT_PARTS | {"summary_text"} and isinstance(text, str):
            parts.append({"kind": "text", "text": text})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"kind": "text", "text": f"[refusal] {part['refusal']}"})
        elif kind in IMAGE_PARTS and (url := part_image_url(part)) is not None:
            if url.startswith(_SHOWN_IMAGE):
                parts.append({"kind": "image", "src": url})
            else:
                parts.append({"kind": "link", "text": url, "label": "image"})
        else:
            parts.append({"kind": "json", "type": str(kind), "text": _json(part)})
    return parts


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=repr)


def _arguments(call: ToolCall) -> str:
    """A call's arguments as readable text: JSON pretty-printed, other text as it is."""
    arguments = call.arguments
    if isinstance(arguments, str):
        try:
            return _json(json.loads(arguments))
        except ValueError:
            return arguments
    return "" if arguments is None else _json(arguments)


def _content(message: Message) -> list[Part]:
    parts = _parts(message.content)
    if not parts and isinstance(message.metadata.get(RESPONSES_ITEM), Mapping):
        # An opaque Responses item (reasoning, a hosted tool call) has no content.
        text = message_text(message.to_dict())
        if text:
            parts = [{"kind": "text", "text": text}]
    return parts


def _result(message: Message) -> Entry:
    return {
        "id": message.id,
        "position": message.position,
        "created_at": message.created_at,
        "content": _content(message),
        "interrupted": message.healed,
    }


def transcript(messages: Sequence[Message]) -> list[Entry]:
    """The entries for ``messages`` (in position order), as JSON-ready dicts.

    Each entry: ``id``, ``position``, ``role``, ``created_at``, ``content`` (parts),
    ``calls`` (``id``, ``name``, ``arguments`` text, ``result`` or None), ``answers``
    (the call id a result shown on its own answers, else None) and ``interrupted``.
    A result is ``{id, position, created_at, content, interrupted}``.
    """
    declared = {call.id for m in messages for call in m.tool_calls if call.id}
    results: dict[str, Message] = {}
    for message in messages:
        answers = message.tool_call_id
        if message.role == "tool" and answers in declared and answers not in results:
            results[answers] = message
    shown_ids = {m.id for m in results.values()}
    entries: list[Entry] = []
    for message in messages:
        if message.id in shown_ids:
            continue
        calls = [
            {
                "id": call.id,
                "name": call.name or "",
                "arguments": _arguments(call),
                "result": _result(results[call.id]) if call.id in results else None,
            }
            for call in message.tool_calls
        ]
        entries.append(
            {
                "id": message.id,
                "position": message.position,
                "role": message.role,
                "created_at": message.created_at,
                "content": _content(message),
                "calls": calls,
                "answers": message.tool_call_id if message.role == "tool" else None,
                "interrupted": message.healed,
            }
        )
    return entries


# ------------------------------------------------------------------ HTML (notebooks)

_STYLE: Final = """<style>
.flowdrop-transcript{font-family:system-ui,sans-serif;font-size:13px;max-width:60em}
.flowdrop-transcript .fd-msg{border-left:3px solid #999;margin:6px 0;padding:2px 8px}
.flowdrop-transcript .fd-role{font-weight:600;text-transform:uppercase;font-size:11px}
.flowdrop-transcript .fd-user{border-color:#2a6fdb}
.flowdrop-transcript .fd-assistant{border-color:#2a9d55}
.flowdrop-transcript .fd-tool{border-color:#b07d00}
.flowdrop-transcript .fd-system{border-color:#777}
.flowdrop-transcript .fd-text{white-space:pre-wrap;margin:2px 0}
.flowdrop-transcript pre{white-space:pre-wrap;margin:2px 0;background:#f4f4f4;padding:4px}
.flowdrop-transcript .fd-call{display:flex;gap:8px;border:1px solid #ddd;margin:4px 0;padding:4px}
.flowdrop-transcript .fd-call>div{flex:1;min-width:0}
.flowdrop-transcript .fd-interrupted{color:#b00020;font-weight:600}
.flowdrop-transcript img{max-width:20em;max-height:20em}
</style>"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _parts_html(parts: list[Part]) -> str:
    out = []
    for part in parts:
        kind = part["kind"]
        if kind == "text":
            out.append(f'<div class="fd-text">{_e(part["text"])}</div>')
        elif kind == "image":
            out.append(f'<img class="fd-image" alt="image" src="{_e(part["src"])}">')
        elif kind == "link":
            out.append(
                f'<div class="fd-link">[{_e(part["label"])}: '
                f'<span class="fd-url">{_e(part["text"])}</span>]</div>'
            )
        else:
            out.append(f'<pre class="fd-json" title="{_e(part["type"])}">{_e(part["text"])}</pre>')
    return "".join(out)


def _mark(interrupted: bool) -> str:
    if not interrupted:
        return ""
    return f' <span class="fd-interrupted">{INTERRUPTED}</span>'


def _entry_html(entry: Entry) -> str:
    role = str(entry["role"])
    head = f'<div class="fd-role">{_e(role)}'
    if entry["answers"] is not None:
        head += f' <span class="fd-answers">answers {_e(entry["answers"])}</span>'
    head += _mark(entry["interrupted"]) + "</div>"
    calls = []
    for call in entry["calls"]:
        result = call["result"]
        if result is None:
            shown = '<div class="fd-result fd-pending">no result yet</div>'
        else:
            shown = (
                f'<div class="fd-result"><div class="fd-role">result{_mark(result["interrupted"])}'
                f"</div>{_parts_html(result['content'])}</div>"
            )
        calls.append(
            f'<div class="fd-call"><div class="fd-args"><div class="fd-role">call '
            f'<span class="fd-name">{_e(call["name"])}</span> '
            f'<span class="fd-call-id">{_e(call["id"])}</span></div>'
            f"<pre>{_e(call['arguments'])}</pre></div>{shown}</div>"
        )
    return (
        f'<div class="fd-msg fd-{_e(role)}" data-id="{_e(entry["id"])}">'
        f"{head}{_parts_html(entry['content'])}{''.join(calls)}</div>"
    )


def transcript_html(entries: list[Entry], *, title: str = "", note: str = "") -> str:
    """The entries as one self-contained HTML fragment (escaped; loads nothing remote)."""
    heading = f'<div class="fd-title"><b>{_e(title)}</b></div>' if title else ""
    footer = f'<div class="fd-note">{_e(note)}</div>' if note else ""
    body = "".join(_entry_html(entry) for entry in entries)
    return f'{_STYLE}<div class="flowdrop-transcript">{heading}{footer}{body}</div>'


NOTEBOOK_LIMIT: Final = 200


def buffer_html(buffer: _History, limit: int = NOTEBOOK_LIMIT) -> str:
    """``Buffer._repr_html_``: the buffer's last ``limit`` messages as a transcript."""
    messages = buffer.messages(limit)
    total = len(buffer)
    note = f"the last {len(messages)} of {total} messages" if total > len(messages) else ""
    title = " / ".join(buffer.address) + f" ({total} messages)"
    return transcript_html(transcript(messages), title=title, note=note)

"""The scripted model output the write-ahead tests and their child process share."""

from __future__ import annotations

from typing import Any

from agents.testing import assistant_message, function_call
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary


def first_turn() -> list[Any]:
    """Reasoning, a message and one call of ``lookup`` (call id ``call_1``)."""
    return [
        ResponseReasoningItem(
            id="rs_1", type="reasoning", summary=[Summary(type="summary_text", text="Look it up.")]
        ),
        assistant_message("Let me look."),
        function_call("lookup", {"query": "x"}, call_id="call_1", item_id="fc_1"),
    ]

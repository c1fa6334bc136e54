"""A child process for the Pydantic AI crash test: a run whose tool blocks.

    python -m tests.workers.pydantic_run DB READY MODE

MODE ``persist`` runs with ``capabilities=[Persist(buf)]``; ``bare`` saves only
after the run (which never ends). The model calls ``lookup`` once; the tool
creates the file READY and then blocks, so the parent kills this process with
SIGKILL while the tool runs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from flowdrop_local import Store
from flowdrop_local.integrations.pydantic_ai import Persist, save


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(
        parts=[TextPart("Let me look."), ToolCallPart("lookup", {"query": "x"}, tool_call_id="c1")]
    )


def main() -> None:
    path, ready, mode = sys.argv[1:4]
    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def lookup(query: str) -> str:
        """Look a word up (blocks until the process is killed)."""
        Path(ready).touch()
        time.sleep(600)
        return "never"

    with Store(path) as store:
        buf = store.buffer("session", "s1", "pydantic-ai")
        capabilities = [Persist(buf)] if mode == "persist" else []
        result = agent.run_sync("look up x", capabilities=capabilities)
        save(buf, result.new_messages())


if __name__ == "__main__":
    main()

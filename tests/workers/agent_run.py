"""A child process for the write-ahead tests: an Agents SDK run whose tool blocks.

    python -m tests.workers.agent_run DB SESSION_ID MODE READY

MODE is ``run`` (``Runner.run``), ``streamed`` (``Runner.run_streamed``), both
with ``hooks=session.hooks``, or ``bare`` (``Runner.run`` without them). The
scripted model declares one call (after a reasoning item and a message); the
tool creates the file READY and then blocks, so the parent kills this process
with SIGKILL while the tool runs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel

from flowdrop_local.integrations.openai_agents import Session
from tests.workers.agent_script import first_turn


def main() -> None:
    path, session_id, mode, ready = sys.argv[1:5]

    @function_tool
    def lookup(query: str) -> str:
        """Look a word up (blocks until the process is killed)."""
        Path(ready).touch()
        time.sleep(600)
        return "never"

    set_tracing_disabled(True)
    agent = Agent(name="a", model=ScriptedModel([first_turn()]), tools=[lookup])
    session = Session(session_id, path)

    async def go() -> None:
        if mode == "streamed":
            result = Runner.run_streamed(agent, "look up x", session=session, hooks=session.hooks)
            async for _ in result.stream_events():
                pass
        elif mode == "bare":
            await Runner.run(agent, "look up x", session=session)
        else:
            await Runner.run(agent, "look up x", session=session, hooks=session.hooks)

    asyncio.run(go())


if __name__ == "__main__":
    main()

"""Agent: a model, its tools and its middleware, immutable and reusable across sessions.

The modules of a run, re-exported here: :mod:`tinyctx.session` (Session),
:mod:`tinyctx.run_loop` (the loop and its checkpoints), :mod:`tinyctx.resume` (resume,
review, recover), :mod:`tinyctx.checkpoint` (RunResult, Checkpoint) and
:mod:`tinyctx.tool_handler` (the core tool handler).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs
from attrs import frozen

from .agent_core import AgentCore
from .checkpoint import Checkpoint, Phase, RunResult, RunStatus
from .messages import Message
from .resume import ENGINE_STATE
from .session import Session
from .synthetic import SKIPPED_ON_ABANDON, SKIPPED_ON_CANCEL, SKIPPED_ON_CRASH, SKIPPED_ON_STOP
from .tool_handler import (
    run_tool_or_error_result,
    run_tool_or_raise,
    tool_error_result,
)

__all__ = [
    "Agent",
    "Session",
    "RunResult",
    "Checkpoint",
    "RunStatus",
    "ENGINE_STATE",
    "run_tool_or_error_result",
    "run_tool_or_raise",
    "tool_error_result",
    # the other module-level names of the one-file agent module, importable as before
    "Phase",
    "SKIPPED_ON_ABANDON",
    "SKIPPED_ON_CANCEL",
    "SKIPPED_ON_CRASH",
    "SKIPPED_ON_STOP",
]


@frozen(eq=False)
class Agent(AgentCore):
    """A model, its tools and its middleware: immutable and reusable across sessions.

    Both onions are composed here, once. ``model`` is a model handler or a model by name,
    ``"<prefix>:<model>"`` (``"openai:gpt-4o"``, ``"anthropic:claude-sonnet-4-5"``; see
    :mod:`tinyctx.models_by_name`), which also sets ``model_name`` when it is not given.

    Args:
        model: The model handler (``async (request, ctx) -> ModelResponse``) or a model by
            name.
        tools: The local tools the model may call.
        middleware: The layers, outermost first; both onions are built from them.
        system_prompt: The system prompt of every request, or None.
        model_name: The model named in requests (and priced); taken from ``model`` when
            None.
        settings: Provider settings sent with every request (temperature, ...).
        server_tools: Tools the provider runs itself (web search, ...).
        name: The agent's name in events and traces.
        check_requests: Refuse a request the layers emptied or left ending in an
            assistant message the model cannot continue; False sends what they make.
    """

    def evolve(self, **changes: Any) -> Agent:
        if "model" in changes and "model_name" not in changes:
            from .models_by_name import name_of

            if self.model_name is not None and self.model_name == name_of(self.model):
                changes["model_name"] = None  # the name came with the model it replaces
        return attrs.evolve(self, **changes)

    async def run(
        self, input: str | Message | Sequence[Message], **session_options: Any
    ) -> RunResult:
        """One run in a fresh session (``async with Session(self, ...)``)."""
        async with Session(self, **session_options) as session:
            return await session.run(input)

    def run_sync(
        self,
        input: str | Message | Sequence[Message],
        *,
        backend: Literal["trio", "asyncio"] = "trio",
        **session_options: Any,
    ) -> RunResult:
        """:meth:`run` for scripts: starts an event loop (``backend``), runs, returns.

        Called where an event loop is running (a notebook cell, async code) it raises
        RuntimeError at once, saying to ``await agent.run(...)`` there instead.
        """
        from .blocking import run_blocking

        return run_blocking(self.run, input, backend=backend, **session_options)

"""Which agent an activity's step belongs to, and the context it runs in there.

A Temporal activity runs outside the workflow, in the worker, from JSON: the step's name
says whose call it is (the workflow's agent, or a sub-agent named by the prefixes
``tinyctx.subagent:<name>/``), and the activity rebuilds a context for it from what
crossed the boundary (the run's config) and what the worker has (the agent's and the
sub-agent's tools, the MCP servers' tools, the engine's ``data`` and ``stores``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from ..agent import Agent, Session
from ..context import RunConfig
from ..steps import SUBAGENT_STEP_PREFIX, runs_nested_steps
from ..tool_types import Tool
from . import EngineError

__all__ = ["Scope", "scope_of", "split_step"]


def split_step(name: str) -> tuple[tuple[str, ...], str]:
    """The sub-agent labels and the step's own name: ``("a", "b"), "tinyctx.model"`` for
    ``tinyctx.subagent:a/tinyctx.subagent:b/tinyctx.model``."""
    labels: list[str] = []
    while name.startswith(SUBAGENT_STEP_PREFIX):
        label, slash, rest = name[len(SUBAGENT_STEP_PREFIX) :].partition("/")
        if not slash:
            break
        labels.append(label)
        name = rest
    return tuple(labels), name


@frozen
class Scope:
    """The (sub-)agent a step belongs to: ``agent`` with the ``inherited`` tools of its
    parents it may call too (``inherit_tools=True``), and the step's own name."""

    agent: Agent
    inherited: tuple[Tool, ...]
    step: str

    def session(
        self, config: RunConfig, data: Any, stores: Mapping[str, Any] | None
    ) -> Session[Any]:
        """A store-less session of the scope's agent in the run's config: the serialized
        context (``RunContext``, ``Injected[...]``) an activity hands the call. The MCP
        servers' tools of the agent's ``MCPTools`` layers are in its registry."""
        session: Session[Any] = Session(
            self.agent,
            config=config,
            data=data,
            stores=stores,
            tools=self.inherited,
        )
        mcp = sys.modules.get("tinyctx.mcp")  # loaded if the agent has an MCPTools layer
        if mcp is not None:
            for layer in self.agent.middleware:
                if isinstance(layer, mcp.MCPTools):
                    layer.sync(session.ctx)  # the tools of the worker's open connections
        return session


def scope_of(agent: Agent, step: str) -> Scope:
    """The scope of ``step`` in a workflow of ``agent``; EngineError when a prefix names
    no sub-agent tool of its parent."""
    labels, base = split_step(step)
    current: Agent = agent
    inherited: tuple[Tool, ...] = ()
    for label in labels:
        visible = {t.name: t for t in (*inherited, *current.tools)}
        tool = visible.get(label)
        sub = getattr(tool, "agent", None)
        if not runs_nested_steps(tool) or not isinstance(sub, Agent):
            raise EngineError(
                f"step {step!r}: agent {current.name!r} has no sub-agent tool {label!r} "
                f"(its tools: {sorted(visible) or 'none'}); the worker must run the same "
                "agents as the workflow that recorded the step"
            )
        options: Mapping[str, Any] = getattr(tool, "subagent_options", {})
        if options.get("inherit_tools"):
            own = {t.name for t in sub.tools}
            inherited = tuple(t for t in visible.values() if t.name not in own)
        else:
            inherited = ()
        current = sub
    return Scope(current, inherited, base)

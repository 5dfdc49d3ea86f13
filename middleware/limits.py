"""Call limits per run or per thread, ending with an error or with a clear final answer.

:class:`CallLimits` counts model calls, tool calls and calls of named tools. ``scope="run"``
counts within one agent run (``RunConfig.agent_run_id``: a resumed run keeps its counts, a
nested sub-agent run has its own);
``scope="thread"`` counts across every run of the thread. The counts are durable layer
state: a run's counts travel with its checkpoint (``ctx.run_state``), so a resume in a new
Session or another process continues them; a thread's counts are kept with the thread
(``ctx.thread_state``) and written by a Session with a store. Stack two instances (with
distinct names) for both a run and a thread limit.

When a limit is reached a :class:`~tinyctx.LimitHit` event is emitted, then:

* ``exit="error"``: :class:`~tinyctx.LimitExceeded` is raised, naming the limit, the value
  and the scope. On the tool onion the loop answers the refused call and any remaining
  ones, so pairing holds.
* ``exit="end"``: the run ends as *stopped* with ``end_message`` as its final answer. A
  refused model call is not made (the layer answers with a control-only response); a
  refused tool call gets an error result saying why it did not run, and the stop is
  requested so the loop answers the rest of the batch and ends at its next checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from tinyctx import (
    ConfigError,
    Layer,
    LimitExceeded,
    LimitHit,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    StopWithFinal,
    ToolCall,
    ToolCallHandler,
    ToolResult,
)

__all__ = ["CallLimits", "LimitExit", "LimitScope"]

LimitExit = Literal["error", "end"]
LimitScope = Literal["run", "thread"]

DEFAULT_END_MESSAGE = "Stopped: the {what} limit of {value} per {scope} was reached."


class _Counts:
    """Calls counted in one run or one thread (durable: ``to_json`` / ``from_json``)."""

    __slots__ = ("model", "per_tool", "tools")

    def __init__(self) -> None:
        self.model = 0
        self.tools = 0
        self.per_tool: dict[str, int] = {}

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "tools": self.tools, "per_tool": dict(self.per_tool)}

    @classmethod
    def from_json(cls, data: Any) -> _Counts:
        counts = cls()
        counts.model = _count(data, "model")
        counts.tools = _count(data, "tools")
        per_tool = data.get("per_tool", {})
        if not isinstance(per_tool, dict):
            raise TypeError(f"per_tool must be an object, got {per_tool!r}")
        counts.per_tool = {str(name): _count(per_tool, name) for name in per_tool}
        return counts


def _count(data: Any, key: str) -> int:
    value = data.get(key, 0) if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be an integer >= 0, got {value!r}")
    return value


def _limit(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "an integer >= 1 or None", owner="CallLimits")
    return value


def _per_tool(value: Mapping[str, int] | None) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("per_tool", value, "a mapping of tool name to an integer >= 1")
    out: dict[str, int] = {}
    for tool, limit in value.items():
        if not isinstance(tool, str) or not tool:
            raise ConfigError(
                "per_tool", value, "tool names that are non-empty strings", owner="CallLimits"
            )
        checked = _limit(f"per_tool[{tool!r}]", limit)
        assert checked is not None
        out[tool] = checked
    return out


class CallLimits(Layer):
    """Limit model and tool calls per run or per thread (see the module doc)."""

    def __init__(
        self,
        model_calls: int | None = None,
        tool_calls: int | None = None,
        per_tool: Mapping[str, int] | None = None,
        exit: LimitExit = "error",
        scope: LimitScope = "run",
        *,
        end_message: str = DEFAULT_END_MESSAGE,
        name: str | None = None,
    ) -> None:
        self.model_calls = _limit("model_calls", model_calls)
        self.tool_calls = _limit("tool_calls", tool_calls)
        self.per_tool = _per_tool(per_tool)
        if self.model_calls is None and self.tool_calls is None and not self.per_tool:
            raise ConfigError(
                "model_calls",
                None,
                "at least one of model_calls, tool_calls or per_tool to be set",
                owner="CallLimits",
            )
        if exit not in ("error", "end"):
            raise ConfigError("exit", exit, "'error' or 'end'", owner="CallLimits")
        if scope not in ("run", "thread"):
            raise ConfigError("scope", scope, "'run' or 'thread'", owner="CallLimits")
        if not isinstance(end_message, str) or not end_message:
            raise ConfigError("end_message", end_message, "a non-empty string", owner="CallLimits")
        try:
            end_message.format(what="", value=0, scope="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                "end_message",
                end_message,
                "a format string using only {what}, {value} and {scope}",
                owner="CallLimits",
            ) from exc
        self.exit: LimitExit = exit
        self.scope: LimitScope = scope
        self.end_message = end_message
        if name is not None:
            self.name = name

    # -- counters ----------------------------------------------------------------------------

    def _counts(self, ctx: RunContext[Any]) -> _Counts:
        # run scope: the agent run the call belongs to (layers inside may see a context
        # derived per call; a resumed run gets its counts back from the checkpoint)
        if self.scope == "thread":
            return ctx.thread_state(self, _Counts)
        return ctx.run_state(self, _Counts)

    # -- the hooks ---------------------------------------------------------------------------

    def _reached(self, ctx: RunContext[Any], limit: str, value: int, what: str) -> str:
        """Report the hit; raise for ``exit="error"``, else return the final message."""
        ctx.emit(LimitHit(limit=limit, value=value, scope=self.scope))
        if self.exit == "error":
            raise LimitExceeded(limit, value, scope=self.scope)
        return self.end_message.format(what=what, value=value, scope=self.scope)

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        limit = self.model_calls
        if limit is not None:
            counts = self._counts(ctx)
            if counts.model >= limit:
                final = self._reached(ctx, "model_calls", limit, "model call")
                return ModelResponse.from_control(StopWithFinal(final))
            counts.model += 1
        return await call_next(request, ctx)

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        if self.tool_calls is None and call.name not in self.per_tool:
            return await call_next(call, ctx)
        counts = self._counts(ctx)
        name = call.name
        refused: tuple[str, int, str] | None = None
        if self.tool_calls is not None and counts.tools >= self.tool_calls:
            refused = ("tool_calls", self.tool_calls, "tool call")
        else:
            per = self.per_tool.get(name)
            if per is not None and counts.per_tool.get(name, 0) >= per:
                refused = (f"tool_calls[{name}]", per, f"{name!r} call")
        if refused is not None:
            limit, value, what = refused
            final = self._reached(ctx, limit, value, what)
            ctx.request_control(StopWithFinal(final))
            return ToolResult.for_call(
                call,
                f"[not run: the {what} limit of {value} per {self.scope} was reached]",
                is_error=True,
                metadata={"tinyctx": {"synthetic": "limit"}},
            )
        counts.tools += 1
        counts.per_tool[name] = counts.per_tool.get(name, 0) + 1
        return await call_next(call, ctx)

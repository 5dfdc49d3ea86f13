"""Call limits per run or per thread, ending with an error or with a clear final answer.

:class:`CallLimits` counts model calls, tool calls and calls of named tools. ``scope="run"``
counts within one agent run (``RunConfig.agent_run_id``: a resumed run keeps its counts, a
nested sub-agent run has its own);
``scope="thread"`` counts across every run of the thread in this session (the counters
live in the session's cache; pass the same ``ctx`` to a new Session to keep them). Stack
two instances (with distinct names) for both a run and a thread limit.

When a limit is reached a :class:`~tinyctx.LimitHit` event is emitted, then:

* ``exit="error"``: :class:`~tinyctx.LimitExceeded` is raised, naming the limit, the value
  and the scope. On the tool onion the loop answers the refused call and any remaining
  ones, so pairing holds.
* ``exit="continue"`` (tool limits only): the refused call is answered with an error
  result telling the model the limit was reached; the run goes on, and the other calls of
  the batch still run (each is counted and refused on its own).
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
    Interrupted,
    Layer,
    LimitExceeded,
    LimitHit,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    RunResult,
    StopWithFinal,
    ToolCall,
    ToolCallHandler,
    ToolResult,
)

__all__ = ["CallLimits", "LimitExit", "LimitScope"]

LimitExit = Literal["error", "end", "continue"]
LimitScope = Literal["run", "thread"]

CONTINUE_MESSAGE = (
    "Error (LimitExceeded): the {what} limit of {value} per {scope} was reached, so this "
    "call of {tool!r} was not run. Do not call it again; continue with what you have."
)
DEFAULT_END_MESSAGE = "Stopped: the {what} limit of {value} per {scope} was reached."


class _Counts:
    __slots__ = ("model", "paused", "per_tool", "thread_id", "tools")

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self.model = 0
        self.tools = 0
        self.per_tool: dict[str, int] = {}
        self.paused = False


class _State:
    __slots__ = ("runs", "threads")

    def __init__(self) -> None:
        self.runs: dict[str, _Counts] = {}
        self.threads: dict[str, _Counts] = {}


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
        if exit not in ("error", "end", "continue"):
            raise ConfigError("exit", exit, "'error', 'end' or 'continue'", owner="CallLimits")
        if exit == "continue" and self.model_calls is not None:
            raise ConfigError(
                "exit",
                exit,
                "'error' or 'end' when model_calls is set ('continue' answers refused tool "
                "calls; a refused model call cannot be answered)",
                owner="CallLimits",
            )
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

    def _state(self, ctx: RunContext[Any]) -> _State:
        return ctx.state_for(self, _State)

    def _counts(self, ctx: RunContext[Any]) -> _Counts:
        state = self._state(ctx)
        if self.scope == "thread":
            counts = state.threads.get(ctx.thread_id)
            if counts is None:
                counts = state.threads[ctx.thread_id] = _Counts(ctx.thread_id)
            return counts
        # the agent run the call belongs to: layers inside may see a context derived per call
        key = ctx.config.agent_run_id or ctx.run_id
        counts = state.runs.get(key)
        if counts is None:
            counts = state.runs[key] = _Counts(ctx.thread_id)
        return counts

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        if self.scope != "run":
            return
        runs = self._state(ctx).runs
        existing = runs.get(ctx.run_id)
        if existing is not None:  # a resumed run keeps its counts
            existing.paused = False
            return
        # a new run of the thread abandons the runs paused in it (Session.run does)
        for run_id, counts in list(runs.items()):
            if counts.paused and counts.thread_id == ctx.thread_id:
                del runs[run_id]

    async def on_run_end(
        self, ctx: RunContext[Any], result: RunResult | None, error: BaseException | None
    ) -> None:
        if self.scope != "run":
            return
        runs = self._state(ctx).runs
        if isinstance(error, Interrupted) and ctx.run_id in runs:
            runs[ctx.run_id].paused = True  # kept for Session.resume
        else:
            runs.pop(ctx.run_id, None)

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
            if self.exit == "continue":
                # the run goes on: the model reads why this call did not run
                return ToolResult.for_call(
                    call,
                    CONTINUE_MESSAGE.format(
                        what=what, value=value, scope=self.scope, tool=call.name
                    ),
                    is_error=True,
                    metadata={"tinyctx": {"synthetic": "limit"}},
                )
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

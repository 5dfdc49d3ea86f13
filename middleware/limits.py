"""Call limits per run or per thread, ending with an error or with a clear final answer.

:class:`CallLimits` counts model calls, tool calls and calls of named tools. Each limit is
an integer (counted in the layer's ``scope``) or a mapping of scope to integer, for both at
once: ``CallLimits(model_calls={"run": 10, "thread": 50})``. ``"run"`` counts within one
agent run (``RunConfig.agent_run_id``: a resumed run keeps its counts, a nested sub-agent
run has its own); ``"thread"`` counts across every run of the thread. The counts are
durable layer state: a run's counts travel with its checkpoint (``ctx.run_state``), so a
resume in a new Session or another process continues them; a thread's counts are kept with
the thread (``ctx.thread_state``) and written by a Session with a store.
When one call reaches a run and a thread limit together, the one error and the one
:class:`~tinyctx.events.LimitHit` event name both (``hits``).

When a limit is reached a :class:`~tinyctx.events.LimitHit` event is emitted, then:

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
    Layer,
    LimitExceeded,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    StopWithFinal,
    ToolCall,
    ToolResult,
)
from tinyctx.chain import ToolCallHandler
from tinyctx.config import implements, integer, one_of, optional, text
from tinyctx.control import resumption
from tinyctx.events import LimitHit

__all__ = ["CallLimits", "LimitExit", "LimitScope"]

LimitExit = Literal["error", "end", "continue"]
LimitScope = Literal["run", "thread"]

CONTINUE_MESSAGE = (
    "Error (LimitExceeded): the {what} limit of {value} per {scope} was reached, so this "
    "call of {tool!r} was not run. Do not call it again; continue with what you have."
)
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
    return _LIMIT.check(value, name, "CallLimits")


_SCOPES: tuple[LimitScope, ...] = ("run", "thread")
_LIMIT = optional(integer(minimum=1))
_PER_TOOL = implements(Mapping, allowed="a mapping of tool name to an integer >= 1")
_EXIT = one_of(("error", "end", "continue"), allowed="'error', 'end' or 'continue'")


def _scoped(name: str, value: Any, scope: LimitScope) -> dict[LimitScope, int]:
    """``{scope: limit}`` from an int (the layer's scope) or a mapping of scope to int."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        if not value or any(k not in _SCOPES for k in value):
            raise ConfigError(
                name,
                value,
                "an integer >= 1, or a mapping of 'run' and/or 'thread' to integers >= 1",
                owner="CallLimits",
            )
        out: dict[LimitScope, int] = {}
        for key in _SCOPES:
            if key in value:
                checked = _limit(f"{name}[{key!r}]", value[key])
                assert checked is not None
                out[key] = checked
        return out
    checked = _limit(name, value)
    return {} if checked is None else {scope: checked}


def _per_tool(value: Any, scope: LimitScope) -> dict[str, dict[LimitScope, int]]:
    if value is None:
        return {}
    _PER_TOOL.check(value, "per_tool", "CallLimits")
    out: dict[str, dict[LimitScope, int]] = {}
    for tool, limit in value.items():
        if not text().test(tool):
            raise ConfigError(
                "per_tool", value, "tool names that are non-empty strings", owner="CallLimits"
            )
        out[tool] = _scoped(f"per_tool[{tool!r}]", limit, scope)
    return out


# (limit name, value, scope, what) of one limit a call reached
_Hit = tuple[str, int, LimitScope, str]


class CallLimits(Layer):
    """Limit model and tool calls per run, per thread, or both (see the module doc)."""

    def __init__(
        self,
        model_calls: int | Mapping[str, int] | None = None,
        tool_calls: int | Mapping[str, int] | None = None,
        per_tool: Mapping[str, int | Mapping[str, int]] | None = None,
        exit: LimitExit = "error",
        scope: LimitScope = "run",
        *,
        end_message: str = DEFAULT_END_MESSAGE,
        name: str | None = None,
    ) -> None:
        one_of(_SCOPES, allowed="'run' or 'thread'").check(scope, "scope", "CallLimits")
        self.model_limits = _scoped("model_calls", model_calls, scope)
        self.tool_limits = _scoped("tool_calls", tool_calls, scope)
        self.per_tool_limits = _per_tool(per_tool, scope)
        if not self.model_limits and not self.tool_limits and not self.per_tool_limits:
            raise ConfigError(
                "model_calls",
                None,
                "at least one of model_calls, tool_calls or per_tool to be set",
                owner="CallLimits",
            )
        _EXIT.check(exit, "exit", "CallLimits")
        if exit == "continue" and self.model_limits:
            raise ConfigError(
                "exit",
                exit,
                "'error' or 'end' when model_calls is set ('continue' answers refused tool "
                "calls; a refused model call cannot be answered)",
                owner="CallLimits",
            )
        text().check(end_message, "end_message", "CallLimits")
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
        used = {*self.model_limits, *self.tool_limits}
        for limits in self.per_tool_limits.values():
            used.update(limits)
        self.scopes: tuple[LimitScope, ...] = tuple(s for s in _SCOPES if s in used)
        self.end_message = end_message
        if name is not None:
            self.name = name

    # -- counters ----------------------------------------------------------------------------

    def _counts(self, ctx: RunContext[Any], scope: LimitScope) -> _Counts:
        if scope == "thread":
            return ctx.thread_state(self, _Counts)
        # run scope: the agent run the call belongs to (layers inside may see a context
        # derived per call; a resumed run gets its counts back from the checkpoint)
        return ctx.run_state(self, _Counts)

    # -- the hooks ---------------------------------------------------------------------------

    def _reached(self, ctx: RunContext[Any], hits: list[_Hit]) -> str:
        """Report the hit (one event naming every limit reached); raise for ``exit="error"``,
        else return the final message."""
        named = tuple((limit, value, scope) for limit, value, scope, _ in hits)
        limit, value, scope, what = hits[0]
        ctx.emit(LimitHit(limit=limit, value=value, scope=scope, hits=named))
        if self.exit == "error":
            raise LimitExceeded(limit, value, scope=scope, hits=named)
        return self.end_message.format(what=what, value=value, scope=scope)

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        limits = self.model_limits
        if limits:
            counted = [(scope, self._counts(ctx, scope)) for scope in limits]
            hits: list[_Hit] = [
                ("model_calls", limits[scope], scope, "model call")
                for scope, counts in counted
                if counts.model >= limits[scope]
            ]
            if hits:
                final = self._reached(ctx, hits)
                return ModelResponse.from_control(StopWithFinal(final))
            for _, counts in counted:
                counts.model += 1
        return await call_next(request, ctx)

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        name = call.name
        per = self.per_tool_limits.get(name)
        if (not self.tool_limits and per is None) or resumption() is not None:
            # a suspended call running again on resume was counted when it first ran
            return await call_next(call, ctx)
        counted = [(scope, self._counts(ctx, scope)) for scope in self.scopes]
        hits: list[_Hit] = []
        for scope, counts in counted:
            limit = self.tool_limits.get(scope)
            if limit is not None and counts.tools >= limit:
                hits.append(("tool_calls", limit, scope, "tool call"))
            elif per is not None:
                limit = per.get(scope)
                if limit is not None and counts.per_tool.get(name, 0) >= limit:
                    hits.append((f"tool_calls[{name}]", limit, scope, f"{name!r} call"))
        if hits:
            final = self._reached(ctx, hits)
            _, value, scope, what = hits[0]
            if self.exit == "continue":
                # the run goes on: the model reads why this call did not run
                return ToolResult.for_call(
                    call,
                    CONTINUE_MESSAGE.format(what=what, value=value, scope=scope, tool=name),
                    is_error=True,
                    metadata={"tinyctx": {"synthetic": "limit"}},
                )
            ctx.request_control(StopWithFinal(final))
            return ToolResult.for_call(
                call,
                f"[not run: the {what} limit of {value} per {scope} was reached]",
                is_error=True,
                metadata={"tinyctx": {"synthetic": "limit"}},
            )
        for _, counts in counted:
            counts.tools += 1
            counts.per_tool[name] = counts.per_tool.get(name, 0) + 1
        return await call_next(call, ctx)

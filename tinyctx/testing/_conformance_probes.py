"""The conformance kit's instruments.

The scenario, the probes around the layer under test, and snapshots of what it changed.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import attrs

from ..chain import Layer, LayerLike, ModelCall, ToolCallHandler
from ..context import RunConfig, RunContext
from ..control import StopWithFinal
from ..errors import RunCancelled
from ..messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
)
from ..model import ModelHandler, ModelRequest, ModelResponse
from .invariants import context_snapshot


@attrs.define
class _Scenario:
    """What one drive of the layer sees; filled by the probes."""

    fault: BaseException | None = None
    fault_hook: str = "model"
    hang: bool = False
    cancel_token: bool = False
    inner_calls: int = 0
    escaped: list[BaseException] = attrs.Factory(list)
    returned_control: list[Any] = attrs.Factory(list)
    mutation: str | None = None
    sent: list[ModelRequest] = attrs.Factory(list)


def _fields_state(value: Any) -> tuple[Any, ...]:
    """The field values of an attrs value (a message, a tool call), to detect edits in place."""
    return tuple(getattr(value, f.name) for f in attrs.fields(type(value)))


def _request_state(request: ModelRequest) -> tuple[Any, ...]:
    fields = tuple(getattr(request, f.name) for f in attrs.fields(ModelRequest))
    return (tuple(map(id, fields)), tuple(_fields_state(m) for m in request.messages))


class _Probe(Layer):
    """A kit probe: an observer other layers' ordering rules ignore, sharing one scenario."""

    ordering_neutral = True

    def __init__(self, scenario: _Scenario) -> None:
        self.scenario = scenario


class _OuterProbe(_Probe):
    """Outside the layer: snapshots what the layer is handed and sees what comes out."""

    name = "conformance.outer"

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        before_request = _request_state(request)
        before_ctx = context_snapshot(ctx)
        try:
            response = await call_next(request, ctx)
        except BaseException as exc:
            self.scenario.escaped.append(exc)
            raise
        finally:
            self._compare(before_request, _request_state(request), before_ctx, ctx)
        self.scenario.returned_control.append(response.control)
        return response

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        before_call = _fields_state(call)
        try:
            return await call_next(call, ctx)
        except BaseException as exc:
            self.scenario.escaped.append(exc)
            raise
        finally:
            if _fields_state(call) != before_call and self.scenario.mutation is None:
                self.scenario.mutation = f"the tool call it was handed changed: {call!r}"

    def _compare(
        self,
        before: tuple[Any, ...],
        after: tuple[Any, ...],
        before_ctx: dict[str, Any],
        ctx: RunContext[Any],
    ) -> None:
        if self.scenario.mutation is not None:
            return
        if before[0] != after[0]:
            self.scenario.mutation = "a field of the request it was handed was replaced in place"
        elif before[1] != after[1]:
            changed = next(
                i for i, (a, b) in enumerate(zip(before[1], after[1], strict=False)) if a != b
            )
            self.scenario.mutation = f"request.messages[{changed}] was changed in place"
        else:
            try:
                after_ctx = context_snapshot(ctx)
            except Exception:  # pragma: no cover - a broken context is reported below
                after_ctx = {}
            for key, value in before_ctx.items():
                if key == "fields":
                    continue
                if after_ctx.get(key) != value and key != "cancelled":
                    self.scenario.mutation = f"the parent context's {key} changed"
                    return


class _InnerProbe(_Probe):
    """Inside the layer: records what reaches the model and injects faults."""

    name = "conformance.inner"

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response: ModelResponse = await self._inner(
            "model", ctx, lambda: call_next(request, ctx), request
        )
        return response

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        result: ToolResult = await self._inner("tool", ctx, lambda: call_next(call, ctx), None)
        return result

    async def _inner(
        self,
        hook: str,
        ctx: RunContext[Any],
        proceed: Callable[[], Awaitable[Any]],
        request: ModelRequest | None,
    ) -> Any:
        scenario = self.scenario
        if request is not None:
            scenario.sent.append(request)
        if hook != scenario.fault_hook:
            return await proceed()
        scenario.inner_calls += 1
        if scenario.cancel_token:
            ctx.cancellation.cancel("conformance kit")
            raise RunCancelled("conformance", "conformance kit")
        if scenario.hang:
            await anyio.sleep_forever()
        if scenario.fault is not None:
            raise scenario.fault
        return await proceed()


# ---------------------------------------------------------------------------------------
# driving a layer


def _script(calls: Sequence[ToolCall], control: bool) -> ModelHandler:
    """First response: the drawn tool calls; then a final answer (with a stop if asked)."""
    state = {"n": 0}

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        await anyio.lowlevel.checkpoint()
        state["n"] += 1
        if state["n"] == 1 and calls:
            return ModelResponse(AssistantMessage("", tool_calls=tuple(calls)))
        response = ModelResponse(AssistantMessage("done"))
        if control:
            return response.evolve(control=StopWithFinal("conformance stop"))
        return response

    return model


@attrs.frozen
class _Options:
    layer: LayerLike
    name: str
    config: RunConfig
    session_options: Mapping[str, Any]
    hooks: tuple[str, ...]
    skip: Mapping[str, str]
    block_threshold: float


_VALUE_TYPES = (int, float, str, bytes, bool, type(None), tuple, list, dict, set, frozenset)


def _is_value(value: Any) -> bool:
    """Values compared by content: scalars, containers and types that define equality."""
    if isinstance(value, _VALUE_TYPES):
        return True
    eq: object = type(value).__eq__
    return eq is not object.__eq__


def _vars_snapshot(layer: LayerLike) -> dict[str, tuple[int, Any, bool]]:
    """Per attribute: its identity, a deep copy, and whether the copy compares by content.

    A rebound attribute is a change; a value (a counter, a list, an attrs value) is also
    compared by content, so ``self.n += 1`` and ``self.seen.append(x)`` are both caught.
    Helper objects without equality (a token counter, a summarizer) are compared by
    identity only: their internal caches are not session state.
    """
    try:
        state = dict(vars(layer))
    except TypeError:
        return {}
    snapshot: dict[str, tuple[int, Any, bool]] = {}
    for key, value in state.items():
        copied: Any = None
        comparable = False
        if _is_value(value):
            try:
                copied = copy.deepcopy(value)
                comparable = bool(copied == value)
            except Exception:
                comparable = False
        snapshot[key] = (id(value), copied, comparable)
    return snapshot


def _changed_attributes(before: Mapping[str, tuple[int, Any, bool]], layer: LayerLike) -> list[str]:
    try:
        now = dict(vars(layer))
    except TypeError:
        return []
    changed = []
    for key in sorted(set(before) | set(now)):
        if key not in before:
            changed.append(f"{key}: <absent> -> {now[key]!r}")
            continue
        if key not in now:
            changed.append(f"{key}: deleted")
            continue
        identity, copied, comparable = before[key]
        value = now[key]
        if id(value) != identity:
            shown = copied if comparable else "<another object>"
            changed.append(f"{key}: {shown!r} -> {value!r}")
        elif comparable:
            try:
                same = bool(copied == value)
            except Exception:
                same = True
            if not same:
                changed.append(f"{key}: {copied!r} -> {value!r}")
    return changed


def _source(value: Any) -> str:
    """``value`` as a Python expression of tinyctx's root API: an attrs value as its
    constructor call with only the fields that differ from their defaults, a mapping as a
    dict literal, so a shrunk example pastes into a test (``from tinyctx import *``)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_source(k)}: {_source(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        items = [_source(v) for v in value]
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if attrs.has(type(value)):
        shown = []
        for field in attrs.fields(type(value)):
            if not field.init:
                continue
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()
            current = getattr(value, field.name)
            if default is attrs.NOTHING or current != default:
                shown.append(f"{field.name}={_source(current)}")
        return f"{type(value).__name__}({', '.join(shown)})"
    return repr(value)


def _example(history: Sequence[Message], calls: Sequence[ToolCall]) -> str:
    return f"history={_source(list(history))}, tool_calls={_source(list(calls))}"

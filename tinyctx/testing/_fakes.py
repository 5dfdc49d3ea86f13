"""Fake models and tools, event capture, and drivers that run one layer in isolation."""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import anyio

from ..chain import Layer, LayerLike, ModelCall, ToolCallHandler, compose
from ..context import RunContext
from ..control import Interrupt, StopWithFinal
from ..events import Event, add_tap
from ..messages import AssistantMessage, ToolCall, ToolResult
from ..model import ModelRequest, ModelResponse, Usage
from ..tools import Tool

__all__ = [
    "HANG",
    "ScriptedModel",
    "ScriptExhausted",
    "EchoModel",
    "FakeTool",
    "reply",
    "call",
    "capture_events",
    "run_layer",
    "run_tool_layer",
]

_call_ids = itertools.count(1)


def call(name: str, /, id: str | None = None, **arguments: Any) -> ToolCall:
    """A ToolCall with a fresh id: ``call("search", q="tinyctx")``."""
    return ToolCall(id or f"call_{next(_call_ids)}", name, arguments)


def reply(
    text: str = "",
    *calls: ToolCall,
    usage: Usage | tuple[int, int] | None = None,
    control: StopWithFinal | Interrupt | None = None,
    model: str | None = None,
) -> ModelResponse:
    """A scripted model response: text and/or tool calls, optional usage ``(in, out)``."""
    if isinstance(usage, tuple):
        usage = Usage(*usage)
    return ModelResponse(AssistantMessage(text, calls), usage=usage, control=control, model=model)


class _Hang:
    def __repr__(self) -> str:
        return "HANG"


HANG: Any = _Hang()
"""A script item that never answers (until cancelled from outside): test timeouts and cancel."""

ScriptItem = (
    ModelResponse
    | AssistantMessage
    | str
    | BaseException
    | Callable[[ModelRequest, RunContext[Any]], Awaitable[ModelResponse] | ModelResponse]
    | _Hang
)


class ScriptExhausted(AssertionError):
    """The test's script ran out: the code under test called the model more than expected."""


class ScriptedModel:
    """A model handler that plays a script and records every request it receives.

    Script items: a ModelResponse, an AssistantMessage, a plain string (a final answer), an
    exception instance (raised), :data:`HANG`, or a function ``(request, ctx) -> response``.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] = (),
        *,
        name: str = "scripted",
        repeat_last: bool = False,
    ) -> None:
        self._script: list[ScriptItem] = list(script)
        self._position = 0
        self.name = name
        self.repeat_last = repeat_last
        self.requests: list[ModelRequest] = []
        self.contexts: list[RunContext[Any]] = []

    def add(self, *items: ScriptItem) -> ScriptedModel:
        self._script.extend(items)
        return self

    @property
    def calls(self) -> int:
        return len(self.requests)

    @property
    def remaining(self) -> int:
        return len(self._script) - self._position

    def _next(self) -> ScriptItem:
        if self._position >= len(self._script):
            if self.repeat_last and self._script:
                return self._script[-1]
            last = self.requests[-1] if self.requests else None
            detail = f"; last request had {len(last.messages)} messages" if last else ""
            raise ScriptExhausted(
                f"ScriptedModel {self.name!r}: script of {len(self._script)} items exhausted at "
                f"call {len(self.requests)}{detail}"
            )
        item = self._script[self._position]
        self._position += 1
        return item

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        self.requests.append(request)
        self.contexts.append(ctx)
        item = self._next()
        await anyio.lowlevel.checkpoint()
        if isinstance(item, _Hang):
            await anyio.sleep_forever()
            raise RuntimeError("HANG never returns")  # noqa: TRY004  # pragma: no cover
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, str):
            return ModelResponse(AssistantMessage(item), model=request.model or self.name)
        if isinstance(item, AssistantMessage):
            return ModelResponse(item, model=request.model or self.name)
        if isinstance(item, ModelResponse):
            return item
        result = item(request, ctx)
        if not isinstance(result, ModelResponse):
            result = await result
        return result


class EchoModel:
    """Answers with the last user message's text (or a fixed ``prefix`` + it)."""

    def __init__(self, prefix: str = "", usage: Usage | None = None) -> None:
        self.prefix = prefix
        self.usage = usage
        self.requests: list[ModelRequest] = []

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        self.requests.append(request)
        await anyio.lowlevel.checkpoint()
        text = next(
            (m.text for m in reversed(request.messages) if m.role == "user"),
            "",
        )
        return ModelResponse(
            AssistantMessage(self.prefix + text), usage=self.usage, model=request.model
        )


class FakeTool:
    """A tool factory that records calls: ``FakeTool("search", returns="found")``.

    ``returns`` may be a value, a list of values (played in order), an exception, or a
    function of the arguments. ``.tool`` is the :class:`tinyctx.Tool` to hand to an agent.
    """

    def __init__(
        self,
        name: str,
        returns: Any = "ok",
        *,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
        control: StopWithFinal | Interrupt | None = None,
    ) -> None:
        self.name = name
        self.calls: list[dict[str, Any]] = []
        self.contexts: list[RunContext[Any]] = []
        self._returns = returns
        self._sequence: Iterator[Any] | None = iter(returns) if isinstance(returns, list) else None
        self._control = control
        self.tool = Tool(
            name,
            description or f"fake tool {name}",
            parameters or {"type": "object", "properties": {}, "additionalProperties": True},
            handler=self._handle,
        )

    async def _handle(self, arguments: Mapping[str, Any], ctx: RunContext[Any]) -> str | ToolResult:
        self.calls.append(dict(arguments))
        self.contexts.append(ctx)
        await anyio.lowlevel.checkpoint()
        if self._control is not None:
            ctx.request_control(self._control)
        value = next(self._sequence) if self._sequence is not None else self._returns
        if isinstance(value, BaseException):
            raise value
        if callable(value):
            value = value(arguments)
        if isinstance(value, (str, ToolResult)):
            return value
        return json.dumps(value)


@contextmanager
def capture_events() -> Iterator[list[Event]]:
    """Collect every event any sink emits inside the block (like structlog's capture_logs)."""
    captured: list[Event] = []
    remove = add_tap(captured.append)
    try:
        yield captured
    finally:
        remove()


async def _default_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    await anyio.lowlevel.checkpoint()
    return ModelResponse(AssistantMessage("ok"), model=request.model)


async def _default_tool(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    await anyio.lowlevel.checkpoint()
    return ToolResult.for_call(call, "ok")


async def run_layer(
    layer: LayerLike,
    request: ModelRequest,
    ctx: RunContext[Any] | None = None,
    next: ModelCall | None = None,
) -> ModelResponse:
    """Drive one layer's model hook once, around ``next`` (default: answers "ok")."""
    onion = compose([layer], next or _default_model)
    return await onion(request, ctx if ctx is not None else RunContext.new())


async def run_tool_layer(
    layer: Layer,
    call: ToolCall,
    ctx: RunContext[Any] | None = None,
    next: ToolCallHandler | None = None,
) -> ToolResult:
    """Drive one layer's tool hook once, around ``next`` (default: answers "ok")."""
    onion = compose([layer], next or _default_tool, hook="tool")
    return await onion(call, ctx if ctx is not None else RunContext.new())

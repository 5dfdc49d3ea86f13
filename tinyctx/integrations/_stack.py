"""A tinyctx stack driven from inside another framework's agent loop.

:class:`Stack` composes the layers once (the model onion and the tool onion) around a core
handler that calls the framework's own handler for the current call, which the adapter
hands over per call. Each framework thread (a LangGraph ``thread_id``, an Agents SDK
session, a pydantic-ai history) gets one :class:`~tinyctx.RunContext` whose conversation
is the thread's history as the framework last sent it, so layer state (the guard's
calibration, breakers, relief marks) lives as long as the thread does in this process.

A call reports what the stack did: the response, and the history the layers *committed*
(a persistent rewrite: ``ctx.conversation.replace``) for the adapter to write back into
the framework's own state; a transient rewrite changes only what this call sent.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from ..chain import LayerLike, check_layer_names, compose
from ..config import integer
from ..context import RunConfig, RunContext
from ..control import Interrupt, StopWithFinal, stronger
from ..conversation import Conversation
from ..errors import TinyCtxError
from ..events import EventSink
from ..messages import Message, ToolCall, ToolResult
from ..model import ModelRequest, ModelResponse
from ..ordering import check_ordering
from ..tools import Tool, ToolSpec

__all__ = [
    "Stack",
    "StackCall",
    "StackInterrupted",
    "FrameworkModel",
    "FrameworkTool",
    "DEFAULT_MAX_THREADS",
]

FrameworkModel = Callable[[ModelRequest], Awaitable[ModelResponse]]
"""Calls the framework's model with a (possibly rewritten) tinyctx request."""
FrameworkTool = Callable[[ToolCall], Awaitable[ToolResult]]
"""Runs the framework's tool for a tinyctx call."""

DEFAULT_MAX_THREADS = 10_000
"""How many threads' layer state a :class:`Stack` keeps by default."""

_MODEL: contextvars.ContextVar[FrameworkModel] = contextvars.ContextVar("tinyctx_framework_model")
_TOOL: contextvars.ContextVar[FrameworkTool] = contextvars.ContextVar("tinyctx_framework_tool")


async def _core_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return await _MODEL.get()(request)


async def _core_tool(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    return await _TOOL.get()(call)


async def _runs_in_the_framework(arguments: Any, ctx: RunContext[Any]) -> str:
    raise TypeError("a framework's tool runs through its adapter (Stack.call_tool), not here")


def _know(ctx: RunContext[Any], specs: Sequence[ToolSpec]) -> None:
    """Register a stand-in for each of the framework's tools the context does not know yet,
    so layers that look a tool up (a review, a retry's checks) find it; the framework
    checks the arguments itself, so a stand-in is a plain :class:`~tinyctx.Tool`."""
    tools = ctx.tools
    for spec in specs:
        if spec.name not in tools:
            tools.register(
                Tool(
                    spec.name,
                    spec.description,
                    spec.parameters,
                    handler=_runs_in_the_framework,
                )
            )


def _reusing(known: tuple[Message, ...], sent: tuple[Message, ...]) -> tuple[Message, ...]:
    """``sent`` (the framework's history, converted anew on every call) with the messages
    it shares with ``known`` (the history kept from the last call) as the kept objects:
    ``known`` itself when nothing changed, else the kept prefix plus what is new. Layers
    keyed on identity (the counter's memo, a compaction's marks) then see a thread that
    grew, not a new one, and a grown history costs only what was appended."""
    same = 0
    for old, new in zip(known, sent, strict=False):
        if old is not new and old != new:
            break
        same += 1
    if same == len(sent) == len(known):
        return known
    if not same:
        return sent
    return (*known[:same], *sent[same:])


class StackInterrupted(TinyCtxError):
    """A layer asked for an :class:`~tinyctx.Interrupt` in a framework with no pause of
    its own: the model call is abandoned (nothing of it enters the framework's history)
    and the caller gets the interrupt's ``node``, ``message`` and ``payload``."""

    def __init__(self, interrupt: Interrupt) -> None:
        self.interrupt = interrupt
        self.node = interrupt.node
        self.message = interrupt.message
        self.payload = interrupt.payload
        super().__init__(f"interrupted at node {interrupt.node!r}: {interrupt.message}")


@attrs.frozen
class StackCall:
    """What the stack did with one model call.

    ``response`` is what the layers returned (``response.raw`` is the framework's own
    response when the model was called, None when a layer answered instead);
    ``committed`` the thread's history after a persistent rewrite (None when no layer
    committed one); ``control`` the outcome a layer asked for, if any.
    """

    response: ModelResponse
    committed: tuple[Message, ...] | None
    control: StopWithFinal | Interrupt | None


class Stack:
    """tinyctx layers composed once, run around a framework's handler per call.

    ``max_tokens``, ``reserved_output_tokens`` and ``model`` set the context window the
    guard keeps each request inside (as :class:`~tinyctx.RunConfig`); ``events`` receives
    every event the layers emit (default: a sink that logs through structlog). The state of
    at most ``max_threads`` threads is kept, the least recently used forgotten first (its
    next call starts with fresh layer state, as after :meth:`forget`).
    """

    def __init__(
        self,
        layers: Sequence[LayerLike],
        *,
        max_tokens: int | None = None,
        reserved_output_tokens: int = 0,
        model: str | None = None,
        events: EventSink | None = None,
        max_threads: int = DEFAULT_MAX_THREADS,
    ) -> None:
        self.max_threads = integer(minimum=1).check(max_threads, "max_threads", "Stack")
        self.layers = tuple(layers)
        check_layer_names(self.layers)  # the same checks an Agent makes when it is built
        check_ordering(self.layers)
        self._model_onion = compose(self.layers, _core_model)
        self._tool_onion = compose(self.layers, _core_tool, hook="tool")
        # validated here, once: a bad window fails at construction naming the field
        self._config = RunConfig(
            max_tokens=max_tokens,
            reserved_output_tokens=reserved_output_tokens,
            model=model,
            max_model_calls=None,
        )
        self.events = events if events is not None else EventSink()
        self._threads: dict[str, RunContext[Any]] = {}

    def context(self, thread_id: str) -> RunContext[Any]:
        """The context of ``thread_id``, made on first use (its conversation, layer state,
        usage and cost trackers live as long as this stack)."""
        threads = self._threads
        ctx = threads.pop(thread_id, None)
        if ctx is None:
            config = self._config.evolve(thread_id=thread_id)
            ctx = RunContext.new(config, events=self.events, conversation=Conversation())
            while len(threads) >= self.max_threads:
                del threads[next(iter(threads))]  # the least recently used
        threads[thread_id] = ctx  # the most recently used is last
        return ctx

    def forget(self, thread_id: str) -> None:
        """Drop the state kept for ``thread_id`` (its next call starts afresh)."""
        self._threads.pop(thread_id, None)

    async def call_model(
        self,
        thread_id: str,
        messages: Sequence[Message],
        call: FrameworkModel,
        *,
        system_prompt: str | None = None,
        tools: Sequence[ToolSpec] = (),
        model: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> StackCall:
        """Run the model onion over ``messages`` (the thread's history as the framework
        holds it), with ``call`` at its centre."""
        ctx = self.context(thread_id)
        _know(ctx, tools)
        conversation = ctx.conversation
        history = _reusing(conversation.messages, tuple(messages))
        if history is not conversation.messages:
            conversation.replace(history, emit_new=False)
            conversation.mark_synced()
        before = conversation.messages
        request = ModelRequest(
            messages=before,
            tools=tuple(tools),
            system_prompt=system_prompt,
            model=model or self._config.model,
            settings=settings or {},
        )
        token = _MODEL.set(call)
        try:
            response = await self._model_onion(request, ctx)
        finally:
            _MODEL.reset(token)
        if response.usage is not None and not response.control_only:
            ctx.usage.add(response.model or request.model, response.usage)
        after = conversation.messages
        committed = after if after is not before and after != before else None
        control = stronger(response.control, ctx.take_control())
        return StackCall(response, committed, control)

    async def call_tool(
        self,
        thread_id: str,
        call: ToolCall,
        run: FrameworkTool,
        *,
        spec: ToolSpec | None = None,
    ) -> ToolResult:
        """Run the tool onion for ``call``, with ``run`` (the framework's tool) at its centre
        (``spec``, the tool's schema, lets layers look the tool up)."""
        ctx = self.context(thread_id)
        if spec is not None:
            _know(ctx, (spec,))
        token = _TOOL.set(run)
        try:
            return await self._tool_onion(call, ctx)
        finally:
            _TOOL.reset(token)

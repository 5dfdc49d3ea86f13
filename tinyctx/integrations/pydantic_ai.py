"""A tinyctx stack inside a pydantic-ai agent: :class:`TinyctxCapability` and
:func:`history_processor`.

``Agent(model, capabilities=[TinyctxCapability(default_stack(), max_tokens=...)])`` runs
the stack's model onion around every model request of the agent (pydantic-ai's
``wrap_model_request``), with the history converted losslessly
(:mod:`tinyctx.integrations.pydantic_ai_messages`):

- the response's usage goes back through the onion, so the budget guard calibrates its
  estimate on what the provider counted;
- a **persistent** rewrite (a relief the guard commits, a summary) replaces the run's
  message history (``ctx.messages``), so ``result.all_messages()`` and whatever the
  application stores from it hold what tinyctx committed; a **transient** one changes only
  what this request sends;
- ``StopWithFinal(text)`` answers the request with ``text`` (a text response: the run ends
  with it when the output is text); ``Interrupt`` has no pydantic-ai equivalent outside
  deferred tools and raises :class:`~tinyctx.integrations.StackInterrupted`.

:func:`history_processor` is the lighter variant, a history processor
(``capabilities=[ProcessHistory(history_processor(...))]``): the
stack runs on the history before each request, with no model at its centre, so its
layers see no response (no usage for calibration, no control outcomes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import (
    ValidatedToolArgs,
    WrapModelRequestHandler,
    WrapToolExecuteHandler,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, TextPart, ToolCallPart
from pydantic_ai.messages import ModelResponse as PAResponse
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import RunContext as PARunContext
from pydantic_ai.tools import ToolDefinition

from ..chain import LayerLike
from ..control import Interrupt, StopWithFinal
from ..events import EventSink
from ..messages import AssistantMessage, Message, ToolCall, ToolResult
from ..model import ModelRequest, ModelResponse
from ..threads import ThreadStore
from ..tools import ToolSpec
from ._stack import Stack, StackInterrupted
from ._text import json_text
from ._threads import read_thread, write_thread
from .pydantic_ai_messages import from_pydantic_ai, to_pydantic_ai, usage_from_pydantic_ai

__all__ = [
    "TinyctxCapability",
    "history_processor",
    "DEFAULT_THREAD",
    "import_json",
    "export_json",
]

DEFAULT_THREAD = "default"
"""The thread of a run without a ``conversation_id``."""


def _thread(ctx: PARunContext[Any]) -> str:
    return ctx.conversation_id or DEFAULT_THREAD


def _specs(request_context: ModelRequestContext) -> tuple[ToolSpec, ...]:
    specs = []
    for tool in request_context.model_request_parameters.function_tools:
        try:
            specs.append(ToolSpec(tool.name, tool.description or "", tool.parameters_json_schema))
        except (TypeError, ValueError):
            continue
    return tuple(specs)


def _stack(
    layers: Sequence[LayerLike],
    max_tokens: int | None,
    reserved_output_tokens: int,
    model: str | None,
    events: EventSink | None,
) -> Stack:
    return Stack(
        layers,
        max_tokens=max_tokens,
        reserved_output_tokens=reserved_output_tokens,
        model=model,
        events=events,
    )


class TinyctxCapability(AbstractCapability[Any]):
    """Runs tinyctx ``layers`` around each model request of a pydantic-ai agent.

    ``max_tokens``, ``reserved_output_tokens`` and ``model`` set the window the budget
    guard keeps every request inside; layer state is kept per ``conversation_id``.
    """

    def __init__(
        self,
        layers: Sequence[LayerLike],
        *,
        max_tokens: int | None = None,
        reserved_output_tokens: int = 0,
        model: str | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.stack = _stack(layers, max_tokens, reserved_output_tokens, model, events)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built from layer objects, not from a spec

    async def wrap_model_request(
        self,
        ctx: PARunContext[Any],
        *,
        request_context: ModelRequestContext,
        handler: WrapModelRequestHandler,
    ) -> PAResponse:
        """The stack's model onion around pydantic-ai's ``handler``."""

        async def call(tiny: ModelRequest) -> ModelResponse:
            sent = dataclasses.replace(request_context, messages=to_pydantic_ai(tiny.messages))
            response = await handler(sent)
            (message,) = from_pydantic_ai([response])
            assert isinstance(message, AssistantMessage)
            return ModelResponse(
                message,
                usage=usage_from_pydantic_ai(response),
                model=response.model_name,
                raw=response,
            )

        outcome = await self.stack.call_model(
            _thread(ctx),
            from_pydantic_ai(request_context.messages),
            call,
            tools=_specs(request_context),
        )
        if isinstance(outcome.control, Interrupt):
            raise StackInterrupted(outcome.control)
        if outcome.committed is not None:
            ctx.messages[:] = to_pydantic_ai(outcome.committed)
        response = outcome.response
        if isinstance(outcome.control, StopWithFinal):
            return PAResponse(parts=[TextPart(outcome.control.text)])
        raw = response.raw
        if isinstance(raw, PAResponse) and from_pydantic_ai([raw]) == (response.message,):
            return raw
        (rebuilt,) = to_pydantic_ai([response.message])  # a layer answered or edited it
        assert isinstance(rebuilt, PAResponse)
        return rebuilt

    async def wrap_tool_execute(
        self,
        ctx: PARunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        """The stack's tool onion around the tool's execution (the tool-result budget cuts
        a long result here). A result that is not text passes through unchanged unless a
        layer rewrote it (then the rewrite's text is the result)."""
        tiny_call = ToolCall(call.tool_call_id, call.tool_name, call.args_as_dict())
        outputs: list[Any] = []
        made: list[ToolResult] = []

        async def run(tiny: ToolCall) -> ToolResult:
            output = await handler(args)
            outputs.append(output)
            text = output if isinstance(output, str) else json_text(output)
            made.append(ToolResult.for_call(tiny, text))
            return made[-1]

        result = await self.stack.call_tool(_thread(ctx), tiny_call, run)
        if outputs and made and result == made[-1]:
            return outputs[-1]
        return result.describe()


def history_processor(
    layers: Sequence[LayerLike],
    *,
    max_tokens: int | None = None,
    reserved_output_tokens: int = 0,
    model: str | None = None,
    events: EventSink | None = None,
) -> Callable[[PARunContext[Any], list[ModelMessage]], Awaitable[list[ModelMessage]]]:
    """A pydantic-ai history processor running ``layers`` on the history before each
    request: it returns what the layers would send (pydantic-ai keeps it as the run's
    history). No model sits at the stack's centre, so layers see an empty answer."""
    stack = _stack(layers, max_tokens, reserved_output_tokens, model, events)

    async def process(ctx: PARunContext[Any], messages: list[ModelMessage]) -> list[ModelMessage]:
        sent: list[ModelRequest] = []

        async def call(tiny: ModelRequest) -> ModelResponse:
            sent.append(tiny)
            return ModelResponse(AssistantMessage(""))

        outcome = await stack.call_model(_thread(ctx), from_pydantic_ai(messages), call)
        if outcome.committed is not None and not sent:
            return to_pydantic_ai(outcome.committed)
        if not sent:  # a layer answered instead: send the history as it is
            return messages
        return to_pydantic_ai(sent[-1].messages)

    return process


async def import_json(data: str | bytes, store: ThreadStore, thread_id: str) -> tuple[Message, ...]:
    """Copy a pydantic-ai JSON message history (``result.all_messages_json()``, or
    ``ModelMessagesTypeAdapter.dump_json``) into the tinyctx thread ``thread_id``."""
    messages = from_pydantic_ai(ModelMessagesTypeAdapter.validate_json(data))
    await write_thread(store, thread_id, messages)
    return messages


async def export_json(store: ThreadStore, thread_id: str) -> bytes:
    """The tinyctx thread ``thread_id`` as pydantic-ai JSON message history (what
    ``ModelMessagesTypeAdapter.validate_json`` reads, and ``message_history=`` takes)."""
    messages = to_pydantic_ai(await read_thread(store, thread_id))
    return ModelMessagesTypeAdapter.dump_json(messages)

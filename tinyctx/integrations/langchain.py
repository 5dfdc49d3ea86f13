"""A tinyctx stack inside LangChain's ``create_agent``: :class:`TinyctxMiddleware`.

``create_agent(model, tools, middleware=[TinyctxMiddleware(default_stack(), max_tokens=...)])``
runs the stack's model onion around every model call (``awrap_model_call``, and
``wrap_model_call`` for a synchronous ``invoke``) and its tool onion around every tool
call (``awrap_tool_call`` / ``wrap_tool_call``), with the agent's messages converted
losslessly (:mod:`tinyctx.integrations.langchain_messages`).

- A **transient** rewrite (a layer that changes only the request) changes what this model
  call sends; the graph's messages stay as they were.
- A **persistent** rewrite (a layer that commits with ``ctx.conversation.replace``: the
  budget guard's relief with ``persist=True``, a summary) is written back into the graph's
  ``messages`` (an ``ExtendedModelResponse`` whose command replaces them), so the
  checkpointer stores what tinyctx committed and the next call starts from it.
- Control outcomes: ``StopWithFinal(text)`` ends the run with ``text`` as the final
  ``AIMessage`` (without tool calls, so the agent's loop ends and no call is left
  unanswered); ``Interrupt`` becomes a LangGraph ``interrupt`` whose value is
  ``{"node", "message", "payload"}`` (a checkpointer is needed; resuming the graph runs
  the model node again). A tool layer's control request is applied at the next model call.

Layer state (the guard's calibration, breakers) is kept per LangGraph ``thread_id`` for
the life of the middleware (the process); the graph's checkpointer is the durable store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import anyio
from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
)
from langchain.agents.middleware.types import (
    ModelRequest as LCModelRequest,
)
from langchain.agents.middleware.types import (
    ModelResponse as LCModelResponse,
)
from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, SystemMessage
from langchain_core.messages import ToolCall as LCToolCall
from langchain_core.messages import ToolMessage as LCToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.config import get_config
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from ..chain import LayerLike
from ..control import Interrupt, StopWithFinal
from ..events import EventSink
from ..frozen import thaw
from ..messages import AssistantMessage, Message, ToolCall, ToolResult
from ..model import ModelRequest, ModelResponse
from ..threads import ThreadStore
from ..tools import ToolSpec
from ._stack import Stack, StackCall
from ._threads import read_thread, write_thread
from .langchain_messages import (
    from_langchain,
    from_langchain_message,
    to_langchain,
    to_langchain_message,
    usage_from_langchain,
)

__all__ = ["TinyctxMiddleware", "DEFAULT_THREAD", "import_langgraph", "export_langgraph"]

DEFAULT_THREAD = "default"
"""The thread of a graph run without a ``thread_id`` in its config."""

ModelHandler = Callable[[LCModelRequest[Any]], Awaitable[LCModelResponse[Any]]]
ToolHandler = Callable[[ToolCallRequest], Awaitable[LCToolMessage | Command[Any]]]


def _tool_specs(tools: Sequence[Any]) -> tuple[ToolSpec, ...]:
    """The model-visible schema of the request's tools (counted by the budget guard);
    a provider-hosted tool without a function schema is left out."""
    specs: list[ToolSpec] = []
    for tool in tools:
        try:
            function = convert_to_openai_tool(tool)["function"]
            specs.append(
                ToolSpec(
                    function["name"],
                    function.get("description") or "",
                    function.get("parameters") or {"type": "object", "properties": {}},
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(specs)


def _thread_id() -> str:
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:  # called outside a graph run
        return DEFAULT_THREAD
    thread = configurable.get("thread_id")
    return str(thread) if thread is not None else DEFAULT_THREAD


def _same_messages(sent: Sequence[Message], read: tuple[Message, ...]) -> bool:
    """Whether the layers sent the messages read from LangChain's request unchanged (the
    stack's kept objects for the same messages are equal to them), so nothing needs
    writing back."""
    if sent is read:
        return True
    return len(sent) == len(read) and all(a is b or a == b for a, b in zip(sent, read, strict=True))


def _answer(result: list[BaseMessage]) -> AIMessage:
    for message in result:
        if isinstance(message, AIMessage):
            return message
    raise TypeError("the model handler returned no AIMessage")


class TinyctxMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Runs tinyctx ``layers`` around each model and tool call of a LangChain agent.

    ``max_tokens``, ``reserved_output_tokens`` and ``model`` set the context window the
    budget guard keeps every request inside; ``events`` receives the layers' events.
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
        super().__init__()
        self.stack = Stack(
            layers,
            max_tokens=max_tokens,
            reserved_output_tokens=reserved_output_tokens,
            model=model,
            events=events,
        )

    @property
    def name(self) -> str:
        return "TinyctxMiddleware"

    # -- model calls -----------------------------------------------------------------------

    async def awrap_model_call(
        self, request: LCModelRequest[Any], handler: ModelHandler
    ) -> LCModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """The stack's model onion around LangChain's ``handler``."""

        history = from_langchain(request.messages)

        async def call(tiny: ModelRequest) -> ModelResponse:
            changes: dict[str, Any] = {}
            if not _same_messages(tiny.messages, history):
                changes["messages"] = to_langchain(tiny.messages)
            # else the layers sent the history as read: LangChain's own messages go on
            if tiny.system_prompt != request.system_prompt:
                prompt = tiny.system_prompt
                changes["system_message"] = SystemMessage(prompt) if prompt is not None else None
            response = await handler(request.override(**changes))
            answer = _answer(response.result)
            message = from_langchain_message(answer)
            assert isinstance(message, AssistantMessage)
            model = answer.response_metadata.get("model_name")
            return ModelResponse(
                message,
                usage=usage_from_langchain(answer),
                model=model if isinstance(model, str) else None,
                raw=response,
            )

        outcome = await self.stack.call_model(
            _thread_id(),
            history,
            call,
            system_prompt=request.system_prompt,
            tools=_tool_specs(request.tools),
        )
        return self._result(outcome)

    def wrap_model_call(
        self,
        request: LCModelRequest[Any],
        handler: Callable[[LCModelRequest[Any]], LCModelResponse[Any]],
    ) -> LCModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """The same for a synchronous ``invoke`` (the stack runs in its own event loop)."""

        async def async_handler(inner: LCModelRequest[Any]) -> LCModelResponse[Any]:
            return handler(inner)

        return anyio.run(partial(self.awrap_model_call, request, async_handler))

    def _result(
        self, outcome: StackCall
    ) -> LCModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        response = outcome.response
        control = outcome.control
        if isinstance(control, Interrupt):
            # plain JSON data (a payload is deep-frozen): the checkpointer serializes it
            value = {"node": control.node, "message": control.message}
            interrupt({**value, "payload": thaw(control.payload)})
        if isinstance(control, StopWithFinal):
            lc_response: LCModelResponse[Any] = LCModelResponse(result=[AIMessage(control.text)])
        elif isinstance(response.raw, LCModelResponse):
            lc_response = response.raw
            answer = _answer(lc_response.result)
            if from_langchain_message(answer) != response.message:  # a layer edited it
                edited = to_langchain_message(response.message)
                lc_response = LCModelResponse(
                    result=[edited if m is answer else m for m in lc_response.result],
                    structured_response=lc_response.structured_response,
                )
        else:  # a layer answered without calling the model
            lc_response = LCModelResponse(result=[to_langchain_message(response.message)])
        if outcome.committed is None:
            return lc_response
        history = to_langchain(outcome.committed)
        update = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *history, *lc_response.result]
        return ExtendedModelResponse(lc_response, Command(update={"messages": update}))

    # -- tool calls ------------------------------------------------------------------------

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: ToolHandler
    ) -> LCToolMessage | Command[Any]:
        """The stack's tool onion around LangChain's tool ``handler``; a tool that answers
        with a ``Command`` (a state update) passes it through unchanged."""
        raw = request.tool_call
        call = ToolCall(str(raw["id"]), raw["name"], raw.get("args") or {})
        commands: list[Command[Any]] = []

        async def run(tiny: ToolCall) -> ToolResult:
            inner = request
            if tiny != call:
                changed = LCToolCall(name=tiny.name, args=thaw(tiny.arguments), id=raw["id"])
                inner = request.override(tool_call=changed)
            answer = await handler(inner)
            if isinstance(answer, Command):
                commands.append(answer)
                return ToolResult.for_call(tiny, "")
            result = from_langchain_message(answer)
            assert isinstance(result, ToolResult)
            return result

        result = await self.stack.call_tool(_thread_id(), call, run)
        if commands:
            return commands[0]
        message = to_langchain_message(result)
        assert isinstance(message, LCToolMessage)
        return message

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], LCToolMessage | Command[Any]],
    ) -> LCToolMessage | Command[Any]:
        """The same for a synchronous ``invoke``."""

        async def async_handler(inner: ToolCallRequest) -> LCToolMessage | Command[Any]:
            return handler(inner)

        return anyio.run(partial(self.awrap_tool_call, request, async_handler))


# -- history -------------------------------------------------------------------------------


def _graph_config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


async def import_langgraph(
    graph: Any, thread_id: str, store: ThreadStore, *, into: str | None = None
) -> tuple[Message, ...]:
    """Copy the messages of LangGraph thread ``thread_id`` (as ``graph``, a compiled graph
    with a checkpointer such as ``create_agent(...)``, holds them) into the tinyctx thread
    ``into`` (default the same id) of ``store``; returns them."""
    state = await graph.aget_state(_graph_config(thread_id))
    messages = from_langchain(state.values.get("messages") or [])
    await write_thread(store, into or thread_id, messages)
    return messages


async def export_langgraph(
    store: ThreadStore, thread_id: str, graph: Any, *, into: str | None = None
) -> list[BaseMessage]:
    """Make LangGraph thread ``into`` (default the same id) of ``graph`` hold the messages
    of tinyctx thread ``thread_id``; returns them as LangChain messages."""
    messages = to_langchain(await read_thread(store, thread_id))
    update = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *messages]
    await graph.aupdate_state(_graph_config(into or thread_id), {"messages": update})
    return messages

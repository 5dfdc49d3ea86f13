"""A tinyctx stack inside the OpenAI Agents SDK: :class:`TinyctxInputFilter`,
:class:`TinyctxModel` and :class:`~tinyctx.integrations.openai_agents_session.TinyctxSession`.

- ``RunConfig(call_model_input_filter=TinyctxInputFilter(default_stack(), max_tokens=...))``
  runs the stack's model onion on each model call's input (the SDK's items converted
  losslessly, :mod:`tinyctx.integrations.openai_agents_items`) and sends what the layers
  would send. The filter runs before the model, so its layers see an empty answer: no
  usage, no control outcomes (use :class:`TinyctxModel` for those).
- ``Agent(model=TinyctxModel(model, default_stack(), max_tokens=...))`` puts the stack
  around the model itself: the layers see the real response, its usage calibrates the
  budget guard, ``StopWithFinal(text)`` answers with ``text`` and an ``Interrupt`` raises
  :class:`~tinyctx.integrations.StackInterrupted`, except a review of wrapped tools, which
  the SDK holds as its own approval interruption.
- ``session=TinyctxSession(session_id, store)`` keeps the conversation in tinyctx's thread
  stores, written under the thread's lease (``async with session:`` holds it for a run).
- ``tools=model.wrap_tools([...])`` (or the filter's) runs the stack's tool layers around
  the SDK's function tools, and makes a review by ``Approvals`` the SDK's own approval
  interruption (:mod:`tinyctx.integrations.openai_agents_tools`).

A persistent rewrite the layers commit is remembered per thread, so the next calls of the
run (whose items the SDK still holds unrewritten) send the committed history plus what
came after it, and the prompt-cache prefix stays stable; given ``session=``, the rewrite of
the stored part of the conversation is also recorded in the thread as a compaction (the
originals archived), so the next run starts from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs
from agents.items import ModelResponse as AgentsResponse
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.run_config import CallModelData, ModelInputData
from agents.tool import FunctionTool
from agents.usage import Usage as AgentsUsage

from ..chain import LayerLike
from ..control import Interrupt, StopWithFinal
from ..errors import ConfigError
from ..events import EventSink
from ..messages import AssistantMessage, Message
from ..model import ModelRequest, ModelResponse, Usage
from ..providers._responses_items import assistant_from_output
from ..tools import ToolSpec
from ._stack import Stack, StackInterrupted
from .openai_agents_items import from_agents_items, plain_item, to_agents_items
from .openai_agents_session import TinyctxSession
from .openai_agents_tools import ThreadOf, gated, review_calls, wrap_tools

__all__ = ["TinyctxInputFilter", "TinyctxModel", "TinyctxSession", "DEFAULT_THREAD"]

DEFAULT_THREAD = "default"
"""The thread of a filter or model given no thread and no session."""


@attrs.frozen
class _Commit:
    """A committed rewrite: the history the framework's ``items`` say became ``committed``."""

    items: tuple[dict[str, Any], ...]
    committed: tuple[Message, ...]


class _Committing:
    """What the filter and the model share: the stack, and each thread's last commit."""

    def __init__(
        self,
        layers: Sequence[LayerLike],
        max_tokens: int | None,
        reserved_output_tokens: int,
        model: str | None,
        events: EventSink | None,
        session: TinyctxSession | None,
    ) -> None:
        self.stack = Stack(
            layers,
            max_tokens=max_tokens,
            reserved_output_tokens=reserved_output_tokens,
            model=model,
            events=events,
        )
        self.session = session
        self._commits: dict[str, _Commit] = {}

    def history(
        self, thread: str, items: Sequence[Any]
    ) -> tuple[tuple[dict[str, Any], ...], tuple[Message, ...], int]:
        """The framework's items (plain), and the history to send: the thread's last commit
        in place of the items it replaced, else the items as messages (the session's own
        messages for its stored part, so tinyctx's metadata is intact); and how many of its
        leading messages are the session's stored ones (0 after a commit)."""
        plain = tuple(plain_item(item, i) for i, item in enumerate(items))
        commit = self._commits.get(thread)
        if commit is not None and plain[: len(commit.items)] == commit.items:
            return plain, (*commit.committed, *from_agents_items(plain[len(commit.items) :])), 0
        stored: tuple[Message, ...] = ()
        rest = list(plain)
        session = self.session
        if session is not None and session.messages:
            written = to_agents_items(session.messages)
            if rest[: len(written)] == written:
                stored = session.messages
                rest = rest[len(written) :]
        return plain, (*stored, *self._tail(stored, rest)), len(stored)

    @staticmethod
    def _tail(stored: tuple[Message, ...], plain: list[dict[str, Any]]) -> tuple[Message, ...]:
        if not stored:
            return from_agents_items(plain)
        context = to_agents_items(stored)  # a result may answer a stored call
        return from_agents_items([*context, *plain])[len(stored) :]

    async def remember(
        self,
        thread: str,
        items: tuple[dict[str, Any], ...],
        sent: tuple[Message, ...],
        committed: tuple[Message, ...] | None,
        stored: int,
    ) -> None:
        """Keep a commit for the thread's next calls; with a session, record the rewrite
        of its stored part as a compaction when it left the unsaved tail as it was."""
        if committed is None:
            return
        self._commits[thread] = _Commit(items, committed)
        if self.session is None or not stored:
            return
        tail = sent[stored:]
        keep = len(committed) - len(tail)
        if keep >= 0 and committed[keep:] == tail:
            await self.session.commit(sent[:stored], committed[:keep])


def _thread_of(
    thread_id: str | Callable[[CallModelData[Any]], str] | None, session: TinyctxSession | None
) -> Callable[[CallModelData[Any]], str]:
    if callable(thread_id):
        return thread_id
    fixed = thread_id or (session.session_id if session is not None else DEFAULT_THREAD)
    return lambda data: fixed


class TinyctxInputFilter:
    """A ``call_model_input_filter`` running tinyctx ``layers`` on each model call's input.

    ``thread_id`` names the thread whose layer state a call uses (a string, or a function
    of the ``CallModelData``; default: the session's id, else ``"default"``)."""

    def __init__(
        self,
        layers: Sequence[LayerLike],
        *,
        max_tokens: int | None = None,
        reserved_output_tokens: int = 0,
        model: str | None = None,
        events: EventSink | None = None,
        session: TinyctxSession | None = None,
        thread_id: str | Callable[[CallModelData[Any]], str] | None = None,
    ) -> None:
        self._shared = _Committing(
            layers, max_tokens, reserved_output_tokens, model, events, session
        )
        self.stack = self._shared.stack
        self._thread = _thread_of(thread_id, session)
        self._fixed = thread_id if isinstance(thread_id, str) else None
        if thread_id is None:
            self._fixed = session.session_id if session is not None else DEFAULT_THREAD

    def wrap_tools(self, tools: Sequence[Any], *, thread_id: ThreadOf | None = None) -> list[Any]:
        """The SDK tools ``tools`` with this stack's tool layers and review around them
        (:func:`~tinyctx.integrations.openai_agents_tools.wrap_tools`); ``thread_id``
        defaults to the filter's own thread (needed when that is a function)."""
        thread = thread_id if thread_id is not None else self._fixed
        if thread is None:
            raise ConfigError(
                "thread_id",
                thread_id,
                "a thread id or a function of the tool's context, when the filter's own "
                "thread_id is a function of CallModelData",
                owner="TinyctxInputFilter.wrap_tools",
            )
        return wrap_tools(tools, self.stack, thread_id=thread)

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        thread = self._thread(data)
        items, history, stored = self._shared.history(thread, data.model_data.input)
        sent: list[ModelRequest] = []

        async def call(request: ModelRequest) -> ModelResponse:
            sent.append(request)
            return ModelResponse(AssistantMessage(""))

        outcome = await self.stack.call_model(
            thread, history, call, system_prompt=data.model_data.instructions
        )
        await self._shared.remember(thread, items, history, outcome.committed, stored)
        request = sent[-1] if sent else ModelRequest(history, system_prompt=None)
        sent_items: Any = to_agents_items(request.messages)
        return ModelInputData(input=sent_items, instructions=request.system_prompt)


def _usage(usage: AgentsUsage) -> Usage:
    return Usage(
        usage.input_tokens,
        usage.output_tokens,
        usage.input_tokens_details.cached_tokens or 0,
        reasoning_tokens=usage.output_tokens_details.reasoning_tokens or 0,
    )


class TinyctxModel(Model):
    """An Agents SDK ``Model`` that runs tinyctx ``layers`` around ``model``."""

    def __init__(
        self,
        model: Model,
        layers: Sequence[LayerLike],
        *,
        max_tokens: int | None = None,
        reserved_output_tokens: int = 0,
        model_name: str | None = None,
        events: EventSink | None = None,
        session: TinyctxSession | None = None,
        thread_id: str | None = None,
    ) -> None:
        self.model = model
        self._shared = _Committing(
            layers, max_tokens, reserved_output_tokens, model_name, events, session
        )
        self.stack = self._shared.stack
        self._thread = thread_id or (session.session_id if session is not None else DEFAULT_THREAD)

    def wrap_tools(self, tools: Sequence[Any]) -> list[Any]:
        """The SDK tools ``tools`` with this stack's tool layers and review around them, on
        this model's thread (:func:`~tinyctx.integrations.openai_agents_tools.wrap_tools`)."""
        return wrap_tools(tools, self.stack, thread_id=self._thread)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> AgentsResponse:
        """The stack's model onion around the wrapped model's ``get_response``."""
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        plain, history, stored = self._shared.history(self._thread, items)

        async def call(request: ModelRequest) -> ModelResponse:
            sent: Any = to_agents_items(request.messages)
            response = await self.model.get_response(request.system_prompt, sent, *args, **kwargs)
            output = [plain_item(item, i) for i, item in enumerate(response.output)]
            message = assistant_from_output(output)
            return ModelResponse(message, usage=_usage(response.usage), raw=response)

        tools = _sdk_tools(args, kwargs)
        outcome = await self.stack.call_model(
            self._thread, history, call, system_prompt=system_instructions, tools=_specs(tools)
        )
        control = outcome.control
        if isinstance(control, Interrupt) and not self._sdk_reviews(control, tools):
            raise StackInterrupted(control)
        await self._shared.remember(self._thread, plain, history, outcome.committed, stored)
        if isinstance(outcome.control, StopWithFinal):
            return _answer(outcome.control.text)
        raw = outcome.response.raw
        if isinstance(raw, AgentsResponse):
            return raw
        return _answer(outcome.response.message.content)

    def _sdk_reviews(self, control: Interrupt, tools: Sequence[Any]) -> bool:
        """Whether ``control`` is a review of calls the SDK will hold for approval itself
        (each of a tool wrapped by :meth:`wrap_tools`): the response goes on to the SDK."""
        calls = review_calls(control.payload)
        if calls is None:
            return False
        names = gated(tools, self.stack)
        return all(call.get("name") in names for call in calls)

    def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """Streaming passes through to the wrapped model (use the input filter for a
        streamed run: it runs on every call, streamed or not)."""
        return self.model.stream_response(system_instructions, input, *args, **kwargs)


def _sdk_tools(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Sequence[Any]:
    """The ``tools`` argument of ``Model.get_response`` (the fourth, after the settings)."""
    tools = args[1] if len(args) > 1 else kwargs.get("tools")
    return tools if isinstance(tools, list | tuple) else ()


def _specs(tools: Sequence[Any]) -> tuple[ToolSpec, ...]:
    """The model-visible schema of the run's function tools (counted by the budget guard)."""
    specs = []
    for tool in tools:
        if isinstance(tool, FunctionTool):
            specs.append(ToolSpec(tool.name, tool.description, tool.params_json_schema))
    return tuple(specs)


def _answer(text: str) -> AgentsResponse:
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    message = ResponseOutputMessage(
        id="tinyctx-answer",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
    )
    return AgentsResponse(output=[message], usage=AgentsUsage(), response_id=None)

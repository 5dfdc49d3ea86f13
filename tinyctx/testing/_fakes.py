"""Fake models and tools, event capture, and drivers that run one layer in isolation."""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeAlias

import anyio
from attrs import frozen

from ..chain import Layer, LayerLike, ModelCall, ToolCallHandler, compose
from ..context import RunContext
from ..control import Interrupt, StopWithFinal
from ..conversation import Conversation
from ..events import Event, EventSink, ModelStreamDelta, add_tap
from ..frozen import thaw
from ..messages import AssistantMessage, Message, ToolCall, ToolResult
from ..model import ModelRequest, ModelResponse, Usage
from ..tools import Tool

__all__ = [
    "HANG",
    "ScriptedModel",
    "ScriptExhausted",
    "Stream",
    "stream",
    "assemble_stream",
    "EchoModel",
    "FakeTool",
    "reply",
    "call",
    "capture_events",
    "quiet_context",
    "run_layer",
    "run_tool_layer",
    "MODEL_CALL_CHECKPOINT",
    "STREAM_CHECKPOINT",
    "TOOL_CALL_CHECKPOINT",
]

MODEL_CALL_CHECKPOINT = "model_call"
"""The checkpoint a RunCancelled names when a hanging scripted model call is cancelled."""
STREAM_CHECKPOINT = "model_stream"
"""The checkpoint a RunCancelled names when a scripted stream is cancelled between chunks."""
TOOL_CALL_CHECKPOINT = "tool_call"
"""The checkpoint a RunCancelled names when a hanging fake tool is cancelled."""

Control: TypeAlias = StopWithFinal | Interrupt

_call_ids = itertools.count(1)


def call(name: str, /, id: str | None = None, **arguments: Any) -> ToolCall:
    """A ToolCall with a fresh id: ``call("search", q="tinyctx")``."""
    return ToolCall(id or f"call_{next(_call_ids)}", name, arguments)


def reply(
    text: str = "",
    *calls: ToolCall,
    usage: Usage | tuple[int, int] | None = None,
    control: Control | None = None,
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
"""Never answers until the run's cancellation token (or an outer cancel scope) ends the wait.

A script item of :class:`ScriptedModel`, a chunk of :func:`stream`, or a value of
:class:`FakeTool`: a cancelled token raises ``RunCancelled`` from the wait.
"""


async def _hang(ctx: RunContext[Any], checkpoint: str) -> None:
    with ctx.cancellation.linked_scope(checkpoint):
        await anyio.sleep_forever()


# ---------------------------------------------------------------------------------------
# streaming

StreamChunk: TypeAlias = "ModelStreamDelta | BaseException | _Hang"
StreamPart: TypeAlias = (
    "str | ToolCall | AssistantMessage | ModelResponse | ModelStreamDelta | BaseException | _Hang"
)


@frozen(eq=False)
class Stream:
    """A script item that delivers a response as chunks (build it with :func:`stream`).

    Each chunk is a :class:`tinyctx.events.ModelStreamDelta` emitted on the run's event sink,
    :data:`HANG` (wait until cancelled) or an exception (the stream breaks there).
    ``message`` is what the deltas assemble to: the response once the stream completes.
    """

    chunks: tuple[StreamChunk, ...]
    message: AssistantMessage
    usage: Usage | None = None
    control: Control | None = None
    model: str | None = None

    @property
    def deltas(self) -> tuple[ModelStreamDelta, ...]:
        return tuple(c for c in self.chunks if isinstance(c, ModelStreamDelta))


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _call_deltas(call: ToolCall, index: int, size: int) -> list[ModelStreamDelta]:
    raw = call.invalid_arguments
    if raw is None:
        raw = json.dumps(thaw(call.arguments), ensure_ascii=False) if call.arguments else ""
    head = ModelStreamDelta(tool_call_index=index, tool_call_id=call.id, tool_name=call.name)
    return [
        head,
        *(ModelStreamDelta(tool_call_index=index, arguments_delta=p) for p in _pieces(raw, size)),
    ]


def stream(
    *parts: StreamPart,
    usage: Usage | tuple[int, int] | None = None,
    control: Control | None = None,
    model: str | None = None,
    chunk_size: int = 8,
) -> Stream:
    """A streamed response for :class:`ScriptedModel`, chunk by chunk.

    Parts, in order: a string is one text delta; a :class:`ToolCall` is a delta with its
    index, id and name followed by its JSON arguments in ``chunk_size``-character
    fragments; an ``AssistantMessage`` or ``ModelResponse`` is its text in
    ``chunk_size``-character deltas and then its calls (a response also gives the default
    usage, control and model); a ``ModelStreamDelta`` is delivered as given; :data:`HANG`
    waits there until the run is cancelled; an exception breaks the stream there.

    ``stream("It is ", "an onion.")``, ``stream(reply("", call("search", q="x")))``,
    ``stream("Hel", HANG)``, ``stream("Hel", ConnectionError("reset"))``.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"stream: chunk_size must be an integer >= 1, got {chunk_size!r}")
    chunks: list[StreamChunk] = []
    next_index = 0
    for part in parts:
        if isinstance(part, str):
            if part:
                chunks.append(ModelStreamDelta(text=part))
        elif isinstance(part, ToolCall):
            chunks.extend(_call_deltas(part, next_index, chunk_size))
            next_index += 1
        elif isinstance(part, (AssistantMessage, ModelResponse)):
            message = part if isinstance(part, AssistantMessage) else part.message
            if isinstance(part, ModelResponse):
                usage = usage if usage is not None else part.usage
                control = control if control is not None else part.control
                model = model if model is not None else part.model
            chunks.extend(ModelStreamDelta(text=p) for p in _pieces(message.content, chunk_size))
            for tool_call in message.tool_calls:
                chunks.extend(_call_deltas(tool_call, next_index, chunk_size))
                next_index += 1
        elif isinstance(part, ModelStreamDelta):
            chunks.append(part)
            if part.tool_call_index is not None:
                next_index = max(next_index, part.tool_call_index + 1)
        elif isinstance(part, (_Hang, BaseException)):
            chunks.append(part)
        else:
            raise TypeError(
                "stream parts are str, ToolCall, AssistantMessage, ModelResponse, "
                f"ModelStreamDelta, HANG or an exception; got {type(part).__name__}"
            )
    deltas = [c for c in chunks if isinstance(c, ModelStreamDelta)]
    return Stream(
        tuple(chunks),
        assemble_stream(deltas),
        usage=Usage(*usage) if isinstance(usage, tuple) else usage,
        control=control,
        model=model,
    )


def assemble_stream(deltas: Iterable[ModelStreamDelta]) -> AssistantMessage:
    """The assistant message a sequence of stream deltas adds up to.

    Text deltas concatenate; tool-call deltas group by ``tool_call_index`` (id and name
    from the first delta that carries them, arguments concatenated). Arguments that do not
    parse as a JSON object land in ``ToolCall.invalid_arguments``, as a provider adapter
    would report them. Use it to rebuild a response from captured events.
    """
    text: list[str] = []
    calls: dict[int, tuple[list[str | None], list[str]]] = {}
    for delta in deltas:
        text.append(delta.text)
        index = delta.tool_call_index
        if index is None:
            if delta.tool_call_id or delta.tool_name or delta.arguments_delta:
                raise ValueError(f"stream delta {delta!r} has tool-call fields but no index")
            continue
        names, fragments = calls.setdefault(index, ([None, None], []))
        for slot, value in enumerate((delta.tool_call_id, delta.tool_name)):
            if value:
                if names[slot] not in (None, value):
                    raise ValueError(
                        f"stream: tool call {index} changes its id/name from {names[slot]!r} "
                        f"to {value!r}"
                    )
                names[slot] = value
        fragments.append(delta.arguments_delta)
    tool_calls: list[ToolCall] = []
    for index in sorted(calls):
        (call_id, name), fragments = calls[index]
        if not call_id or not name:
            raise ValueError(f"stream: tool call {index} never received an id and a name")
        raw = "".join(fragments)
        try:
            parsed = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            tool_calls.append(ToolCall(call_id, name, parsed))
        else:
            tool_calls.append(ToolCall(call_id, name, invalid_arguments=raw))
    return AssistantMessage("".join(text), tuple(tool_calls))


# ---------------------------------------------------------------------------------------
# scripted model

ScriptItem: TypeAlias = (
    "ModelResponse | AssistantMessage | str | Stream | BaseException | _Hang | "
    "Callable[[ModelRequest, RunContext[Any]], Any]"
)


class ScriptExhausted(AssertionError):
    """The test's script ran out: the code under test called more often than expected."""


class ScriptedModel:
    """A model handler that plays a script and records every request it receives.

    Script items: a ModelResponse, an AssistantMessage, a plain string (a final answer), a
    :func:`stream`, an exception instance (raised), :data:`HANG`, or a function
    ``(request, ctx) -> item`` (sync or async) that decides at call time. ``repeat_last``
    replays the last item once the script is used up instead of raising
    :class:`ScriptExhausted`.
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
        """Append items to the script (chainable)."""
        self._script.extend(items)
        return self

    @property
    def calls(self) -> int:
        return len(self.requests)

    @property
    def remaining(self) -> int:
        """Script items not played yet."""
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
        item: Any = self._next()
        await anyio.lowlevel.checkpoint()
        while callable(item) and not isinstance(item, (BaseException, _Hang)):
            item = item(request, ctx)  # a function may return any item, another one included
            if inspect.isawaitable(item):
                item = await item
        if isinstance(item, _Hang):
            await _hang(ctx, MODEL_CALL_CHECKPOINT)
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Stream):
            return await self._play(item, request, ctx)
        return self._response(item, request)

    def _response(self, item: object, request: ModelRequest) -> ModelResponse:
        if isinstance(item, ModelResponse):
            return item
        if isinstance(item, str):
            item = AssistantMessage(item)
        if isinstance(item, AssistantMessage):
            return ModelResponse(item, model=request.model or self.name)
        raise TypeError(
            f"ScriptedModel {self.name!r}: a script item (or what its function returned) must "
            "be a ModelResponse, AssistantMessage, str, stream(...), an exception or HANG; "
            f"got {type(item).__name__}"
        )

    async def _play(
        self, item: Stream, request: ModelRequest, ctx: RunContext[Any]
    ) -> ModelResponse:
        # each chunk's arrival is raced against the token; a cancel between chunks raises
        # RunCancelled at the next one, so nothing partial ever reaches the caller
        token = ctx.cancellation
        for chunk in item.chunks:
            with token.linked_scope(STREAM_CHECKPOINT):
                if isinstance(chunk, _Hang):
                    await anyio.sleep_forever()
                await anyio.lowlevel.checkpoint()
            if isinstance(chunk, BaseException):
                raise chunk
            if isinstance(chunk, ModelStreamDelta):
                ctx.emit(chunk)
        with token.linked_scope(STREAM_CHECKPOINT):
            await anyio.lowlevel.checkpoint()  # the end of the stream
        return ModelResponse(
            item.message,
            usage=item.usage,
            control=item.control,
            model=item.model or request.model or self.name,
        )


class EchoModel:
    """Answers with the last user message's text (after a fixed ``prefix``)."""

    def __init__(self, prefix: str = "", usage: Usage | None = None) -> None:
        self.prefix = prefix
        self.usage = usage
        self.requests: list[ModelRequest] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        self.requests.append(request)
        await anyio.lowlevel.checkpoint()
        text = next((m.text for m in reversed(request.messages) if m.role == "user"), "")
        return ModelResponse(
            AssistantMessage(self.prefix + text), usage=self.usage, model=request.model
        )


# ---------------------------------------------------------------------------------------
# fake tool


def _takes_context(fn: Callable[..., Any]) -> bool:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: arguments only
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in positional)


class FakeTool:
    """A tool factory that records calls: ``FakeTool("search", returns="found")``.

    ``returns`` is what every call gives: a string, a :class:`ToolResult`, any JSON-able
    value (sent as JSON), an exception (raised: the model gets an error result),
    :data:`HANG` (waits until the run is cancelled) or a function of ``(arguments)`` or
    ``(arguments, ctx)``, sync or async, whose return value is used. A ``list`` is a
    sequence: call *n* gets item *n* (any of the above), and a call past its end raises
    :class:`ScriptExhausted` (send a JSON list as a tuple). ``control`` is requested on
    every call. ``.tool`` is the :class:`tinyctx.Tool` to hand to an agent.
    """

    def __init__(
        self,
        name: str,
        returns: Any = "ok",
        *,
        description: str = "",
        parameters: Mapping[str, Any] | None = None,
        control: Control | None = None,
    ) -> None:
        self.name = name
        self.calls: list[dict[str, Any]] = []
        self.contexts: list[RunContext[Any]] = []
        self._returns = returns
        self._sequence: list[Any] | None = list(returns) if isinstance(returns, list) else None
        self._control = control
        self.tool = Tool(
            name,
            description or f"fake tool {name}",
            parameters or {"type": "object", "properties": {}, "additionalProperties": True},
            handler=self._handle,
        )

    def _value_for(self, index: int) -> Any:
        if self._sequence is None:
            return self._returns
        if index >= len(self._sequence):
            raise ScriptExhausted(
                f"FakeTool {self.name!r}: {len(self._sequence)} scripted results, "
                f"called {index + 1} times"
            )
        return self._sequence[index]

    async def _handle(self, arguments: Mapping[str, Any], ctx: RunContext[Any]) -> str | ToolResult:
        index = len(self.calls)
        self.calls.append(dict(arguments))
        self.contexts.append(ctx)
        await anyio.lowlevel.checkpoint()
        if self._control is not None:
            ctx.request_control(self._control)
        value = self._value_for(index)
        if callable(value):
            value = value(arguments, ctx) if _takes_context(value) else value(arguments)
            if inspect.isawaitable(value):
                value = await value
        if isinstance(value, _Hang):
            await _hang(ctx, TOOL_CALL_CHECKPOINT)
        if isinstance(value, BaseException):
            raise value
        if isinstance(value, (str, ToolResult)):
            return value
        return json.dumps(thaw(value), ensure_ascii=False, default=str)


# ---------------------------------------------------------------------------------------
# event capture and one-layer drivers


@contextmanager
def capture_events(*only: str | type[Event]) -> Iterator[list[Event]]:
    """Collect every event any sink emits inside the block (like structlog's capture_logs).

    ``only`` keeps events of the given kinds (``"model.call"``) or classes
    (``ModelStreamDelta``).
    """
    captured: list[Event] = []
    kinds = {k for k in only if isinstance(k, str)}
    types = tuple(k for k in only if isinstance(k, type))

    def keep(event: Event) -> None:
        if not only or event.kind in kinds or (types and isinstance(event, types)):
            captured.append(event)

    remove = add_tap(keep)
    try:
        yield captured
    finally:
        remove()


def quiet_context(messages: Iterable[Message] = (), **options: Any) -> RunContext[Any]:
    """A root RunContext whose conversation holds ``messages``; events are not logged.

    ``options`` go to :meth:`tinyctx.RunContext.new` (config, data, stores, tools, ...).
    Events still reach subscribers and :func:`capture_events`.
    """
    history = tuple(messages)
    if history and "conversation" in options:
        raise TypeError("quiet_context: pass messages or a conversation, not both")
    options.setdefault("events", EventSink(logger=None))
    options.setdefault("conversation", Conversation(history))
    return RunContext.new(**options)


async def _default_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    await anyio.lowlevel.checkpoint()
    return ModelResponse(AssistantMessage("ok"), model=request.model)


async def _default_tool(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    await anyio.lowlevel.checkpoint()
    return ToolResult.for_call(call, "ok")


async def run_layer(
    layer: LayerLike,
    request: ModelRequest | Sequence[Message],
    ctx: RunContext[Any] | None = None,
    next: ModelCall | None = None,
) -> ModelResponse:
    """Drive one layer's model hook once, around ``next`` (default: answers "ok").

    ``request`` may be a plain list of messages. Without ``ctx`` the layer gets
    :func:`quiet_context` holding the request's messages, as the loop's first layer sees
    its conversation.
    """
    if not isinstance(request, ModelRequest):
        request = ModelRequest(messages=tuple(request))
    onion = compose([layer], next or _default_model)
    return await onion(request, ctx if ctx is not None else quiet_context(request.messages))


async def run_tool_layer(
    layer: Layer,
    call: ToolCall,
    ctx: RunContext[Any] | None = None,
    next: ToolCallHandler | None = None,
) -> ToolResult:
    """Drive one layer's tool hook once, around ``next`` (default: answers "ok")."""
    onion = compose([layer], next or _default_tool, hook="tool")
    return await onion(call, ctx if ctx is not None else quiet_context())

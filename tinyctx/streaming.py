"""Streaming a run: ``Session.stream(input)`` as an async iterator of typed events.

::

    async with session.stream("What is tinyctx?") as events:
        async for event in events:
            match event:
                case TextDelta(text=text):
                    print(text, end="")
                case FinalResult(result=result):
                    ...

The run goes on in the session's task group and the iterator reads what it emits (the
session's :class:`~tinyctx.events.EventSink` events, turned into the types below), so no
``yield`` ever happens inside a cancel scope. The last item is a :class:`FinalResult`
carrying the :class:`~tinyctx.RunResult` (the same object ``run()`` returns), or a
:class:`RunPaused` carrying the checkpoint of an interrupted run (resume it with
``Session.stream_resume(...)``). A run that fails raises its error from the iterator,
after the events that came before it.

Closing the stream before the end (leaving the ``async with``, ``aclose()``) cancels the run
through its cancellation token: it stops at its next checkpoint with the pairing rule kept,
a durable thread gets its last write, and ``aclose()`` returns once the run has ended, so
the session is ready for the next run. A bare ``async for`` that ``break``s closes the
stream when the iterator is dropped (CPython drops it at once); a later run of the session
waits for the cancelled one to end. While a stream runs, model adapters stream their
responses (:func:`stream_requested`) unless a request's ``settings["stream"]`` says not to.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from attrs import field, frozen

from .errors import Interrupted, RunCancelled
from .events import (
    Event,
    ModelCallFinished,
    ModelStreamDelta,
    RunFinished,
    RunStarted,
    ToolCallFinished,
    ToolCallStarted,
    ToolFailed,
)
from .messages import AssistantMessage, ToolResult

if TYPE_CHECKING:
    from .checkpoint import Checkpoint, RunResult
    from .session import Session

__all__ = [
    "StreamEvent",
    "TextDelta",
    "ReasoningDelta",
    "ToolCallDelta",
    "ToolStarted",
    "ToolFinished",
    "ModelCallDone",
    "LayerAction",
    "RunEvent",
    "RunPaused",
    "FinalResult",
    "RunStream",
    "LAYER_ACTIONS",
    "stream_requested",
]

STREAMED: ContextVar[bool] = ContextVar("tinyctx.streamed", default=False)
"""Whether the code running now is part of a streamed run; background tasks
(:mod:`tinyctx.tasks`) clear it so their work neither streams nor joins that stream."""

LAYER_ACTIONS: tuple[str, ...] = (
    "context.",
    "compaction.",
    "session_memory.",
    "control.",
    "limit.",
    "tool.pending",
    "subagent.",
    "retry.",
    "fallback.",
    "tool_retry.",
    "review.",
    "run.cancelled",
)
"""Event kinds (prefixes) a stream reports as :class:`LayerAction`."""


def stream_requested() -> bool:
    """Whether the code running now is part of a streamed run (:meth:`Session.stream`);
    the model adapters stream their responses then."""
    return STREAMED.get()


# ---------------------------------------------------------------------------------------
# what a stream yields


@frozen
class StreamEvent:
    """Base of what a stream yields. ``run_id`` is the agent run it belongs to: the
    streamed run's, or a sub-agent's run inside it (then ``nested`` is True); ``event`` is
    the event it was made from (None for the final items)."""

    kind: ClassVar[str] = "stream"
    run_id: str = field(default="", kw_only=True)
    nested: bool = field(default=False, kw_only=True)
    event: Event | None = field(default=None, kw_only=True, eq=False, repr=False)


@frozen
class TextDelta(StreamEvent):
    """A piece of the answer's text, as the model writes it."""

    kind: ClassVar[str] = "text"
    text: str


@frozen
class ReasoningDelta(StreamEvent):
    """A piece of the model's reasoning (thinking, a reasoning summary), when streamed."""

    kind: ClassVar[str] = "reasoning"
    text: str


@frozen
class ToolCallDelta(StreamEvent):
    """A streamed piece of a tool call: its id and name first, then JSON fragments."""

    kind: ClassVar[str] = "tool_call_delta"
    index: int
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments_delta: str = ""


@frozen
class ToolStarted(StreamEvent):
    """A tool call starts (the model's answer is complete and in history)."""

    kind: ClassVar[str] = "tool_started"
    tool: str
    tool_call_id: str
    arguments: Any = None


@frozen
class ToolFinished(StreamEvent):
    """A tool call ended; ``result`` is the result as it entered history."""

    kind: ClassVar[str] = "tool_finished"
    tool: str
    tool_call_id: str
    is_error: bool
    result: ToolResult | None = field(default=None, eq=False)


@frozen
class ModelCallDone(StreamEvent):
    """A model call answered (the answer is complete), with what it used."""

    kind: ClassVar[str] = "model_call_done"
    model: str | None
    input_tokens: int | None = None
    output_tokens: int | None = None
    tool_calls: int = 0


@frozen
class LayerAction(StreamEvent):
    """Something a layer or the loop did to the context or the flow: a compaction, a
    summary, a trim, a control applied, a limit reached, a retry (see
    :data:`LAYER_ACTIONS`); ``action`` is the event's kind, ``description`` its label."""

    kind: ClassVar[str] = "layer_action"
    action: str
    description: str | None = None


@frozen
class RunEvent(StreamEvent):
    """Any other event of the run (an MCP connection, a failed thread write...)."""

    kind: ClassVar[str] = "event"
    action: str


@frozen
class RunPaused(StreamEvent):
    """The run was interrupted (an approval, a suspended tool): the last item. Resume it
    with ``session.stream_resume(...)`` (or ``resume``)."""

    kind: ClassVar[str] = "paused"
    checkpoint: Checkpoint = field(eq=False)
    node: str
    message: str


@frozen
class FinalResult(StreamEvent):
    """The run's result, the object ``Session.run`` returns: the last item."""

    kind: ClassVar[str] = "result"
    result: RunResult


_QUIET = (RunStarted, RunFinished, ToolFailed)


def _find_result(session: Session[Any], call_id: str) -> ToolResult | None:
    messages = session.conversation_messages
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, ToolResult) and message.tool_call_id == call_id:
            return message
        if isinstance(message, AssistantMessage) and any(
            c.id == call_id for c in message.tool_calls
        ):
            return None
    return None


def _translate(event: Event, session: Session[Any], run_id: str, nested: bool) -> StreamEvent:
    common: dict[str, Any] = {"run_id": run_id, "nested": nested, "event": event}
    if isinstance(event, ModelStreamDelta):
        if event.tool_call_index is not None:
            return ToolCallDelta(
                event.tool_call_index,
                event.tool_call_id,
                event.tool_name,
                event.arguments_delta,
                **common,
            )
        if event.reasoning:
            return ReasoningDelta(event.reasoning, **common)
        return TextDelta(event.text, **common)
    if isinstance(event, ToolCallStarted):
        return ToolStarted(event.tool, event.tool_call_id, event.arguments, **common)
    if isinstance(event, ToolCallFinished):
        result = _find_result(session, event.tool_call_id)
        return ToolFinished(event.tool, event.tool_call_id, event.is_error, result, **common)
    if isinstance(event, ModelCallFinished):
        return ModelCallDone(
            event.model, event.input_tokens, event.output_tokens, event.tool_calls, **common
        )
    if event.kind.startswith(LAYER_ACTIONS):
        return LayerAction(event.kind, event.describe(), **common)
    return RunEvent(event.kind, **common)


# ---------------------------------------------------------------------------------------
# the feed: the run's events into the stream


class _Shared:
    """What the stream and the task running it share (never the stream itself: a
    dropped stream must be collectable)."""

    __slots__ = ("closed", "done", "scope")

    def __init__(self) -> None:
        self.closed = False
        self.done = anyio.Event()
        self.scope: anyio.CancelScope | None = None


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Feed:
    """The event subscriber: keeps the streamed run's events (its own and its nested
    calls', sub-agent runs marked) and sends them on, translated."""

    __slots__ = ("nested", "parent", "run_id", "send", "session", "shared")

    def __init__(
        self,
        session: Session[Any],
        send: MemoryObjectSendStream[object],
        run_id: str | None,
        shared: _Shared,
    ) -> None:
        self.session = session
        self.send = send
        self.run_id = run_id  # known for a resume; a new run's is its first RunStarted
        self.parent = session.ctx.run_id
        self.nested: set[str] = set()
        self.shared = shared

    def __call__(self, event: Event) -> None:
        if not STREAMED.get():
            return  # emitted by another task: background work, another session's run
        own = self.run_id
        if own is None:
            if not (isinstance(event, RunStarted) and event.parent_run_id == self.parent):
                return
            own = self.run_id = event.run_id
        if event.run_id != own and own not in event.lineage:
            return
        if self.shared.closed:
            self.session.cancel_run("the stream was closed before the run ended")
            return
        agent_run = own
        if isinstance(event, RunStarted) and event.run_id != own:
            self.nested.add(event.run_id)
        if self.nested:
            for candidate in (event.run_id, *reversed(event.lineage)):
                if candidate in self.nested:
                    agent_run = candidate
                    break
        if isinstance(event, _QUIET):
            return
        self.put(_translate(event, self.session, agent_run, agent_run != own))

    def put(self, item: object) -> None:
        try:
            self.send.send_nowait(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.shared.closed = True


async def _run_streamed(
    session: Session[Any],
    start: Callable[[], Awaitable[RunResult]],
    send: MemoryObjectSendStream[object],
    run_id: str | None,
    shared: _Shared,
) -> None:
    """The task that runs a streamed run in the session's task group; never raises
    (but a cancellation of the group itself)."""
    feed = _Feed(session, send, run_id, shared)
    unsubscribe = session.ctx.events.subscribe(feed)
    token = STREAMED.set(True)
    try:
        with send, anyio.CancelScope() as scope:
            shared.scope = scope
            if shared.closed:
                return
            try:
                result = await start()
            except Interrupted as paused:
                checkpoint = paused.checkpoint
                feed.put(
                    RunPaused(checkpoint, paused.node, paused.message, run_id=checkpoint.run_id)
                )
            except Exception as exc:
                feed.put(_Failure(exc))
            else:
                feed.put(FinalResult(result, run_id=result.run_id))
    finally:
        unsubscribe()
        STREAMED.reset(token)
        shared.done.set()


class RunStream:
    """The async iterator :meth:`Session.stream` returns (and an async context manager
    that closes it). The run starts at the first ``__anext__`` or on entering.

    After the end, ``result`` holds the :class:`~tinyctx.RunResult` (or ``checkpoint`` the
    pause).
    """

    def __init__(
        self,
        session: Session[Any],
        start: Callable[[], Awaitable[RunResult]],
        run_id: str | None,
    ) -> None:
        self._session = session
        self._start: Callable[[], Awaitable[RunResult]] | None = start
        self._run_id = run_id
        self._receive: MemoryObjectReceiveStream[object] | None = None
        self._shared = _Shared()
        self._thread = threading.get_ident()
        self._ended = False
        self.result: RunResult | None = None
        self.checkpoint: Checkpoint | None = None

    def _begin(self) -> MemoryObjectReceiveStream[object]:
        if self._receive is not None:
            return self._receive
        if self._shared.closed:
            raise RuntimeError("this stream was closed")
        group = self._session._group
        if group is None or self._session._closed:
            raise RuntimeError("use the session inside `async with Session(...) as session:`")
        start, self._start = self._start, None
        assert start is not None
        send, receive = anyio.create_memory_object_stream[object](math.inf)
        group.start_soon(
            _run_streamed,
            self._session,
            start,
            send,
            self._run_id,
            self._shared,
            name="tinyctx.stream",
        )
        self._receive = receive
        return receive

    def __aiter__(self) -> RunStream:
        return self

    async def __aenter__(self) -> RunStream:
        self._begin()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def __anext__(self) -> StreamEvent:
        if self._ended:
            raise StopAsyncIteration
        receive = self._begin()
        try:
            try:
                # what the run emitted already is read without a trip through the
                # scheduler (a cancelled reader still stops here)
                await anyio.lowlevel.checkpoint_if_cancelled()
                item = receive.receive_nowait()
            except anyio.WouldBlock:
                item = await receive.receive()
        except anyio.ClosedResourceError:
            self._ended = True
            raise StopAsyncIteration from None
        except anyio.EndOfStream:
            self._ended = True
            receive.close()
            raise RunCancelled(
                "stream", "the session was left while its run was streaming"
            ) from None
        if isinstance(item, _Failure):
            self._ended = True
            receive.close()
            raise item.error
        if isinstance(item, FinalResult):
            self.result = item.result
            self._ended = True
        elif isinstance(item, RunPaused):
            self.checkpoint = item.checkpoint
            self._ended = True
        assert isinstance(item, StreamEvent)
        return item

    async def aclose(self) -> None:
        """Stop reading; a run still going is cancelled and waited for (bounded by the
        session's grace period, then its task is cancelled too)."""
        shared = self._shared
        if shared.closed and self._receive is None:
            return
        shared.closed = True
        receive = self._receive
        if receive is None:
            return  # never started
        receive.close()
        if shared.done.is_set():
            return
        self._session.cancel_run("the stream was closed before the run ended")
        grace = max(self._session._grace, 1.0)
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(grace):
                await shared.done.wait()
            if not shared.done.is_set() and shared.scope is not None:
                shared.scope.cancel()
                with anyio.move_on_after(grace):
                    await shared.done.wait()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finalizer
            self._drop()

    def _drop(self) -> None:
        shared = self._shared
        receive = self._receive
        if receive is None or shared.closed or shared.done.is_set():
            if receive is not None:
                receive.close()
            return
        shared.closed = True  # the run stops at its next event, whatever thread this is
        if threading.get_ident() == self._thread:
            receive.close()
            self._session._winding = shared.done
            self._session.cancel_run("the stream was dropped before the run ended")

"""Typed events and the sink that delivers them to subscribers and to logging.

Every action of the framework is an event: a frozen attrs class with a stable ``kind``.
``ctx.emit(event)`` stamps it with the run's ids, so a subscriber (a test, a UI, metrics)
can rebuild the tree of calls.

The library never configures logging. Unless a sink is given its own logger (or None),
each event is logged at its declared level to ``structlog.get_logger("tinyctx")`` when the
application configured structlog, and otherwise to the standard library's ``"tinyctx"``
logger, so an application that configured nothing hears only WARNING and above (on
stderr, through Python's last-resort handler), as from any library.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs
from attrs import field, frozen

from .event_log import EventLog, Stamp, build_event, deferrable
from .frozen import clone_with

if TYPE_CHECKING:
    from .model import ModelRequest, ModelResponse

__all__ = [
    "Event",
    "EventSink",
    "EventLevel",
    "add_tap",
    "freed_tokens",
    "log_event",
    "RunStarted",
    "RunFinished",
    "ModelCallFinished",
    "ToolCallStarted",
    "ToolCallFinished",
    "ToolCallSuspended",
    "ToolFailed",
    "ControlApplied",
    "Cancelled",
    "LimitHit",
    "BackgroundTaskFailed",
    "SubscriberFailed",
    "PendingCallsAnswered",
    "ModelStreamDelta",
]

EventLevel = Literal["trace", "debug", "info", "warning", "error"]
"""``trace`` events (stream deltas) reach subscribers but are never logged."""
Subscriber = Callable[["Event"], None]

_ID_FIELDS = ("run_id", "parent_run_id", "root_run_id", "thread_id", "tags", "lineage")


@frozen(slots=False)  # the ids live in a dict: stamping copies them with one update
class Event:
    """Base of every event. Subclasses add payload fields and set ``kind`` and ``level``."""

    kind: ClassVar[str] = "event"
    level: ClassVar[EventLevel] = "debug"

    run_id: str = field(default="", kw_only=True)
    parent_run_id: str | None = field(default=None, kw_only=True)
    root_run_id: str = field(default="", kw_only=True)
    thread_id: str | None = field(default=None, kw_only=True)
    tags: tuple[str, ...] = field(default=(), kw_only=True)
    lineage: tuple[str, ...] = field(default=(), kw_only=True, repr=False)
    """Ancestor run ids of the emitting run, root first (see RunConfig.lineage)."""
    timestamp: float = field(factory=time.time, kw_only=True, eq=False)
    replayed: bool = field(default=False, kw_only=True, eq=False)
    """True when a durable engine re-emitted it while replaying recorded steps (the first
    execution emitted it already; see ``docs/durable-engines.md``)."""

    def payload(self) -> dict[str, Any]:
        """The event's own fields (no ids, no timestamp), for logs and UIs."""
        return {
            a.name: getattr(self, a.name)
            for a in attrs.fields(type(self))
            if a.name not in _ID_FIELDS and a.name not in ("timestamp", "replayed")
        }

    def describe(self) -> str | None:
        """A one-line label for reports (``tinyctx replay``), or None when another event
        already tells the same (a layer's own event when a budget guard reports it too)."""
        parts = [
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in self.payload().items()
            if isinstance(v, (int, float, str)) and not isinstance(v, bool) and v not in ("", 0)
        ]
        return self.kind + (f"({', '.join(parts[:4])})" if parts else "")

    def stamped(
        self,
        *,
        run_id: str,
        parent_run_id: str | None,
        root_run_id: str,
        thread_id: str | None,
        tags: tuple[str, ...],
        lineage: tuple[str, ...] = (),
    ) -> Event:
        return clone_with(
            self,
            {
                "run_id": run_id,
                "parent_run_id": parent_run_id,
                "root_run_id": root_run_id,
                "thread_id": thread_id,
                "tags": tags,
                "lineage": lineage,
            },
        )


def freed_tokens(event: Event) -> int | None:
    """The tokens a context action freed, when its event says (``freed_tokens``, or
    ``tokens_before - tokens_after``); None for any other event."""
    payload = event.payload()
    value = payload.get("freed_tokens")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    before, after = payload.get("tokens_before"), payload.get("tokens_after")
    if isinstance(before, int) and isinstance(after, int):
        return before - after
    return None


# global taps: how tinyctx.testing.capture_events sees every sink, like structlog.capture_logs
_TAPS: list[Subscriber] = []


def add_tap(fn: Subscriber) -> Callable[[], None]:
    """Deliver every event of every sink to ``fn`` until the returned remover is called."""
    _TAPS.append(fn)

    def remove() -> None:
        if fn in _TAPS:
            _TAPS.remove(fn)

    return remove


class _Default:
    pass


_DEFAULT_LOGGER: Any = _Default()
_STRUCTLOG: Any = None
_STDLIB = logging.getLogger("tinyctx")
_LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _fields(event: Event) -> dict[str, Any]:
    return {
        "run_id": event.run_id,
        "parent_run_id": event.parent_run_id,
        "root_run_id": event.root_run_id,
        "thread_id": event.thread_id,
        "tags": event.tags,
        **event.payload(),
        **({"replayed": True} if event.replayed else {}),
    }


def _configured_structlog() -> Any:
    """structlog's ``"tinyctx"`` logger if the application configured structlog, else None.

    An application that configured structlog has imported it, so it is looked up, never
    imported: ``import tinyctx`` does not pay for structlog (which loads asyncio and rich)."""
    global _STRUCTLOG
    structlog = sys.modules.get("structlog")
    if structlog is None or not structlog.is_configured():
        return None
    if _STRUCTLOG is None:
        _STRUCTLOG = structlog.get_logger("tinyctx")
    return _STRUCTLOG


def log_event(event: Event) -> None:
    """Log ``event`` where the application listens (see the module docstring): structlog
    when it is configured, else the stdlib ``"tinyctx"`` logger; never configures either."""
    level = event.level
    if level == "trace":
        return
    structlog_logger = _configured_structlog()
    if structlog_logger is not None:
        getattr(structlog_logger, level)(event.kind, **_fields(event))
        return
    number = _LEVELS[level]
    if not _STDLIB.isEnabledFor(number):
        return
    fields = _fields(event)
    text = " ".join(f"{k}={v!r}" for k, v in fields.items() if v not in (None, (), ""))
    _STDLIB.log(
        number,
        "%s %s",
        event.kind,
        text,
        extra={
            "run_id": event.run_id,
            "parent_run_id": event.parent_run_id,
            "root_run_id": event.root_run_id,
            "thread_id": event.thread_id,
            "tinyctx": fields,
        },
    )


def _logs(logger: Any, level: EventLevel) -> bool:
    """Whether an event at ``level`` would be logged by ``logger`` (see :class:`EventSink`)."""
    if logger is None or level == "trace":
        return False
    if logger is not _DEFAULT_LOGGER:
        return True
    return _configured_structlog() is not None or _STDLIB.isEnabledFor(_LEVELS[level])


class EventSink:
    """Delivers events to subscribers (in order) and to logging (:func:`log_event`, or
    ``logger``: any object with structlog-style level methods; None logs nothing).

    A subscriber that raises does not break the run: the error is reported as a
    :class:`SubscriberFailed` event and logged, unless ``raise_errors=True``.

    An event nobody would see (no subscriber but the runs' own :class:`EventLog`, no tap,
    no logger at its level) is not built: :meth:`emit_new` hands the logs its arguments.
    """

    __slots__ = ("_listeners", "_logger", "_raise_errors", "_subscribers")

    def __init__(
        self,
        *,
        logger: Any = _DEFAULT_LOGGER,
        subscribers: Iterable[Subscriber] = (),
        raise_errors: bool = False,
    ) -> None:
        self._logger = logger
        self._subscribers: list[Subscriber] = list(subscribers)
        # subscribers that are not an EventLog (those see every event built)
        self._listeners = sum(1 for fn in self._subscribers if type(fn) is not EventLog)
        self._raise_errors = raise_errors

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Add a subscriber; call the returned function to remove it."""
        self._subscribers.append(fn)
        listener = type(fn) is not EventLog
        self._listeners += listener

        def unsubscribe() -> None:
            if fn in self._subscribers:
                self._subscribers.remove(fn)
                self._listeners -= listener

        return unsubscribe

    def emit_new(
        self, cls: type[Event], fields: dict[str, Any], stamp: Stamp, replayed: bool
    ) -> None:
        """Deliver ``cls(**fields)`` stamped with ``stamp``'s ids (``replayed`` as given):
        built and emitted when anything would see it, else handed to the runs' logs
        (identical when they build it) or dropped when there is none."""
        logger = self._logger
        if not (
            self._listeners or _TAPS or (logger is not None and _logs(logger, cls.level))
        ) and deferrable(cls, fields):
            subscribers = self._subscribers
            if subscribers:
                entry = (cls, fields, stamp, time.time(), replayed)
                for log in subscribers:
                    log.defer(entry)  # type: ignore[attr-defined]
            return
        event = build_event(cls, fields, stamp)
        if replayed:
            event = clone_with(event, {"replayed": True})
        self.emit(event)

    def emit(self, event: Event) -> None:
        failures: list[tuple[Subscriber, Exception]] = []
        for fn in (*self._subscribers, *_TAPS) if _TAPS else self._subscribers:
            try:
                fn(event)
            except Exception as exc:
                if self._raise_errors:
                    raise
                failures.append((fn, exc))
        # reported after the original reached every subscriber, never about a report
        if not isinstance(event, SubscriberFailed):
            for fn, failure in failures:
                self.emit(
                    SubscriberFailed(
                        subscriber=getattr(fn, "__qualname__", repr(fn)),
                        error=f"{type(failure).__name__}: {failure}",
                        event_kind=event.kind,
                        run_id=event.run_id,
                        parent_run_id=event.parent_run_id,
                        root_run_id=event.root_run_id,
                        thread_id=event.thread_id,
                        tags=event.tags,
                        lineage=event.lineage,
                    )
                )
        logger = self._logger
        if logger is _DEFAULT_LOGGER:
            log_event(event)
        elif logger is not None and event.level != "trace":
            getattr(logger, event.level)(event.kind, **_fields(event))


# ---------------------------------------------------------------------------------------
# the kernel's own events


@frozen
class RunStarted(Event):
    kind: ClassVar[str] = "run.started"
    level: ClassVar[EventLevel] = "debug"
    resumed: bool = False
    agent: str = ""
    """The agent's ``name``."""


@frozen
class RunFinished(Event):
    kind: ClassVar[str] = "run.finished"
    level: ClassVar[EventLevel] = "info"
    status: str = "completed"
    model_calls: int = 0
    tool_calls: int = 0
    error: str = ""
    """For a failed or cancelled run: ``"<ExceptionType>: <message>"``."""


@frozen
class ModelCallFinished(Event):
    """One model call answered. ``model`` is the model that answered (the response's, else
    the requested one) and ``request_model`` the one asked for; the rest is what the
    adapter reported (:class:`tinyctx.CallInfo`, :class:`tinyctx.Usage`), for tracing."""

    kind: ClassVar[str] = "model.call"
    level: ClassVar[EventLevel] = "debug"
    model: str | None = None
    messages: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    tool_calls: int = 0
    seconds: float = 0.0
    request_model: str | None = None
    provider: str | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    response_id: str | None = None
    finish_reasons: tuple[str, ...] = ()
    temperature: float | None = None
    max_tokens: int | None = None
    server_address: str | None = None
    server_port: int | None = None

    @staticmethod
    def fields_of(request: ModelRequest, response: ModelResponse, seconds: float) -> dict[str, Any]:
        """The fields of the event for ``response`` to ``request``, with everything both
        tell: ``ctx.emit(ModelCallFinished, **ModelCallFinished.fields_of(...))``."""
        usage, info = response.usage, response.info
        fields: dict[str, Any] = {}
        if info is not None:
            fields = {
                "provider": info.provider,
                "response_id": info.response_id,
                "finish_reasons": info.finish_reasons,
                "temperature": info.temperature,
                "max_tokens": info.max_tokens,
                "server_address": info.server_address,
                "server_port": info.server_port,
            }
        if usage is not None:
            fields["input_tokens"] = usage.input_tokens
            fields["output_tokens"] = usage.output_tokens
            fields["cached_tokens"] = usage.cached_tokens
            fields["reasoning_tokens"] = usage.reasoning_tokens
        requested = (info.request_model if info is not None else None) or request.model
        fields["model"] = response.model or requested
        fields["request_model"] = requested
        fields["messages"] = len(request.messages)
        fields["tool_calls"] = len(response.message.tool_calls)
        fields["seconds"] = seconds
        return fields


@frozen
class ToolCallStarted(Event):
    """A tool call is about to go through the tool onion (its arguments as the model sent
    them, after the loop renamed a reused id)."""

    kind: ClassVar[str] = "tool.started"
    level: ClassVar[EventLevel] = "debug"
    tool: str = ""
    tool_call_id: str = ""
    arguments: Any = field(factory=dict, repr=False)


@frozen
class ToolCallFinished(Event):
    kind: ClassVar[str] = "tool.call"
    level: ClassVar[EventLevel] = "debug"
    tool: str = ""
    tool_call_id: str = ""
    is_error: bool = False
    seconds: float = 0.0


@frozen
class ToolCallSuspended(Event):
    """A tool suspended its call (:class:`~tinyctx.Suspend`): the call has no result yet, the
    run pauses at it (``node``), and a resume runs it again."""

    kind: ClassVar[str] = "tool.suspended"
    level: ClassVar[EventLevel] = "info"
    tool: str = ""
    tool_call_id: str = ""
    node: str = ""
    seconds: float = 0.0


@frozen
class ToolFailed(Event):
    """A tool raised (or got bad arguments); the model receives an error result instead."""

    kind: ClassVar[str] = "tool.failed"
    level: ClassVar[EventLevel] = "warning"
    tool: str = ""
    tool_call_id: str = ""
    error_type: str = ""
    error: str = ""


@frozen
class ControlApplied(Event):
    kind: ClassVar[str] = "control.applied"
    level: ClassVar[EventLevel] = "info"
    control: str = ""
    detail: str = ""


@frozen
class Cancelled(Event):
    kind: ClassVar[str] = "run.cancelled"
    level: ClassVar[EventLevel] = "info"
    checkpoint: str = ""
    reason: str | None = None


@frozen
class LimitHit(Event):
    kind: ClassVar[str] = "limit.hit"
    level: ClassVar[EventLevel] = "warning"
    limit: str = ""
    value: int = 0
    scope: str = "run"
    hits: tuple[tuple[str, int, str], ...] = ()
    """Every limit the same call reached, ``(limit, value, scope)``, when a layer counts
    several scopes (the fields above name the first)."""


@frozen
class PendingCallsAnswered(Event):
    """Tool calls left without results were answered so pairing holds (why: ``reason``)."""

    kind: ClassVar[str] = "tool.pending_answered"
    level: ClassVar[EventLevel] = "info"
    reason: str = ""
    tool_call_ids: tuple[str, ...] = ()


@frozen
class BackgroundTaskFailed(Event):
    kind: ClassVar[str] = "background.failed"
    level: ClassVar[EventLevel] = "warning"
    task: str = ""
    error: str = ""


@frozen
class SubscriberFailed(Event):
    kind: ClassVar[str] = "events.subscriber_failed"
    level: ClassVar[EventLevel] = "error"
    subscriber: str = ""
    error: str = ""
    event_kind: str = ""


@frozen
class ModelStreamDelta(Event):
    """One streamed piece of a model response, as it arrives (never logged).

    Text arrives in ``text`` and the model's reasoning (thinking, a reasoning summary) in
    ``reasoning``, when the provider streams it; a tool call arrives as its
    ``tool_call_index`` with its id and name on the first delta and JSON
    ``arguments_delta`` fragments after. Subscribe to the
    event sink to follow a stream; the assembled response is still the call's return value.
    """

    kind: ClassVar[str] = "model.stream_delta"
    level: ClassVar[EventLevel] = "trace"
    text: str = ""
    tool_call_index: int | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments_delta: str = ""
    reasoning: str = ""

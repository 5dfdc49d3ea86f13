"""OpenTelemetry export: tinyctx events as spans that follow the GenAI semantic conventions.

Install with ``pip install 'tinyctx[otel]'``. :class:`OtelExporter` is an event subscriber:

- a span per run, ``invoke_agent {agent}`` (sub-agents nest under the run that started them);
- a span per model call, ``chat {requested model}`` (``generate_content`` for Gemini), with
  what the adapter reported (:class:`tinyctx.model.CallInfo`): ``gen_ai.provider.name``,
  ``gen_ai.request.model`` (the model asked for; left out when unknown) and
  ``gen_ai.response.model`` (the one that answered), ``gen_ai.response.id`` and
  ``finish_reasons``, ``gen_ai.request.temperature`` / ``max_tokens``, ``server.address``
  / ``port``, and ``gen_ai.usage.input_tokens`` / ``output_tokens`` /
  ``cache_read.input_tokens`` / ``reasoning.output_tokens``;
- a span per tool call, ``execute_tool {tool}``, with ``gen_ai.tool.name`` and
  ``gen_ai.tool.call.id``; a failed tool sets the span's status to ERROR and ``error.type``
  (the exception's type, or ``tool_error`` for an error result); a call to an MCP server
  (:mod:`tinyctx.mcp`) is a CLIENT span with the conventions' MCP attributes too
  (``mcp.method.name``, ``mcp.protocol.version``, ``mcp.session.id``, ``network.transport``);
- ``gen_ai.conversation.id`` (the thread) on every span of a thread;
- context actions (pressure, compaction, summary, memory extraction, control, limits) as
  events on the span of the run they happened in, with ``tinyctx.tokens_freed``; what the
  compaction layers removed before a model call is on its chat span as well: their
  events, ``tinyctx.compaction.layers`` (in order) and ``tinyctx.compaction.tokens_freed``;
- a cancelled or failed run sets its span's status to ERROR with the reason.

Spans nest by the events' run ids (a call under :class:`~tinyctx.middleware.Inherit` runs
under a derived id; its events land on the nearest run span of its lineage). Message content
is off by default, as the conventions advise: ``capture_content=True`` and the exporter in
the agent's middleware add ``gen_ai.input.messages`` / ``gen_ai.output.messages`` to chat
spans and the arguments and result to tool spans.

    exporter = OtelExporter(tracer_provider=provider)
    async with Session(agent, events=EventSink(subscribers=[exporter])) as session: ...
"""

from __future__ import annotations

import json
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise ModuleNotFoundError(
        "tinyctx.otel needs OpenTelemetry: pip install 'tinyctx[otel]'", name=exc.name
    ) from exc

from .chain import Layer, ModelCall, ToolCallHandler
from .context import RunContext
from .events import (
    Cancelled,
    ControlApplied,
    Event,
    LimitHit,
    ModelCallFinished,
    RunFinished,
    RunStarted,
    ToolCallFinished,
    ToolCallSuspended,
    ToolFailed,
    freed_tokens,
)
from .messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult
from .model import ModelRequest, ModelResponse

__all__ = ["OtelExporter", "CONTEXT_ACTIONS", "COMPACTIONS"]

CONTEXT_ACTIONS: tuple[str, ...] = (
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
)
"""Prefixes of the event kinds recorded as span events (context actions and outcomes,
retries, human review)."""

COMPACTIONS: tuple[str, ...] = ("context.", "compaction.")
"""Prefixes of the events that say what a layer removed before a model call: recorded on
that call's chat span too (as events, and summed in ``tinyctx.compaction.*``)."""

REMOVALS: frozenset[str] = frozenset(
    {
        "context.policy_applied",
        "compaction.images",
        "compaction.microcompact",
        "compaction.summary",
        "compaction.tool_result_budget",
        "compaction.provider",
        "compaction.provider_edit",
    }
)
"""The events that say a layer removed something (listed in ``tinyctx.compaction.layers``)."""

_NS = 1_000_000_000
_FREED_KEYS = frozenset({"freed_tokens"})


def _homogeneous(value: Any) -> bool:
    """A non-empty tuple of one primitive type: an OTel attribute may hold it."""
    if not isinstance(value, tuple) or not value:
        return False
    kind = type(value[0])
    return kind in (str, bool, int, float) and all(type(item) is kind for item in value)


def _ns(seconds: float) -> int:
    return int(seconds * _NS)


def _parts(message: Message) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if isinstance(message, ToolResult):
        return [
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.text}
        ]
    if message.text:
        parts.append({"type": "text", "content": message.text})
    if isinstance(message, AssistantMessage):
        parts += [
            {"type": "tool_call", "id": c.id, "name": c.name, "arguments": dict(c.arguments)}
            for c in message.tool_calls
        ]
    return parts


def _messages_json(messages: tuple[Message, ...] | list[Message]) -> str:
    """Messages in the conventions' shape: ``[{"role", "parts": [...]}]`` as JSON text."""
    return json.dumps(
        [
            {"role": m.role, "parts": _parts(m)}
            for m in messages
            if not isinstance(m, SystemMessage)
        ],
        default=str,
        ensure_ascii=False,
    )


class OtelExporter:
    """Turns tinyctx events into OpenTelemetry spans (see the module docstring).

    Subscribe it to a session's event sink (``EventSink(subscribers=[exporter])`` or
    ``session.ctx.events.subscribe(exporter)``). With ``capture_content=True``, put
    :meth:`content_layer` in the agent's middleware to record message content.
    ``provider_name`` is the ``gen_ai.provider.name`` of calls whose model handler reports
    none (the built-in adapters report theirs in :class:`tinyctx.model.CallInfo`).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        tracer: Tracer | None = None,
        capture_content: bool = False,
        provider_name: str | None = None,
    ) -> None:
        from importlib.metadata import version

        self.tracer = tracer or trace.get_tracer(
            "tinyctx", version("tinyctx"), tracer_provider=tracer_provider
        )
        self.capture_content = capture_content
        self.provider_name = provider_name
        self._runs: dict[str, Span] = {}
        self._contexts: dict[str, Any] = {}
        self._content: dict[str, tuple[str, str, str | None]] = {}
        self._tool_content: dict[str, tuple[str, str]] = {}
        self._failures: dict[str, str] = {}
        self._compactions: dict[str, list[tuple[str | None, int, Event]]] = {}
        # the MCP attributes of a tool call to an MCP server, until its span is made
        self._tool_mcp: dict[str, dict[str, Any]] = {}

    def content_layer(self) -> Layer:
        """The layer that records message content for this exporter's spans (opt-in:
        only with ``capture_content=True``, as the conventions advise)."""
        if not self.capture_content:
            raise ValueError(
                "content_layer(): message content is off; create the exporter with "
                "capture_content=True to record it"
            )
        return _ContentLayer(self)

    # -- the subscriber ------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        kind = type(event)
        if kind is ModelCallFinished:
            self._chat(event)  # type: ignore[arg-type]
        elif kind is ToolCallFinished or kind is ToolCallSuspended:
            self._tool(event)  # type: ignore[arg-type]
        elif kind is RunStarted:
            self._run_started(event)  # type: ignore[arg-type]
        elif kind is RunFinished:
            self._run_finished(event)  # type: ignore[arg-type]
        elif kind is ToolFailed:
            self._tool_failed(event)  # type: ignore[arg-type]
        elif kind is Cancelled:
            self._cancelled(event)  # type: ignore[arg-type]
        elif event.kind == "mcp.call":
            self._mcp_call(event)
        elif event.kind.startswith(CONTEXT_ACTIONS) or kind in (ControlApplied, LimitHit):
            self._action(event)

    def _parent(self, event: Event, *, include_self: bool = True) -> Any:
        """The OTel context of the nearest open run span of the event's lineage."""
        contexts = self._contexts
        if include_self and event.run_id in contexts:
            return contexts[event.run_id]
        if event.parent_run_id in contexts:
            return contexts[event.parent_run_id]
        for run_id in reversed(event.lineage):
            if run_id in contexts:
                return contexts[run_id]
        return None

    def _span_of(self, event: Event) -> Span | None:
        runs = self._runs
        span = runs.get(event.run_id) or runs.get(event.parent_run_id or "")
        if span is None:
            for run_id in reversed(event.lineage):
                if run_id in runs:
                    return runs[run_id]
        return span

    def _run_started(self, event: RunStarted) -> None:
        agent = event.agent or "agent"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "tinyctx.run_id": event.run_id,
            "tinyctx.root_run_id": event.root_run_id,
            "tinyctx.resumed": event.resumed,
        }
        if event.thread_id is not None:
            attributes["gen_ai.conversation.id"] = event.thread_id
        if event.parent_run_id is not None:
            attributes["tinyctx.parent_run_id"] = event.parent_run_id
        span = self.tracer.start_span(
            f"invoke_agent {agent}",
            context=self._parent(event, include_self=False),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_ns(event.timestamp),
        )
        self._runs[event.run_id] = span
        self._contexts[event.run_id] = trace.set_span_in_context(span)

    def _run_finished(self, event: RunFinished) -> None:
        self._compactions.pop(event.run_id, None)
        span = self._runs.pop(event.run_id, None)
        self._contexts.pop(event.run_id, None)
        self._content.pop(event.run_id, None)
        if span is None:
            return
        span.set_attribute("tinyctx.status", event.status)
        span.set_attribute("tinyctx.model_calls", event.model_calls)
        span.set_attribute("tinyctx.tool_calls", event.tool_calls)
        if event.status in ("failed", "cancelled"):
            error = event.error or event.status
            span.set_attribute("error.type", error.split(":", 1)[0] or event.status)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(event.timestamp))

    def _chat(self, event: ModelCallFinished) -> None:
        end = int(event.timestamp * _NS)  # _ns inlined: this runs once per model call
        provider = event.provider or self.provider_name
        operation = "generate_content" if provider == "gcp.gemini" else "chat"
        attributes: dict[str, Any] = {"gen_ai.operation.name": operation}
        if provider:
            attributes["gen_ai.provider.name"] = provider
        requested = event.request_model
        if requested:
            attributes["gen_ai.request.model"] = requested
        if event.model:
            attributes["gen_ai.response.model"] = event.model
        if event.thread_id is not None:
            attributes["gen_ai.conversation.id"] = event.thread_id
        if event.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = event.input_tokens
        if event.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = event.output_tokens
        if event.cached_tokens:
            attributes["gen_ai.usage.cache_read.input_tokens"] = event.cached_tokens
        if event.reasoning_tokens:
            attributes["gen_ai.usage.reasoning.output_tokens"] = event.reasoning_tokens
        if event.response_id:
            attributes["gen_ai.response.id"] = event.response_id
        if event.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = event.finish_reasons
        if event.temperature is not None:
            attributes["gen_ai.request.temperature"] = event.temperature
        if event.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = event.max_tokens
        if event.server_address:
            attributes["server.address"] = event.server_address
            if event.server_port is not None:
                attributes["server.port"] = event.server_port
        compactions = (
            self._compactions.pop(event.run_id, None)  # the run's own call, not a summary's
            if self._compactions and event.run_id in self._runs
            else None
        )
        if compactions:
            layers = [label for label, _, _ in compactions if label is not None]
            if layers:
                attributes["tinyctx.compaction.layers"] = layers
                attributes["tinyctx.compaction.tokens_freed"] = sum(f for _, f, _ in compactions)
        if self.capture_content:
            content = self._content.pop(event.run_id, None)
            if content is not None:
                attributes["gen_ai.input.messages"] = content[0]
                attributes["gen_ai.output.messages"] = content[1]
                if content[2] is not None:
                    attributes["gen_ai.system_instructions"] = content[2]
        span = self.tracer.start_span(
            f"{operation} {requested}" if requested else operation,
            context=self._parent(event),
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=end - int(event.seconds * _NS),
        )
        if compactions:
            for _, _, action in compactions:
                span.add_event(
                    action.kind, self._action_attributes(action), timestamp=_ns(action.timestamp)
                )
        span.end(end_time=end)

    def _tool(self, event: ToolCallFinished | ToolCallSuspended) -> None:
        end = int(event.timestamp * _NS)  # _ns inlined: this runs once per tool call
        # the dispatcher sends exactly these two types here
        errored = type(event) is ToolCallFinished and event.is_error
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": event.tool,
            "gen_ai.tool.call.id": event.tool_call_id,
            "gen_ai.tool.type": "function",
        }
        if event.thread_id is not None:
            attributes["gen_ai.conversation.id"] = event.thread_id
        failed = self._failures.pop(event.tool_call_id, None) if self._failures else None
        if errored:
            # the exception's type when the tool raised, else the tool answered an error
            attributes["error.type"] = failed or "tool_error"
        elif isinstance(event, ToolCallSuspended):
            # the call's first run, until it paused the run (a resume runs it again)
            attributes["tinyctx.tool.suspended"] = event.node
        if self.capture_content:
            content = self._tool_content.pop(event.tool_call_id, None)
            if content is not None:
                attributes["gen_ai.tool.call.arguments"] = content[0]
                attributes["gen_ai.tool.call.result"] = content[1]
        mcp = self._tool_mcp.pop(event.tool_call_id, None) if self._tool_mcp else None
        if mcp is not None:
            attributes.update(mcp)
        span = self.tracer.start_span(
            f"execute_tool {event.tool}",
            context=self._parent(event),
            kind=SpanKind.INTERNAL if mcp is None else SpanKind.CLIENT,
            attributes=attributes,
            start_time=end - int(event.seconds * _NS),
        )
        if errored:
            span.set_status(Status(StatusCode.ERROR, "the tool answered with an error"))
        span.end(end_time=end)

    def _mcp_call(self, event: Event) -> None:
        """A call went to an MCP server (:class:`tinyctx.mcp.MCPCall`): its span gets the
        MCP attributes of the GenAI conventions (``mcp.method.name``, ``mcp.session.id``,
        ``mcp.protocol.version``, ``network.transport``, ``error.type``...)."""
        payload = event.payload()
        attributes: dict[str, Any] = {"mcp.method.name": payload.get("method") or "tools/call"}
        attributes.update(dict(payload.get("attributes") or ()))
        if payload.get("error_type"):
            attributes["error.type"] = payload["error_type"]
        self._tool_mcp[str(payload.get("tool_call_id", ""))] = attributes

    def _tool_failed(self, event: ToolFailed) -> None:
        self._failures[event.tool_call_id] = event.error_type or "tool_error"
        span = self._span_of(event)
        if span is not None:
            span.add_event(
                "tool.failed",
                {
                    "gen_ai.tool.name": event.tool,
                    "gen_ai.tool.call.id": event.tool_call_id,
                    "error.type": event.error_type,
                    "tinyctx.error": event.error,
                },
                timestamp=_ns(event.timestamp),
            )

    def _cancelled(self, event: Cancelled) -> None:
        span = self._span_of(event)
        if span is not None:
            reason = event.reason or "cancelled"
            span.add_event(
                "run.cancelled",
                {"tinyctx.checkpoint": event.checkpoint, "tinyctx.reason": reason},
                timestamp=_ns(event.timestamp),
            )

    def _action_attributes(self, event: Event) -> dict[str, Any]:
        attributes: dict[str, Any] = {"tinyctx.run_id": event.run_id}
        freed = freed_tokens(event)
        if freed is not None:
            attributes["tinyctx.tokens_freed"] = freed
        for key, value in event.payload().items():
            if key in _FREED_KEYS:
                continue  # recorded once, as tinyctx.tokens_freed
            if isinstance(value, (str, bool, int, float)):
                attributes[f"tinyctx.{key}"] = value
            elif _homogeneous(value):  # e.g. the call ids under review
                attributes[f"tinyctx.{key}"] = list(value)
        label = event.describe()
        if label:
            attributes["tinyctx.label"] = label
        return attributes

    def _action(self, event: Event) -> None:
        span = self._span_of(event)
        if span is None:
            return
        if event.kind.startswith(COMPACTIONS):
            # what the layers removed before a model call is told on that call's span too
            payload = event.payload()
            label = next(
                (str(payload[k]) for k in ("policy", "layer") if isinstance(payload.get(k), str)),
                event.kind,
            )
            # a removal counts once: an event another one already tells has no label
            removal = event.kind in REMOVALS and event.describe() is not None
            freed = freed_tokens(event) if removal else None
            pending = self._compactions.setdefault(self._run_of(event), [])
            pending.append((label if freed is not None else None, freed or 0, event))
        span.add_event(event.kind, self._action_attributes(event), timestamp=_ns(event.timestamp))

    def _run_of(self, event: Event) -> str:
        """The run id of the nearest open run span of the event's lineage."""
        runs = self._runs
        if event.run_id in runs:
            return event.run_id
        if event.parent_run_id in runs:
            return event.parent_run_id or ""
        for run_id in reversed(event.lineage):
            if run_id in runs:
                return run_id
        return event.run_id


class _ContentLayer(Layer):
    """Records what each model call was sent and answered, and each tool's arguments and
    result, for the exporter's next chat / tool span."""

    name = "otel-content"
    ordering_neutral = True  # an observer: it changes nothing and may sit anywhere

    def __init__(self, exporter: OtelExporter) -> None:
        self.exporter = exporter

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        content = (
            _messages_json(request.messages),
            _messages_json([response.message]),
            json.dumps([{"type": "text", "content": request.system_prompt}])
            if request.system_prompt
            else None,
        )
        store = self.exporter._content
        store[ctx.run_id] = content
        parent = ctx.config.parent_run_id
        if parent is not None:
            store[parent] = content  # under Inherit: the loop reports under the run's id
        return response

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        result = await call_next(call, ctx)
        arguments = json.dumps(dict(call.arguments), default=str, ensure_ascii=False)
        self.exporter._tool_content[call.id] = (arguments, result.text)
        return result

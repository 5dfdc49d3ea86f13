"""Replay a recorded conversation through an agent and a stack of layers.

A replay model answers each model call with the next recorded assistant message; a replay
tool layer (innermost on the tool onion) answers each tool call with its recorded result.
The run goes through a real :class:`Session`, so every layer, hook and checkpoint runs as it
would in production, and each model call becomes one :class:`CallRow`: what the model was
sent, what the uncompacted history would have cost, and what the layers did.

Where the recording has a user message after tool results (the user spoke before the model
did), the replay tool layer pauses the run with an ``Interrupt`` at the next checkpoint and
the driver continues with a new run carrying that message, so the conversation is exact.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs
from attrs import field, frozen

from .agent import Agent, Session
from .chain import Layer, LayerLike, ModelCall, ToolCallHandler
from .context import RunConfig, RunContext
from .control import Interrupt
from .errors import ContextLimitExceeded, Interrupted
from .events import Event, EventSink, freed_tokens
from .forgetting import CallForgetting, LossBlame, UsesIndex, blame_breakdown, breakdown, use_json
from .messages import AssistantMessage, Message, ToolCall, ToolResult, check_pairing
from .model import ModelRequest, ModelResponse
from .parts import ImagePart
from .pricing import PromptShape
from .tokens import TokenCounter, default_counter
from .tools import Tool

if TYPE_CHECKING:
    from .prices import ModelPrice
    from .pricing import CostReport

__all__ = ["CallRow", "ReplayReport", "replay", "replay_sync", "ReplayModel", "count_images"]

_NO_RESULT = "[replay: the recording has no result for this tool call]"
_END = "replay.end"


@frozen
class CallRow:
    """One model call of a replay."""

    index: int
    messages: int
    tokens: int
    raw_tokens: int
    usable: int | None
    actions: tuple[str, ...] = ()
    events: tuple[Event, ...] = field(default=(), repr=False, eq=False)
    window: int | None = None
    images: int = 0
    """Images the model was sent in this call (after the stack)."""
    raw_images: int = 0
    """Images the uncompacted recording up to this call holds."""
    shape: PromptShape | None = field(default=None, repr=False, eq=False)
    """The sent prompt as :mod:`tinyctx.cost` prices it (messages, per-message tokens)."""
    forgetting: CallForgetting = field(factory=CallForgetting, repr=False, eq=False)
    """The recorded reply's uses of earlier context, and those the sent request had lost
    (:mod:`tinyctx.forgetting`)."""
    freed: tuple[int | None, ...] = field(default=(), repr=False, eq=False)
    """Per event, the tokens it freed: its own count, else for an event naming a tool
    result (``tool_call_id``) the recorded result's tokens minus the sent one's."""

    @property
    def uses(self) -> int:
        return len(self.forgetting.uses)

    @property
    def lost(self) -> int:
        return len(self.forgetting.lost)

    @property
    def utilisation(self) -> float | None:
        """Tokens sent over the usable window (the window minus the reserve)."""
        return self.tokens / self.usable if self.usable else None

    @property
    def raw_utilisation(self) -> float | None:
        return self.raw_tokens / self.usable if self.usable else None

    @property
    def window_utilisation(self) -> float | None:
        """Tokens sent over the whole window."""
        return self.tokens / self.window if self.window else None

    @property
    def saved(self) -> int:
        return max(0, self.raw_tokens - self.tokens)

    @property
    def would_overflow(self) -> bool:
        return self.usable is not None and self.raw_tokens > self.usable


@frozen
class ReplayReport:
    """Every call of a replay plus its summary numbers."""

    rows: tuple[CallRow, ...]
    window: int | None
    reserved: int
    final_messages: tuple[Message, ...] = field(repr=False)
    error: str | None = None
    recorded_calls: int | None = None
    """Model calls in the recording (its assistant messages); ``len(rows)`` of them replayed."""

    def cost(self, price: ModelPrice | str | None = None) -> CostReport:
        """What the calls of this replay cost at ``price`` (a model name or a
        :class:`~tinyctx.cost.ModelPrice`; default Claude Sonnet 4.5): see :mod:`tinyctx.cost`."""
        from .prices import DEFAULT_PRICE
        from .pricing import price_replay

        return price_replay(self, DEFAULT_PRICE if price is None else price)

    @property
    def average_prompt_tokens(self) -> float:
        """Tokens sent per model call, on average."""
        return sum(r.tokens for r in self.rows) / len(self.rows) if self.rows else 0.0

    @property
    def usable(self) -> int | None:
        return self.window - self.reserved if self.window is not None else None

    @property
    def peak_utilisation(self) -> float:
        values = [r.utilisation for r in self.rows if r.utilisation is not None]
        return max(values, default=0.0)

    @property
    def peak_window_utilisation(self) -> float:
        values = [r.window_utilisation for r in self.rows if r.window_utilisation is not None]
        return max(values, default=0.0)

    @property
    def overflows_avoided(self) -> int:
        return sum(1 for r in self.rows if r.would_overflow and not self._over(r))

    @property
    def overflows_remaining(self) -> int:
        return sum(1 for r in self.rows if self._over(r))

    @property
    def would_overflow(self) -> int:
        return sum(1 for r in self.rows if r.would_overflow)

    @property
    def total_saved(self) -> int:
        """Tokens not sent, summed over every call (what the stack saved in all)."""
        return sum(r.saved for r in self.rows)

    @property
    def uses(self) -> int:
        """Uses of earlier context by the replayed calls' recorded replies."""
        return sum(r.uses for r in self.rows)

    @property
    def lost(self) -> int:
        """Those uses whose span the request the stack sent no longer held."""
        return sum(r.lost for r in self.rows)

    @property
    def lost_rate(self) -> float | None:
        """Lost uses over all uses (None when the replies used nothing)."""
        return self.lost / self.uses if self.uses else None

    def _over(self, row: CallRow) -> bool:
        return row.usable is not None and row.tokens > row.usable

    def to_json(self) -> dict[str, Any]:
        forgetting = [r.forgetting for r in self.rows]
        return {
            "window": self.window,
            "reserved": self.reserved,
            "usable": self.usable,
            "calls": [
                {
                    "index": r.index,
                    "messages": r.messages,
                    "tokens": r.tokens,
                    "raw_tokens": r.raw_tokens,
                    "utilisation": r.utilisation,
                    "window_utilisation": r.window_utilisation,
                    "raw_utilisation": r.raw_utilisation,
                    "saved": r.saved,
                    "would_overflow": r.would_overflow,
                    "actions": list(r.actions),
                    "images": r.images,
                    "raw_images": r.raw_images,
                    "events": [
                        _event_json(e, label, freed)
                        for e, freed in zip(r.events, r.freed or _nones(r.events), strict=True)
                        if (label := e.describe())
                    ],
                    "uses": r.uses,
                    "lost_uses": r.lost,
                    "lost_rate": r.forgetting.lost_rate,
                    "lost": [
                        use_json(u, b)
                        for u, b in zip(
                            r.forgetting.lost,
                            r.forgetting.blame or _nones(r.forgetting.lost),
                            strict=True,
                        )
                    ],
                }
                for r in self.rows
            ],
            "summary": {
                "model_calls": len(self.rows),
                "recorded_model_calls": self.recorded_calls,
                "peak_utilisation": self.peak_utilisation,
                "peak_window_utilisation": self.peak_window_utilisation,
                "would_overflow_without_stack": self.would_overflow,
                "overflows_avoided": self.overflows_avoided,
                "overflows_remaining": self.overflows_remaining,
                "total_tokens_saved": self.total_saved,
                "final_messages": len(self.final_messages),
                "max_images_per_call": max((r.images for r in self.rows), default=0),
                "error": self.error,
                "uses": self.uses,
                "lost_uses": self.lost,
                "lost_rate": self.lost_rate,
                "lost_by_kind": breakdown(forgetting, lambda u: u.span.kind),
                "lost_by_source": breakdown(forgetting, lambda u: u.source_name),
                "lost_by_layer": blame_breakdown(forgetting),
                "estimated_by": _estimated_by(self.rows),
            },
        }


def _estimated_by(rows: Sequence[CallRow]) -> list[str]:
    """The layers whose actions are local estimates of a provider's documented rules
    (:mod:`tinyctx.providers.estimates`: their events say ``estimated=True``)."""
    layers = {
        str(payload.get("layer"))
        for row in rows
        for event in row.events
        if (payload := event.payload()).get("estimated") is True
    }
    return sorted(layers)


def count_images(messages: Sequence[Message]) -> int:
    """Image parts in ``messages`` (user messages and tool results)."""
    total = 0
    for message in messages:
        content = getattr(message, "content", "")
        if not isinstance(content, str):
            total += sum(1 for p in content if isinstance(p, ImagePart))
    return total


def _nones(events: Sequence[object]) -> tuple[None, ...]:
    return (None,) * len(events)


def _acting(event: Event) -> str:
    """The policy that acted, else the one layer class defined beside the event's class
    (``ToolResultTruncated`` -> ``ToolResultBudget``), else the event's kind."""
    policy = event.payload().get("policy")
    if policy:
        return str(policy)
    module = sys.modules.get(type(event).__module__)
    layers = (
        {
            value.__name__
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, Layer)
            and value.__module__ == type(event).__module__
        }
        if module is not None
        else set()
    )
    return layers.pop() if len(layers) == 1 else event.kind


def _observe(blame: LossBlame, call: int, request: ModelRequest, events: Sequence[Event]) -> None:
    """Show ``blame`` a sent request and who acted before it (policies and layers)."""
    acting = [_acting(e) for e in events if e.describe() or e.kind == "context.policy_applied"]
    touched = {
        str(call_id): _acting(e) for e in events if (call_id := e.payload().get("tool_call_id"))
    }
    blame.observe(call, request.messages, acting, touched)


def _freed(
    event: Event, recorded: dict[str, Message], sent: dict[str, Message], counter: TokenCounter
) -> int | None:
    """The tokens ``event`` freed: its own count, else (an event about one tool result) the
    recorded result's tokens minus the sent result's."""
    own = freed_tokens(event)
    if own is not None:
        return own
    call_id = event.payload().get("tool_call_id")
    if not isinstance(call_id, str) or call_id not in recorded or call_id not in sent:
        return None
    return counter.count_message(recorded[call_id]) - counter.count_message(sent[call_id])


def _results(messages: Sequence[Message]) -> dict[str, Message]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolResult)}


def _event_json(event: Event, label: str, freed: int | None = None) -> dict[str, Any]:
    """What a report keeps of a layer's event: its kind, the policy or layer that acted
    (the kind when neither is known), the tokens it freed when known, and its label."""
    return {
        "kind": event.kind,
        "name": _acting(event),
        "freed_tokens": freed if freed is not None else freed_tokens(event),
        "label": label,
    }


class ReplayModel:
    """Answers each call with the next recorded assistant message (the request is ignored)."""

    def __init__(self, transcript: Sequence[Message]) -> None:
        self.transcript = tuple(transcript)
        self.position = 0

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        await anyio.lowlevel.checkpoint()
        transcript = self.transcript
        index = self.position
        while index < len(transcript) and not isinstance(transcript[index], AssistantMessage):
            index += 1
        if index >= len(transcript):
            raise RuntimeError("replay: the model was called after the end of the recording")
        message = transcript[index]
        assert isinstance(message, AssistantMessage)
        self.position = index + 1
        return ModelResponse(message, model="replay")

    def results_after(self, assistant_index: int) -> dict[str, ToolResult]:
        found: dict[str, ToolResult] = {}
        for message in self.transcript[assistant_index + 1 :]:
            if not isinstance(message, ToolResult):
                break
            found[message.tool_call_id] = message
        return found

    def next_is_assistant(self, after: int) -> bool:
        return after < len(self.transcript) and isinstance(self.transcript[after], AssistantMessage)


class _ReplayTools(Layer):
    """Innermost tool layer: answers with the recorded result; pauses where a user spoke."""

    name = "replay-tools"

    def __init__(self, model: ReplayModel) -> None:
        self.model = model

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        await anyio.lowlevel.checkpoint()
        assistant_index = self.model.position - 1
        recorded = self.model.results_after(assistant_index)
        result = recorded.get(call.id)
        message = self.model.transcript[assistant_index]
        assert isinstance(message, AssistantMessage)
        if message.tool_calls and call.id == message.tool_calls[-1].id:
            # the batch is done: skip past the recorded results and see who speaks next
            self.model.position = assistant_index + 1 + len(recorded)
            if not self.model.next_is_assistant(self.model.position):
                ctx.request_control(
                    Interrupt(_END, "the recording continues with a non-model turn")
                )
        if result is None:
            return ToolResult.for_call(call, _NO_RESULT, is_error=True)
        return ToolResult.for_call(call, result.content, is_error=result.is_error)


class _Recorder(Layer):
    """Outermost and innermost model layers: measure before and after the stack."""

    ordering_neutral = True  # observers: the stack's own ordering rules ignore them

    def __init__(
        self,
        name: str,
        sink: Callable[[ModelRequest, RunContext[Any]], None],
        after: Callable[[ModelResponse], None] | None = None,
    ) -> None:
        self.name = name
        self._sink = sink
        self._after = after

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        self._sink(request, ctx)
        response = await call_next(request, ctx)
        if self._after is not None:
            self._after(response)
        return response


_QUIET = frozenset(
    {
        "model.call",
        "tool.call",
        "tool.started",
        "run.started",
        "run.finished",
        "control.applied",
        "model.stream_delta",
        "tool.pending_answered",
    }
)


def _call_row(
    number: int,
    request: ModelRequest,
    events: tuple[Event, ...],
    raw: tuple[int, int],
    recorded_results: dict[str, Message],
    counter: TokenCounter,
    window: int | None,
    reserved: int,
) -> CallRow:
    """Model call ``number``'s row: what the stack sent (tokens, shape, images, what the
    layers did) beside ``raw``, the uncompacted recording's tokens and images."""
    tokens = counter.count_request(request)
    message_tokens = tuple(map(counter.count_message, request.messages))
    shape = PromptShape(
        request.messages,
        message_tokens,
        tokens - sum(message_tokens),
        0,
        (request.system_prompt, request.tools),
    )
    raw_tokens, raw_images = raw
    return CallRow(
        index=number,
        messages=len(request.messages),
        tokens=tokens,
        raw_tokens=raw_tokens,
        usable=window - reserved if window is not None else None,
        window=window,
        actions=tuple(d for e in events if (d := e.describe())),
        events=events,
        freed=tuple(
            _freed(e, recorded_results, _results(request.messages), counter) for e in events
        ),
        images=count_images(request.messages),
        raw_images=raw_images,
        shape=shape,
    )


async def _drive(
    session: Session[None], transcript: tuple[Message, ...], model: ReplayModel
) -> str | None:
    """Play ``transcript`` through ``session``: one run per stretch of non-model turns, the
    model answering from the recording. The error text when a run hit the context limit."""
    position = 0
    while position < len(transcript):
        inputs: list[Message] = []
        while position < len(transcript) and not isinstance(
            transcript[position], (AssistantMessage, ToolResult)
        ):
            inputs.append(transcript[position])
            position += 1
        if position >= len(transcript):
            if inputs:
                for message in inputs:
                    await session.ctx.conversation.append(message)
            break
        model.position = position
        try:
            await session.run(inputs or None)
        except Interrupted as paused:
            if paused.node != _END:
                raise
        except ContextLimitExceeded as exc:
            return str(exc)
        position = max(model.position, position + 1)
    return None


def _replay_session(
    model: ReplayModel,
    stack: Sequence[LayerLike],
    tools: Sequence[Tool],
    measure_raw: _Recorder,
    measure_sent: _Recorder,
    window: int | None,
    reserved: int,
    sink: EventSink,
) -> Session[None]:
    """The session a replay runs: ``stack`` between the two measuring layers, the recording
    answering its model and tool calls, under the replay's window."""
    agent = Agent(
        model=model,
        tools=list(tools),
        middleware=[measure_raw, *stack, measure_sent, _ReplayTools(model)],
        check_requests=False,  # measure what the stack sends, even what a model refuses
    )
    config = RunConfig(
        max_tokens=window, reserved_output_tokens=reserved, max_model_calls=None, model="replay"
    )
    return Session(agent, config=config, events=sink)


async def replay(
    transcript: Sequence[Message],
    stack: Sequence[LayerLike],
    *,
    window: int | None = None,
    reserved: int = 0,
    counter: TokenCounter | None = None,
    tools: Sequence[Tool] = (),
    progress: Callable[[int, int], None] | None = None,
    uses: UsesIndex | None = None,
) -> ReplayReport:
    """Replay ``transcript`` through ``stack`` and report every model call.

    Each call is scored by :mod:`tinyctx.forgetting`: the uses of earlier context its
    recorded reply makes, and those the request the stack sent had lost. ``uses`` is the
    recording's index when the caller built it already (:meth:`UsesIndex.build`, once per
    recording for many replays); it must be the index of ``transcript``."""
    counter = counter or default_counter()
    transcript = tuple(transcript)
    check_pairing(transcript)
    if uses is not None and uses.transcript != transcript:
        raise ValueError("replay: uses= is the UsesIndex of another transcript")
    index = uses if uses is not None else UsesIndex.build(transcript)
    model = ReplayModel(transcript)
    rows: list[CallRow] = []
    seen: list[Event] = []
    pending_raw: list[tuple[int, int]] = []
    sent: list[ModelRequest] = []
    texts: dict[int, tuple[Message, str]] = {}
    recorded_results = _results(transcript)
    blame = LossBlame.for_stack(transcript, stack)

    def outer(request: ModelRequest, ctx: RunContext[Any]) -> None:
        # what the uncompacted recording up to here would cost
        raw = request.evolve(messages=transcript[: model.position])
        pending_raw.append((counter.count_request(raw), count_images(raw.messages)))

    def inner(request: ModelRequest, ctx: RunContext[Any]) -> None:
        events = tuple(e for e in seen if e.kind not in _QUIET)
        seen.clear()
        raw = pending_raw.pop() if pending_raw else (0, 0)
        rows.append(
            _call_row(
                len(rows) + 1, request, events, raw, recorded_results, counter, window, reserved
            )
        )
        sent[:] = [request]
        _observe(blame, len(rows), request, events)
        if progress is not None:
            progress(model.position, len(transcript))

    def answered(response: ModelResponse) -> None:
        # the reply's tokens are what the call's output costs; the recorded reply (the
        # model turn just answered) is scored against what was sent for it
        row = rows[-1]
        changes: dict[str, Any] = {}
        if row.shape is not None:
            output = counter.count_message(response.message)
            changes["shape"] = attrs.evolve(row.shape, output_tokens=output)
        if sent:
            scored = index.score(model.position - 1, sent.pop().messages, texts)
            blamed = tuple(map(blame.blame, scored.lost))
            changes["forgetting"] = attrs.evolve(scored, blame=blamed)
        if changes:
            rows[-1] = attrs.evolve(row, **changes)

    measure_raw = _Recorder("replay-measure-raw", outer)
    measure_sent = _Recorder("replay-measure-sent", inner, answered)
    sink = EventSink(logger=None, subscribers=[seen.append])
    owner = _replay_session(model, stack, tools, measure_raw, measure_sent, window, reserved, sink)
    async with owner as session:
        error = await _drive(session, transcript, model)
        final = session.conversation_messages
    recorded = sum(1 for m in transcript if isinstance(m, AssistantMessage))
    return ReplayReport(tuple(rows), window, reserved, final, error, recorded)


def replay_sync(
    transcript: Sequence[Message], stack: Sequence[LayerLike], **options: Any
) -> ReplayReport:
    """:func:`replay` on a fresh trio loop, for scripts and the CLI."""
    return anyio.run(lambda: replay(transcript, stack, **options), backend="trio")

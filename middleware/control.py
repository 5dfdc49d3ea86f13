"""Control outcomes inside the onion: a stop or a pause becomes a value layers can see.

The loop drains the run's control slot at its own checkpoints. :class:`ControlOutcomes`
drains it inside the onion too, so the layers *outside* it see an outcome as a value:

* **model onion**: before the call (a pending outcome means the model is not called: the
  layer answers with ``ModelResponse.from_control``) and after the response, it takes the
  slot's outcome and sets ``response.control``. A logging layer outside records it; a retry
  outside never repeats a call that produced one.
* **tool onion**: ``ToolResult`` has no control field and a control never goes into
  messages, so an outcome requested by a tool stays on the slot, where the loop applies it
  at its next checkpoint (before the next tool, or after the batch), never mid-tool. Outer
  tool layers see it with :func:`pending_control`. When an outcome is already pending
  before a tool runs, the tool is not run: it gets a "skipped" result.

Options:

* ``on_stop_pending``: what happens to the tool calls of a model response that arrives
  with a StopWithFinal. ``"answer"`` (the loop's default) keeps the calls and the loop
  answers each with a clear "skipped" result; ``"drop"`` removes the calls from the
  assistant message before it enters history, so no result is needed. Calls already in
  history when a stop arrives mid-batch (requested by a tool) are always answered:
  persistence has stored that message, rewriting it would orphan the stored calls.
* ``honour``: the outcome kinds applied. An outcome of another kind is taken off the slot
  (or the response) and a :class:`ControlIgnored` event says so.

The layer never emits ``ControlApplied``: the loop does, exactly once, when it applies the
outcome, whichever drained it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Literal

import attrs
from attrs import frozen

from tinyctx import (
    ConfigError,
    Event,
    Interrupt,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    StopWithFinal,
    ToolCall,
    ToolResult,
)
from tinyctx.chain import ToolCallHandler
from tinyctx.config import Check, one_of
from tinyctx.control import Control, stronger
from tinyctx.events import EventLevel
from tinyctx.ordering import Once

__all__ = [
    "ControlOutcomes",
    "ControlIgnored",
    "ControlSurfaced",
    "PendingCallsDropped",
    "pending_control",
    "take_as_response",
    "CONTROL_KINDS",
]

CONTROL_KINDS: tuple[str, ...] = (StopWithFinal.kind, Interrupt.kind)
StopPolicy = Literal["answer", "drop"]

SKIPPED_PENDING = "[skipped: a {kind} outcome is pending; this tool was not run]"


@frozen
class ControlIgnored(Event):
    """An outcome was taken off the slot (or a response) and not applied: not honoured."""

    kind: ClassVar[str] = "control.ignored"
    level: ClassVar[EventLevel] = "warning"
    control: str = ""
    detail: str = ""
    where: str = ""


@frozen
class ControlSurfaced(Event):
    """An outcome was found at a safe point inside the onion; the loop will apply it."""

    kind: ClassVar[str] = "control.surfaced"
    level: ClassVar[EventLevel] = "debug"
    control: str = ""
    detail: str = ""
    where: str = ""


@frozen
class PendingCallsDropped(Event):
    """A stop arrived with a response's tool calls; they were removed, never run."""

    kind: ClassVar[str] = "tool.pending_dropped"
    level: ClassVar[EventLevel] = "info"
    tool_call_ids: tuple[str, ...] = ()
    reason: str = ""


def pending_control(ctx: RunContext[Any]) -> Control | None:
    """The outcome waiting on the run's slot (for tool layers: ToolResult has no control)."""
    return ctx.control.peek()


def take_as_response(ctx: RunContext[Any]) -> ModelResponse | None:
    """Take the pending outcome off the slot as a control-only response (None if none)."""
    control = ctx.take_control()
    return None if control is None else ModelResponse.from_control(control)


def _stop_policy(value: str) -> StopPolicy:
    return _STOP_POLICY.check(value, "on_stop_pending", "ControlOutcomes")


_STOP_POLICY: Check[StopPolicy] = one_of(("answer", "drop"), allowed="'answer' or 'drop'")


def _honour(value: Iterable[str]) -> frozenset[str]:
    kinds = (value,) if isinstance(value, str) else tuple(value)
    for kind in kinds:
        if kind not in CONTROL_KINDS:
            raise ConfigError(
                "honour",
                value,
                f"a collection of outcome kinds from {CONTROL_KINDS}",
                owner="ControlOutcomes",
            )
    return frozenset(kinds)


class ControlOutcomes(Layer):
    """Surface control outcomes as values inside the onion (see the module doc)."""

    constraints = (Once(reason="one layer drains the control slot; a second would see nothing"),)

    def __init__(
        self,
        on_stop_pending: StopPolicy = "answer",
        honour: Iterable[str] = CONTROL_KINDS,
        *,
        name: str | None = None,
    ) -> None:
        self.on_stop_pending: StopPolicy = _stop_policy(on_stop_pending)
        self.honour = _honour(honour)
        if name is not None:
            self.name = name

    def _keep(self, ctx: RunContext[Any], control: Control | None, where: str) -> Control | None:
        """``control`` if honoured; otherwise report it ignored and return None."""
        if control is None or control.kind in self.honour:
            return control
        ctx.emit(ControlIgnored(control=control.kind, detail=control.detail, where=where))
        return None

    def _drain(self, ctx: RunContext[Any], where: str) -> Control | None:
        control = self._keep(ctx, ctx.take_control(), where)
        if control is not None:
            ctx.emit(ControlSurfaced(control=control.kind, detail=control.detail, where=where))
        return control

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        early = self._drain(ctx, "before_model")
        if early is not None:
            return ModelResponse.from_control(early)
        response = await call_next(request, ctx)
        carried = self._keep(ctx, response.control, "after_model")
        control = stronger(carried, self._drain(ctx, "after_model"))
        message = response.message
        if (
            isinstance(control, StopWithFinal)
            and self.on_stop_pending == "drop"
            and message.tool_calls
        ):
            ctx.emit(
                PendingCallsDropped(
                    tool_call_ids=tuple(c.id for c in message.tool_calls),
                    reason="stopped with a final answer before the calls ran",
                )
            )
            message = attrs.evolve(message, tool_calls=())
        if control is response.control and message is response.message:
            return response
        return response.evolve(control=control, message=message)

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        waiting = self._keep_pending(ctx, "before_tool")
        if waiting is not None:
            # an outer layer asked to stop or pause: the tool does not start
            return ToolResult.for_call(
                call,
                SKIPPED_PENDING.format(kind=waiting.kind),
                is_error=True,
                metadata={"tinyctx": {"synthetic": "control"}},
            )
        try:
            return await call_next(call, ctx)
        finally:
            # a tool that asked to stop or pause, whether it then returned or failed
            requested = self._keep_pending(ctx, "after_tool")
            if requested is not None:
                ctx.emit(
                    ControlSurfaced(
                        control=requested.kind, detail=requested.detail, where=f"tool {call.name}"
                    )
                )

    def _keep_pending(self, ctx: RunContext[Any], where: str) -> Control | None:
        """The slot's honoured outcome, left in place; an ignored one is taken off."""
        pending = ctx.control.peek()
        if pending is None or pending.kind in self.honour:
            return pending
        ctx.take_control()
        self._keep(ctx, pending, where)
        return None

"""What a run leaves: its result when it ends, its checkpoint when it pauses.

A :class:`Checkpoint` is self-contained (the conversation at the pause travels with it),
so the codec stores it and a new session of the same thread resumes it.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs import field, frozen

from .context import RunConfig
from .errors import InvalidCheckpoint, PairingError
from .event_log import RecordedEvents
from .events import Event
from .frozen import EMPTY, FrozenDict, frozen_mapping
from .messages import Message, ToolCall, check_pairing, pending_tool_calls
from .model import Usage

__all__ = ["Checkpoint", "Phase", "RunResult", "RunStatus"]

RunStatus = Literal["completed", "stopped"]
Phase = Literal["before_model", "tools"]


@frozen
class RunResult:
    """What one run produced: the final text, the messages it added, usage and events.

    Args:
        final_text: The answer's text (a StopWithFinal's text when stopped).
        messages: The messages the run added to the conversation.
        usage: The run's token usage (its part before a pause included).
        status: ``"completed"`` or ``"stopped"``.
        run_id: The run's id.
        thread_id: The thread's id.
        model_calls: How many model calls the run made.
        tool_calls: How many tool calls it ran.
        events: The run's events, in order.
    """

    final_text: str
    messages: tuple[Message, ...]
    usage: Usage
    status: RunStatus
    run_id: str
    thread_id: str
    model_calls: int
    tool_calls: int
    _events: tuple[Event, ...] | RecordedEvents = field(default=(), repr=False, alias="events")

    @property
    def events(self) -> tuple[Event, ...]:
        """The run's events, in order (built on first read when nothing else watched)."""
        events = self._events
        if isinstance(events, RecordedEvents):
            return events.built()
        return events


@frozen
class Checkpoint:
    """Where an interrupted run stopped; ``Session.resume(checkpoint)`` continues it.

    Self-contained: it carries the conversation at the pause, so a new session of the
    same thread can resume it too.

    Args:
        run_config: The paused run's config (its run and thread ids).
        phase: ``"before_model"`` or ``"tools"`` (calls wait to run).
        pending: The calls that run on resume (the open calls of ``messages``).
        node: The node the Interrupt named (who paused the run).
        message: The Interrupt's message.
        messages: The conversation at the pause.
        added: The messages the run had added before the pause.
        model_calls: The run's model calls so far.
        tool_calls: The run's tool calls so far.
        usage: The run's usage so far.
        state: Per-run layer state, by layer name.
        payload: The Interrupt's structured payload, or None.
    """

    run_config: RunConfig
    phase: Phase
    pending: tuple[ToolCall, ...]
    node: str
    message: str
    messages: tuple[Message, ...] = field(repr=False)
    added: tuple[Message, ...] = field(repr=False)
    model_calls: int = 0
    tool_calls: int = 0
    usage: Usage = field(factory=Usage)
    state: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping, repr=False)
    """Per-run layer state at the pause, keyed by layer name (JSON-compatible values)."""
    payload: Any = None
    """The Interrupt's structured payload (JSON data, deep-frozen), or None."""

    @property
    def run_id(self) -> str:
        return self.run_config.run_id

    @property
    def thread_id(self) -> str:
        return self.run_config.thread_id

    def evolve(self, **changes: Any) -> Checkpoint:
        return attrs.evolve(self, **changes)

    def check(self) -> None:
        """Refuse a checkpoint that cannot be resumed as it is (hand-edited, corrupted).

        Its history must keep pairing, and its pending calls must be exactly the open
        calls of that history (phase ``tools``), or there must be none (``before_model``).
        Raises :class:`InvalidCheckpoint` naming what is wrong.
        """
        where = f"checkpoint of run {self.run_id!r}"
        if self.phase not in ("before_model", "tools"):
            raise InvalidCheckpoint(
                f"{where}: phase {self.phase!r} is not 'before_model' or 'tools'"
            )
        try:
            check_pairing(self.messages)
        except PairingError as exc:
            raise InvalidCheckpoint(
                f"{where}: its history breaks tool-call pairing: {exc}"
            ) from exc
        open_calls = pending_tool_calls(self.messages)
        if self.phase == "before_model" and (self.pending or open_calls):
            ids = [c.id for c in self.pending or open_calls]
            raise InvalidCheckpoint(
                f"{where}: phase 'before_model' with open tool calls {ids}; expected none"
            )
        if self.phase == "tools" and self.pending != open_calls:
            raise InvalidCheckpoint(
                f"{where}: pending calls {[c.id for c in self.pending]} are not the open calls "
                f"of its history {[c.id for c in open_calls]}"
            )

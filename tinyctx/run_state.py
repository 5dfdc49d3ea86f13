"""What one run carries through the loop: its context, counts, messages and usage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .checkpoint import Checkpoint
from .context import RunContext
from .control import Resumption
from .event_log import EventLog
from .messages import AssistantMessage, Message, ToolCall
from .model import Usage

__all__ = ["NO_USAGE", "RunState"]


NO_USAGE = Usage()
"""No usage (a run's usage before a start that is not a resume)."""


class RunState:
    __slots__ = (
        "added",
        "cancel_reported",
        "ctx",
        "events",
        "input_after_tools",
        "model_calls",
        "resumed_call",
        "resuming",
        "tool_calls",
        "usage_before",
        "usage_start",
    )

    def __init__(self, ctx: RunContext[Any], *, usage_before: Usage) -> None:
        self.ctx = ctx
        # the checkpoint a resume starts from, until the run goes past its start hooks
        self.resuming: Checkpoint | None = None
        # the suspended call a resume runs again (its id) and what it resumes with
        self.resumed_call: tuple[str, Resumption] | None = None
        self.cancel_reported = False
        # a resume's new input, added after the resumed calls' results (same write)
        self.input_after_tools: tuple[Message, ...] = ()
        self.added: list[Message] = []
        self.model_calls = 0
        self.tool_calls = 0
        # the run's usage: what the session's tracker adds from here, plus what the run
        # used before its pause (a resumed run's checkpoint carries it, whichever session
        # or process paused it: the tracker here may never have seen it)
        self.usage_start = ctx.usage.total()
        self.usage_before = usage_before
        # the run tree's events, for RunResult.events
        self.events = EventLog(ctx.config.root_run_id)

    def usage(self) -> Usage:
        """The run's usage so far, its part before a pause included."""
        total, before = self.ctx.usage.total(), self.usage_before
        if total is self.usage_start and total.context_window is None:
            return before  # nothing used since the start: ``before + Usage()`` is ``before``
        used = total - self.usage_start
        return used if before == NO_USAGE else before + used

    def as_in_history(self, pending: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        """The pending calls as the history shows them now.

        A resume hook may rewrite the paused calls' arguments in history before they run
        (an approval layer applying a reviewer's edit); the run then runs, and reports in
        ``RunResult.messages``, exactly what the history shows.
        """
        if not pending:
            return pending
        first = pending[0].id
        message = _holder(self.ctx.conversation.messages, first)
        if message is None:
            return pending
        current = {c.id: c for c in message.tool_calls}
        updated = tuple(current.get(c.id, c) for c in pending)
        if updated != pending:
            added = self.added
            for at in range(len(added) - 1, -1, -1):
                old = added[at]
                if isinstance(old, AssistantMessage) and any(c.id == first for c in old.tool_calls):
                    added[at] = message
                    break
        return updated


def _holder(messages: Sequence[Message], call_id: str) -> AssistantMessage | None:
    """The last assistant message holding the call ``call_id``, if any."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage) and any(
            c.id == call_id for c in message.tool_calls
        ):
            return message
    return None

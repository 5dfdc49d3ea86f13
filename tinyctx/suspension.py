"""A call a tool suspended: how the loop finds its Suspend, and how a resume runs it again.

The run's state remembers the suspended call (:data:`SUSPENDED`); a resume hands the
decisions to its tool (``check_resume``) and runs it first with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .checkpoint import Checkpoint
from .context import RunContext
from .control import Resumption, Suspend
from .decisions import Decision
from .errors import InvalidCheckpoint, ResumeError, TinyCtxError
from .frozen import FrozenDict, freeze, thaw
from .messages import ToolCall

__all__ = ["SUSPENDED", "SuspendedCall", "sole_suspension", "take_suspension"]


SUSPENDED = "tinyctx:suspended"
"""The run-state name under which a run remembers the call a tool suspended."""


def sole_suspension(raised: BaseException, call: ToolCall) -> Suspend:
    """The Suspend a tool call raised, alone or as the only thing in (nested) exception
    groups; anything else is raised again as it is."""
    if isinstance(raised, Suspend):
        return raised
    assert isinstance(raised, BaseExceptionGroup)
    suspensions, rest = raised.split(Suspend)
    if suspensions is None or rest is not None:
        raise raised
    found: list[Suspend] = []
    groups: list[BaseExceptionGroup[Suspend]] = [suspensions]
    while groups:
        for inner in groups.pop().exceptions:
            if isinstance(inner, BaseExceptionGroup):
                groups.append(inner)
            else:
                found.append(inner)
    if len(found) > 1:
        nodes = ", ".join(repr(s.node) for s in found)
        raise TinyCtxError(
            f"tool call {call.id!r} ({call.name}) suspended {len(found)} times at once "
            f"(nodes {nodes}): a call pauses at one node, so run work that may pause in "
            "separate tool calls"
        ) from raised
    return found[0]


class SuspendedCall:
    """The call a run paused at (:class:`Suspend`): its id, its tool and the tool's state."""

    __slots__ = ("call_id", "state", "tool")

    def __init__(self, call_id: str = "", tool: str = "", state: Any = None) -> None:
        self.call_id = call_id
        self.tool = tool
        self.state = state

    def to_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "tool": self.tool, "state": thaw(self.state)}

    @classmethod
    def from_json(cls, data: Any) -> SuspendedCall:
        if not isinstance(data, Mapping) or set(data) != {"call_id", "tool", "state"}:
            raise ValueError("expected an object with call_id, tool and state")
        call_id, tool = data["call_id"], data["tool"]
        if not isinstance(call_id, str) or not call_id or not isinstance(tool, str) or not tool:
            raise ValueError("call_id and tool must be non-empty strings")
        return cls(call_id, tool, freeze(data["state"]))


async def take_suspension(
    ctx: RunContext[Any], checkpoint: Checkpoint, given: FrozenDict[str, Decision]
) -> tuple[str, Resumption] | None:
    """A run paused at a suspended call: its tool checks the decisions (``check_resume``),
    and the call runs again first with them. The record leaves the run's state (a later
    suspension writes its own)."""
    states = ctx.run_states.of(ctx.run_id)
    if SUSPENDED not in states:
        return None
    record = states.get(SUSPENDED, SuspendedCall)
    states.discard(SUSPENDED)
    if not checkpoint.pending or checkpoint.pending[0].id != record.call_id:
        raise InvalidCheckpoint(
            f"checkpoint of run {checkpoint.run_id!r}: it paused at call {record.call_id!r}, "
            f"which is not its first pending call"
        )
    tool = ctx.tools.get(record.tool)
    if tool is not None:
        await tool.check_resume(record.state, given, ctx)
    elif given:
        raise ResumeError(
            [f"the run paused at a call of tool {record.tool!r}, which this agent does not have"]
        )
    return record.call_id, Resumption(record.state, given)

"""Drop non-essential messages (retrieved context marked ``essential=False``), oldest first.

The first and cheapest context-pressure policy: content the application itself marked as
droppable goes before anything the conversation needs. System messages are never dropped,
even when marked non-essential. A tool call and its results go together or not at all: a
tool turn is dropped only when the assistant message and every one of its results are
non-essential, and a turn whose calls are still running is never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinyctx import Message, RunContext, SystemMessage
from tinyctx.messages import pending_tool_calls, tool_turns
from tinyctx.tokens import TokenCounter, default_counter

from .policy import Relief
from .trim import check_name

__all__ = ["DropNonessential", "drop_nonessential_messages", "droppable_groups"]


def droppable_groups(messages: Sequence[Message]) -> list[tuple[int, ...]]:
    """Indices that may be dropped together, oldest group first.

    A group is one non-essential, non-system message, or a whole tool turn (the assistant
    message and all its results) whose every message is non-essential and whose calls are
    all answered.
    """
    turns = tool_turns(messages)
    pending = {call.id for call in pending_tool_calls(messages)}
    unit_of: dict[int, int] = {}
    members: dict[int, tuple[int, ...]] = {}
    for turn in turns:
        indices = (turn.assistant_index, *turn.result_indices)
        members[turn.assistant_index] = tuple(sorted(indices))
        for index in indices:
            unit_of[index] = turn.assistant_index
        if pending.intersection(turn.call_ids):
            members[turn.assistant_index] = ()
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for index, message in enumerate(messages):
        if message.essential or isinstance(message, SystemMessage):
            continue
        unit = unit_of.get(index)
        if unit is None:
            groups.append((index,))
            continue
        if unit in seen:
            continue
        seen.add(unit)
        indices = members[unit]
        if indices and not any(messages[i].essential for i in indices):
            groups.append(indices)
    return groups


def drop_nonessential_messages(
    messages: Sequence[Message],
    *,
    need: int | None = None,
    counter: TokenCounter | None = None,
) -> Relief:
    """Drop droppable groups oldest first until ``need`` tokens are freed (all when None).

    Pure: returns a :class:`Relief` with the kept messages (in order), the tokens freed by
    ``counter`` and ``detail = {"dropped": n}``; the input is returned as is when nothing
    can or need be dropped.
    """
    history = tuple(messages)
    if need is not None and need <= 0:
        return Relief(history, 0, {"dropped": 0})
    count = (counter or default_counter()).count_message
    dropped: set[int] = set()
    freed = 0
    for group in droppable_groups(history):
        if need is not None and freed >= need:
            break
        dropped.update(group)
        freed += sum(count(history[i]) for i in group)
    if not dropped:
        return Relief(history, 0, {"dropped": 0})
    kept = tuple(m for i, m in enumerate(history) if i not in dropped)
    return Relief(kept, freed, {"dropped": len(dropped)})


class DropNonessential:
    """Context-pressure policy: :func:`drop_nonessential` with the guard's ``need``."""

    role = "drop"
    breaker_group: str | None = None

    def __init__(self, *, name: str = "DropNonessential") -> None:
        self.name = check_name(name, owner="DropNonessential")

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        return drop_nonessential_messages(messages, need=need, counter=counter)

    def __repr__(self) -> str:
        return f"DropNonessential(name={self.name!r})"

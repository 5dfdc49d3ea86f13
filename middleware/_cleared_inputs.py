"""Clearing the arguments of the tool calls whose results microcompaction cleared
(``Microcompact(clear_tool_inputs=True)``): each call keeps its id and name, so pairing
holds, and gets ``{}`` as arguments, as LangChain's ``clear_tool_inputs`` sends.
"""

from __future__ import annotations

from typing import Any

import attrs

from tinyctx import AssistantMessage, Message, ToolCall, ToolResult
from tinyctx.frozen import FrozenDict
from tinyctx.tokens import TokenCounter

from ._compaction import mark

__all__ = ["CLEARED_ARGUMENTS", "clear_turn_inputs"]


def clear_turn_inputs(
    history: tuple[Message, ...], out: list[Message], turns: set[int], counter: TokenCounter
) -> tuple[int, int]:
    """Clear, in ``out``, the arguments of the calls of ``turns`` whose results were
    cleared (``out`` differs from ``history`` there); how many and the tokens it freed."""
    done = {
        m.tool_call_id
        for m, n in zip(history, out, strict=True)
        if m is not n and isinstance(m, ToolResult)
    }
    count = counter.count_message
    inputs = freed_tokens = 0
    for index in sorted(t for t in turns if t >= 0):
        message = out[index]
        if not isinstance(message, AssistantMessage):
            continue
        new_message, count_cleared = cleared_inputs(message, done)
        if count_cleared:
            saved = count(message) - count(new_message)
            out[index] = new_message
            inputs += count_cleared
            freed_tokens += max(saved, 0)
    return inputs, freed_tokens


CLEARED_ARGUMENTS: FrozenDict[str, Any] = FrozenDict()
"""The arguments a cleared tool call is left with (``clear_tool_inputs``): ``{}``."""


def cleared_inputs(message: AssistantMessage, ids: set[str]) -> tuple[AssistantMessage, int]:
    """``message`` with the arguments of its calls in ``ids`` cleared, and how many."""
    calls = []
    ids_cleared: list[str] = []
    for call in message.tool_calls:
        if call.id in ids and (call.arguments or call.invalid_arguments is not None):
            calls.append(ToolCall(call.id, call.name, CLEARED_ARGUMENTS))
            ids_cleared.append(call.id)
        else:
            calls.append(call)
    if not ids_cleared:
        return message, 0
    meta = mark(message.metadata, "cleared_inputs", {"by": "microcompact", "ids": ids_cleared})
    return attrs.evolve(message, tool_calls=tuple(calls), metadata=meta), len(ids_cleared)

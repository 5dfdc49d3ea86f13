"""The core tool handler, and running one call outside any onion.

Two contracts, named for what they do with a failure: :func:`run_tool_or_raise` (the
tool onion's core) raises :class:`~tinyctx.ToolError`, so tool layers see it;
:func:`run_tool_or_error_result` answers it with the ``is_error`` result the model
reads, as the loop does at the onion's outer edge.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from .context import RunContext
from .errors import Interrupted, RunCancelled, ToolError
from .events import ToolFailed
from .frozen import MAX_NESTING, thaw
from .messages import ToolCall, ToolResult
from .parts import PART_TYPES
from .tools import ToolArgumentError

__all__ = [
    "run_tool_or_error_result",
    "run_tool_or_raise",
    "tool_error_result",
]


async def run_tool_or_raise(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    """The innermost tool handler: resolve and run the tool; a failure raises ToolError.

    An unknown tool, arguments that were not JSON or do not match the tool's signature,
    and an exception the tool raised all become a :class:`~tinyctx.ToolError` (the
    original exception is its ``error``), so tool layers see the failure and may retry
    or answer it. The loop turns a ToolError that reaches the onion's outer edge into an
    ``is_error`` result the model can read (:func:`tool_error_result`).
    Cancellation and interrupts propagate unwrapped; they are not the tool's failure.
    """
    tool = ctx.tools.get(call.name)
    if tool is None:
        known = ", ".join(ctx.tools.names) or "none"
        raise ToolError(
            call, "UnknownTool", f"unknown tool {call.name!r}; available tools: {known}"
        )
    if call.invalid_arguments is not None:
        raise ToolError(
            call,
            "InvalidArguments",
            f"arguments for {call.name!r} are not a JSON object (nested at most {MAX_NESTING} "
            f"levels): {call.invalid_arguments[:200]!r}",
        )
    try:
        output: object = await tool.invoke(call.arguments, ctx)
    except (RunCancelled, Interrupted):
        raise
    except ToolArgumentError as exc:
        raise ToolError(call, "InvalidArguments", str(exc), exc) from exc
    except Exception as exc:
        raise ToolError(call, type(exc).__name__, str(exc) or type(exc).__name__, exc) from exc
    if isinstance(output, ToolResult):
        if output.tool_call_id != call.id or output.name != call.name:
            output = attrs.evolve(output, tool_call_id=call.id, name=call.name)
        return output
    if isinstance(output, tuple) and output and all(isinstance(p, PART_TYPES) for p in output):
        return ToolResult.for_call(call, output)
    if not isinstance(output, str):
        output = json.dumps(thaw(output), default=str, ensure_ascii=False)
    return ToolResult.for_call(call, output)


def tool_error_result(
    ctx: RunContext[Any], call: ToolCall, error: ToolError, text: str | None = None
) -> ToolResult:
    """The ``is_error`` result the model reads for a failed call, and its ToolFailed event.

    The content is the error's ``content`` (``Error (<error_type>): <text>`` unless a layer
    set it) or ``text`` when given.

    Args:
        ctx: The run's context (the event goes to its sink).
        call: The call that failed.
        error: Its failure.
        text: The content to show instead of the error's, or None.
    """
    ctx.emit(
        ToolFailed,
        tool=call.name,
        tool_call_id=call.id,
        error_type=error.error_type,
        error=error.text,
    )
    content = error.content if text is None else text
    return ToolResult.for_call(call, content, is_error=True)


async def run_tool_or_error_result(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    """Run one call outside any onion: :func:`run_tool_or_raise`, a failure as an error result.

    The model always gets a result it can read, exactly as the loop gives it.
    """
    try:
        return await run_tool_or_raise(call, ctx)
    except ToolError as exc:
        return tool_error_result(ctx, call, exc)

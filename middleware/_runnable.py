"""Whether a tool call could run at all: what the tool onion would answer before running it.

:class:`~middleware.approvals.Approvals` asks this before putting a call to a reviewer: a
call that cannot run goes back to the model with the same error an unreviewed call gets.
"""

from __future__ import annotations

from typing import Any

from tinyctx import RunContext, Tool, ToolCall, ToolError
from tinyctx.tools import ToolArgumentError

__all__ = ["unrunnable"]


def unrunnable(ctx: RunContext[Any], call: ToolCall) -> ToolError | None:
    """The error the tool onion would answer ``call`` with before running anything (an
    unknown tool, arguments that are not a JSON object or fail the tool's schema), or None
    when the call can run."""
    tool = ctx.tools.get(call.name)
    if tool is None:
        known = ", ".join(ctx.tools.names) or "none"
        return ToolError(
            call, "UnknownTool", f"unknown tool {call.name!r}; available tools: {known}"
        )
    if call.invalid_arguments is not None:
        return ToolError(
            call,
            "InvalidArguments",
            f"arguments for {call.name!r} are not a JSON object: {call.invalid_arguments[:200]!r}",
        )
    if type(tool) is Tool:
        # a plain Tool's handler takes the arguments as they come (the onion checks none):
        # the reviewer decides on the call as it would run
        return None
    try:
        tool.check_arguments(call.arguments)
    except ToolArgumentError as exc:
        return ToolError(call, "InvalidArguments", str(exc), exc)
    return None

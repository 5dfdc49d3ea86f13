"""tinyctx's tool layers around the OpenAI Agents SDK's function tools, and its review as
the SDK's approvals.

``Agent(tools=model.wrap_tools([search, delete_file]))`` (or :func:`wrap_tools` with any
:class:`~tinyctx.integrations.Stack`) gives copies of the SDK's ``FunctionTool``\\ s whose
invocation runs the stack's tool onion — :class:`~tinyctx.middleware.ToolRetry`, call
limits, the tool-result budget, your own layers — with the SDK's tool at its centre. A
failing tool raises inside the onion (so a retry layer sees the failure); what no layer
handled is answered as the tool's own failure policy says (its ``failure_error_function``,
the SDK's default message, or raised when it has none).

A call that :class:`~tinyctx.middleware.Approvals` in the stack reviews becomes the SDK's
own interruption: the wrapped tool's ``needs_approval`` asks the stack, so the run stops
with a ``ToolApprovalItem`` in ``result.interruptions``. ``state = result.to_state()``,
``state.approve(item)`` or ``state.reject(item, rejection_message=...)``, then
``Runner.run(agent, state)``: an approved call runs once, through the onion, with the
approval handed to ``Approvals`` as a reviewer's :class:`~tinyctx.Approve` (its
``ReviewDecided`` event, its checks); a rejected one never runs and the SDK answers it
with the rejection. A standing decision (``Approvals.remember``) decides without an
interruption, as in a tinyctx ``Session``.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from agents.run_context import RunContextWrapper
from agents.tool import (
    FunctionTool,
    maybe_invoke_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext

from ..agent import Checkpoint
from ..context import RunContext
from ..decisions import Approve
from ..errors import ResumeError, ToolError
from ..frozen import thaw
from ..messages import ToolCall, ToolResult
from ..tools import ToolSpec
from ._stack import Stack
from ._text import json_text

__all__ = ["wrap_tools", "gated", "review_calls", "Reviewer", "ReviewGate", "ThreadOf"]

REVIEW_PAYLOAD: Final = "tool_review"
"""The payload type of a review layer's pause (``tinyctx.middleware.REVIEW_PAYLOAD_TYPE``)."""

ThreadOf = str | Callable[[RunContextWrapper[Any]], str]
"""The thread a tool call belongs to: a fixed id, or a function of the SDK's context."""


def _call(call_id: str, name: str, raw: str) -> ToolCall:
    """The SDK's call as a tinyctx call (arguments that are not a JSON object are kept as
    ``invalid_arguments``, as every tinyctx adapter does)."""
    if not raw.strip():
        return ToolCall(call_id, name)
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        try:
            return ToolCall(call_id, name, value)
        except (TypeError, ValueError):
            pass
    return ToolCall(call_id, name, invalid_arguments=raw)


@runtime_checkable
class Reviewer(Protocol):
    """A layer that holds tool calls for a person, as :class:`~tinyctx.middleware.Approvals`
    does: which calls (``review_for``: a review with ``allowed`` and ``describe(call)``, or
    None), the thread's standing decisions, and a resume with a decision per call."""

    name: str

    def review_for(self, call: ToolCall) -> Any: ...

    def standing(self, ctx: RunContext[Any]) -> tuple[Any, ...]: ...

    async def on_resume(
        self, ctx: RunContext[Any], checkpoint: Checkpoint, decisions: Mapping[str, Any]
    ) -> bool: ...


def review_calls(payload: Any) -> tuple[Mapping[str, Any], ...] | None:
    """The calls a review layer's pause lists (None for another pause)."""
    if not isinstance(payload, Mapping) or payload.get("type") != REVIEW_PAYLOAD:
        return None
    calls = payload.get("calls")
    return tuple(calls) if isinstance(calls, tuple | list) else None


def _reviewers(stack: Stack) -> list[Reviewer]:
    layers: tuple[object, ...] = stack.layers  # functions and Layer objects alike
    return [layer for layer in layers if isinstance(layer, Reviewer)]


def _standing(layer: Reviewer, ctx: RunContext[Any], call: ToolCall) -> bool:
    """Whether a standing decision of ``layer`` decides ``call`` (exact arguments first)."""
    rules = layer.standing(ctx)
    arguments = thaw(call.arguments)
    return any(
        rule.tool == call.name and (rule.arguments is None or thaw(rule.arguments) == arguments)
        for rule in rules
    )


def _review(stack: Stack, thread: str, call: ToolCall) -> tuple[Reviewer, Any] | None:
    """The review layer that holds ``call`` for a person, and how, or None when it runs
    without one (not reviewed, decided by a standing rule, or arguments that go back to
    the model with an error instead)."""
    if call.invalid_arguments is not None:
        return None
    ctx = stack.context(thread)
    for layer in _reviewers(stack):
        review = layer.review_for(call)
        if review is not None and not _standing(layer, ctx, call):
            return layer, review
    return None


async def _approved(stack: Stack, thread: str, call: ToolCall) -> None:
    """Hand the SDK's approval of ``call`` to the review layer holding it, as a reviewer's
    :class:`~tinyctx.Approve` (:class:`~tinyctx.ResumeError` when it allows none)."""
    held = _review(stack, thread, call)
    if held is None:
        return
    layer, review = held
    ctx = stack.context(thread)
    # what the layer's resume reads of its pause: the call under review and its choices
    entry = {"id": call.id, "name": call.name, "allowed": list(review.allowed)}
    payload = {"type": REVIEW_PAYLOAD, "calls": [entry]}
    checkpoint = Checkpoint(
        run_config=ctx.config,
        phase="tools",
        pending=(call,),
        node=layer.name,
        message="approved through the Agents SDK",
        messages=ctx.conversation.messages,
        added=(),
        payload=payload,
    )
    await layer.on_resume(ctx, checkpoint, {call.id: Approve()})


class ReviewGate:
    """A wrapped tool's ``needs_approval``: the stack's review, or the tool's own setting."""

    def __init__(self, stack: Stack, thread: ThreadOf, name: str, own: Any) -> None:
        self.stack = stack
        self.thread = thread
        self.name = name
        self.own = own

    def thread_of(self, context: RunContextWrapper[Any]) -> str:
        thread = self.thread
        return thread if isinstance(thread, str) else thread(context)

    async def __call__(
        self, context: RunContextWrapper[Any], params: Mapping[str, Any], call_id: str
    ) -> bool:
        own = self.own
        if own is True:
            return True
        if callable(own):
            verdict = own(context, params, call_id)
            if await verdict if inspect.isawaitable(verdict) else verdict:
                return True
        call = ToolCall(call_id, self.name, dict(params))
        return _review(self.stack, self.thread_of(context), call) is not None


class _Invocation:
    """A wrapped tool's ``on_invoke_tool``: the stack's tool onion around the SDK tool."""

    def __init__(self, tool: FunctionTool, gate: ReviewGate) -> None:
        self.tool = tool
        self.gate = gate
        self.spec = ToolSpec(tool.name, tool.description, tool.params_json_schema)
        raising = copy.copy(tool)  # the same tool, raising its failures for the layers
        set_function_tool_failure_error_function(raising, None)
        self.raising = raising

    async def __call__(self, context: ToolContext[Any], raw: str) -> Any:
        gate = self.gate
        thread = gate.thread_of(context)
        call = _call(context.tool_call_id, self.tool.name, raw)
        if context.is_tool_approved(self.tool.name, call.id) is True:
            try:
                await _approved(gate.stack, thread, call)
            except ResumeError as exc:
                return f"Not run: the review refused the approval ({'; '.join(exc.problems)})"
        outputs: list[tuple[ToolResult, Any]] = []
        failures: list[Exception] = []

        async def run(tiny: ToolCall) -> ToolResult:
            arguments = raw if tiny == call else json.dumps(thaw(tiny.arguments))
            try:
                output = await self.raising.on_invoke_tool(context, arguments)
            except Exception as exc:
                failures.append(exc)
                raise ToolError(tiny, type(exc).__name__, str(exc), exc) from exc
            text = output if isinstance(output, str) else json_text(output)
            outputs.append((ToolResult.for_call(tiny, text), output))
            return outputs[-1][0]

        try:
            result = await gate.stack.call_tool(thread, call, run, spec=self.spec)
        except ToolError as failure:
            if any(failure.error is error for error in failures):
                return await self._failed(context, failure.error)
            return failure.content  # a call that cannot run, as tinyctx's loop answers it
        if outputs and result == outputs[-1][0]:
            return outputs[-1][1]  # as the tool gave it (a structured output stays one)
        return result.describe()

    async def _failed(self, context: ToolContext[Any], error: Any) -> Any:
        """The tool's own failure no layer handled, answered by the tool's failure policy
        (raised when it has none)."""
        answer = await maybe_invoke_function_tool_failure_error_function(
            function_tool=self.tool, context=context, error=error
        )
        if answer is None:
            raise error
        return answer


def wrap_tools(tools: Sequence[Any], stack: Stack, *, thread_id: ThreadOf) -> list[Any]:
    """Copies of the SDK's ``FunctionTool``\\ s in ``tools`` whose calls run ``stack``'s tool
    onion and whose ``needs_approval`` asks its review (see the module doc); other tools
    (hosted, MCP, handoffs) are returned as they are. ``thread_id`` names the thread whose
    layer state a call uses: the thread the model calls of the run use."""
    wrapped: list[Any] = []
    for tool in tools:
        if not isinstance(tool, FunctionTool):
            wrapped.append(tool)
            continue
        gate = ReviewGate(stack, thread_id, tool.name, tool.needs_approval)
        invocation = _Invocation(tool, gate)
        copied = copy.copy(tool)
        copied.on_invoke_tool = invocation
        copied.needs_approval = gate
        wrapped.append(copied)
    return wrapped


def gated(tools: Sequence[Any], stack: Stack) -> frozenset[str]:
    """The names of the tools in ``tools`` whose review runs through ``stack``."""
    return frozenset(
        tool.name
        for tool in tools
        if isinstance(tool, FunctionTool)
        and isinstance(tool.needs_approval, ReviewGate)
        and tool.needs_approval.stack is stack
    )

"""Retry a failing tool call with backoff; when attempts run out, answer or raise.

The core tool handler raises :class:`~tinyctx.ToolError` when a tool fails (the tool's own
exception is ``error.error``), so :class:`ToolRetry` sees the failure and calls the rest of
the tool onion again, up to ``attempts`` times. Before **every** attempt it checks the
cancellation token (cancelled: ``RunCancelled`` naming ``tool_retry.before_attempt``, no
further attempt); backoff waits race the token too.

Which calls: ``tools`` (None: every tool; tool names; or a predicate on the call).
Which failures: ``retry_on`` (exception types or a predicate on the tool's exception;
default: any exception). Never retried, whatever ``retry_on`` says:

* ``Interrupted`` and ``RunCancelled`` (they are not failures; they pass through untouched);
* a tool that requested a control outcome (a stop or a pause waits on the slot: the loop
  applies it, the failed attempt is not repeated);
* an unknown tool, arguments that are not JSON or do not fit the schema (repeating the
  same call cannot help), and the errors no retry ever repeats (limits, configuration).

A failure that is not retried propagates unchanged (the loop answers it as usual). When
the attempts run out, ``on_failure`` decides:

* ``"result"`` (default): an error result the model can read, ``Error (<Type>): <text>
  (failed after N attempts)``, and a ``ToolFailed`` event (put a ``ToolResultBudget``
  outside this layer and the text is already cut to its budget);
* a function ``(error: ToolError, attempts: int) -> str``: an error result with its text;
* ``"raise"``: the tool's own exception propagates out of the run (the loop answers the
  remaining calls so pairing holds).

A first attempt that succeeds costs one check and emits nothing; a retried call emits a
:class:`ToolRetryFailed` per failed attempt and a :class:`ToolRetryAttempt` when a later
attempt succeeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, TypeAlias

from attrs import frozen

from tinyctx import (
    ConfigError,
    Event,
    Layer,
    RunCancelled,
    RunContext,
    ToolCall,
    ToolError,
    ToolResult,
)
from tinyctx.agent import tool_error_result
from tinyctx.chain import ToolCallHandler
from tinyctx.config import integer, text
from tinyctx.events import EventLevel
from tinyctx.ordering import Inside
from tinyctx.tools import ToolArgumentError

from .retry import (
    NEVER_RETRIED,
    RetryOn,
    backoff_schedule,
    backoff_sleep,
    check_callable,
    error_matcher,
)
from .tool_result_budget import ToolResultBudget

__all__ = ["ToolRetry", "ToolRetryAttempt", "ToolRetryFailed", "ToolFailurePolicy"]

ToolFailurePolicy: TypeAlias = "Literal['result', 'raise'] | Callable[[ToolError, int], str]"
ToolChoice: TypeAlias = "Iterable[str] | Callable[[ToolCall], bool] | None"

_NOT_FAILURES = ("UnknownTool", "InvalidArguments")


@frozen
class ToolRetryAttempt(Event):
    """A retried tool call succeeded on attempt ``attempt`` of ``attempts``."""

    kind: ClassVar[str] = "tool_retry.attempt"
    level: ClassVar[EventLevel] = "info"
    tool: str = ""
    tool_call_id: str = ""
    attempt: int = 1
    attempts: int = 1


@frozen
class ToolRetryFailed(Event):
    """An attempt of a tool call failed; ``outcome`` is ``retry``, ``exhausted`` or ``raise``
    (not retried: ``reason`` says why)."""

    kind: ClassVar[str] = "tool_retry.failed"
    level: ClassVar[EventLevel] = "warning"
    tool: str = ""
    tool_call_id: str = ""
    attempt: int = 1
    attempts: int = 1
    outcome: str = "retry"
    error_type: str = ""
    error: str = ""
    delay: float = 0.0
    reason: str = ""


def _choice(value: Any) -> Callable[[ToolCall], bool] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if callable(value):
        predicate: Callable[[ToolCall], bool] = value
        return predicate
    if isinstance(value, Iterable):
        names = frozenset(value)
        if not names or not all(text().test(n) for n in names):
            raise ConfigError(
                "tools",
                value,
                "non-empty tool names, a predicate (call) -> bool, or None",
                owner="ToolRetry",
            )
        return lambda call: call.name in names
    raise ConfigError(
        "tools", value, "tool names, a predicate (call) -> bool, or None", owner="ToolRetry"
    )


def _failure_policy(value: Any) -> ToolFailurePolicy:
    if value not in ("result", "raise"):
        check_callable(
            value,
            2,
            "on_failure",
            "'result', 'raise' or a function (error, attempts) -> str",
            owner="ToolRetry",
        )
    policy: ToolFailurePolicy = value
    return policy


class ToolRetry(Layer):
    """Retry failing tool calls (see the module doc)."""

    constraints = (
        Inside(
            ToolResultBudget,
            reason="the budget must see the final text: the failure note this layer adds "
            "to an already budgeted error would grow it past the budget",
        ),
    )

    def __init__(
        self,
        attempts: int = 3,
        backoff: Any = None,
        retry_on: RetryOn = Exception,
        *,
        tools: ToolChoice = None,
        on_failure: ToolFailurePolicy = "result",
        name: str | None = None,
    ) -> None:
        self.attempts = integer(minimum=1).check(attempts, "attempts", "ToolRetry")
        self.backoff = backoff_schedule(backoff, owner="ToolRetry")
        self.retryable = error_matcher(retry_on, "retry_on", "ToolRetry")
        self.applies = _choice(tools)
        self.on_failure = _failure_policy(on_failure)
        if name is not None:
            self.name = name

    def _refusal(self, failure: ToolError, ctx: RunContext[Any]) -> str:
        """Why this failure is not retried ("" when it may be)."""
        error = failure.error
        if failure.error_type in _NOT_FAILURES or isinstance(error, ToolArgumentError):
            return "the call itself is wrong (unknown tool or bad arguments)"
        if not isinstance(error, Exception) or isinstance(error, NEVER_RETRIED):
            return "never repeated (control, cancellation, limit or configuration error)"
        if ctx.control.pending:
            return "a control outcome is pending"
        if not self.retryable(error):
            return "not accepted by retry_on"
        return ""

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        applies = self.applies
        if applies is not None and not applies(call):
            return await call_next(call, ctx)
        token = ctx.cancellation
        if token.is_cancelled():
            raise RunCancelled("tool_retry.before_attempt", token.reason)
        try:
            return await call_next(call, ctx)
        except ToolError as failure:
            first = failure
        return await self._again(call, ctx, call_next, first)

    async def _again(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler, failure: ToolError
    ) -> ToolResult:
        """Attempt 2 and later, after ``failure`` (the previous attempt's)."""
        token = ctx.cancellation
        attempts = self.attempts
        attempt = 1
        while True:
            why = self._refusal(failure, ctx)
            exhausted = not why and attempt >= attempts
            delay = 0.0 if why or exhausted else float(self.backoff(attempt))
            ctx.emit(
                ToolRetryFailed(
                    tool=call.name,
                    tool_call_id=call.id,
                    attempt=attempt,
                    attempts=attempts,
                    outcome="raise" if why else ("exhausted" if exhausted else "retry"),
                    error_type=failure.error_type,
                    error=failure.text,
                    delay=delay,
                    reason=why or (f"all {attempt} attempts failed" if exhausted else ""),
                )
            )
            if why:
                raise failure
            if exhausted:
                return self._exhausted(call, ctx, failure, attempt)
            if token.is_cancelled():
                raise RunCancelled("tool_retry.before_attempt", token.reason)
            if delay:
                await backoff_sleep(ctx, delay, "tool_retry.backoff")
                if token.is_cancelled():
                    raise RunCancelled("tool_retry.before_attempt", token.reason)
            attempt += 1
            try:
                result = await call_next(call, ctx)
            except ToolError as again:
                failure = again
                continue
            ctx.emit(
                ToolRetryAttempt(
                    tool=call.name, tool_call_id=call.id, attempt=attempt, attempts=attempts
                )
            )
            return result

    def _exhausted(
        self, call: ToolCall, ctx: RunContext[Any], failure: ToolError, attempts: int
    ) -> ToolResult:
        policy = self.on_failure
        if policy == "raise":
            error = failure.error
            assert isinstance(error, Exception)  # _refusal lets only exceptions through
            raise error from None
        if policy == "result":
            plural = "s" if attempts != 1 else ""
            text = f"{failure.content} (failed after {attempts} attempt{plural})"
        else:
            assert callable(policy)
            text = policy(failure, attempts)
            if not isinstance(text, str):
                raise TypeError(
                    f"ToolRetry.on_failure returned {type(text).__name__}, expected str"
                )
        return tool_error_result(ctx, call, failure, text)

"""Retry a failed model call with backoff, and never retry what must not be retried.

:class:`Retry` calls the rest of the onion up to ``attempts`` times. Before **every**
attempt it checks the cancellation token (cancelled: raise ``RunCancelled`` naming the
checkpoint, no further attempt; the loop reports the run's cancellation, once) and, from
the second attempt on, the control slot (an outcome pending: stop retrying and hand it out
as a control-only response). It never
retries:

* a response (a response carrying ``control`` is returned as is: the outcome is a value);
* ``RunCancelled``, ``Interrupted``, ``LimitExceeded`` or ``ConfigError``, whatever
  ``retry_on`` says (they reach the caller unchanged);
* an error while a control outcome is pending: the outcome is surfaced instead;
* an error ``retry_on`` does not accept.

Backoff sleeps race the cancellation token, so a cancel during a wait stops the run before
the next attempt. ``RetryableProviderError.retry_after`` is honoured: the wait is at least
that long, and a server asking for more than ``max_delay`` ends the retrying. Every attempt
emits a :class:`RetryAttempt` (a failed one a :class:`RetryFailed`, at warning level).

When the attempts run out (or the server asks for a wait beyond ``max_delay``),
``on_failure`` decides: ``"raise"`` (the default) lets the last error reach the caller;
``"continue"`` ends the run, status *stopped*, with an assistant message naming the error;
a function ``(error, attempts) -> str`` ends it with that text instead. Errors that are
never retried, or that ``retry_on`` refuses, always raise.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeAlias

import anyio
from attrs import field, frozen

from tinyctx import (
    ConfigError,
    Event,
    Interrupted,
    Layer,
    LimitExceeded,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RetryableProviderError,
    RunCancelled,
    RunContext,
    StopWithFinal,
)
from tinyctx.config import fraction, function, integer, number, owner_of
from tinyctx.control import Control
from tinyctx.events import EventLevel

from .control import take_as_response

__all__ = [
    "Retry",
    "Backoff",
    "RetryAttempt",
    "RetryFailed",
    "NEVER_RETRIED",
    "DEFAULT_RETRY_ON",
    "check_attempt",
    "check_callable",
    "error_text",
    "refusal",
]

NEVER_RETRIED: tuple[type[BaseException], ...] = (
    RunCancelled,
    Interrupted,
    LimitExceeded,
    ConfigError,
)
"""Errors no retry or fallback ever repeats: control, cancellation, limits, bad config."""

DEFAULT_RETRY_ON: tuple[type[Exception], ...] = (
    RetryableProviderError,
    ConnectionError,
    TimeoutError,
)

RetryFailurePolicy: TypeAlias = "Literal['raise', 'continue'] | Callable[[Exception, int], str]"

GAVE_UP = (
    "I could not get an answer: the model call failed after {attempts} attempt{plural} "
    "({error_type}: {error})."
)

RetryOn: TypeAlias = "type[Exception] | tuple[type[Exception], ...] | Callable[[Exception], bool]"


def check_callable(value: Any, arity: int, field_name: str, allowed: str, *, owner: str) -> None:
    """``ConfigError`` naming ``field_name`` unless ``value`` is a function that can be called
    with ``arity`` positional arguments (a callable whose signature Python cannot tell, a
    builtin's, is taken on trust): a formatter that takes one argument is refused when the
    layer is built, not found when the attempts have run out."""
    function(allowed=allowed).check(value, field_name, owner)
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*(None,) * arity)
    except TypeError as exc:
        raise ConfigError(
            field_name, value, f"{allowed} (its signature {signature}: {exc})", owner=owner
        ) from None


def check_attempt(ctx: RunContext[Any], checkpoint: str, attempt: int) -> ModelResponse | None:
    """The gate before attempt number ``attempt`` (1-based) of a retry or fallback chain.

    Raises ``RunCancelled`` when the token is cancelled (the agent loop reports it); from
    the second attempt on, returns the pending control outcome as a control-only response
    (the chain must stop and return it), else None.
    """
    token = ctx.cancellation
    if token.is_cancelled():
        raise RunCancelled(checkpoint, token.reason)
    if attempt > 1:
        return take_as_response(ctx)
    return None


def refusal(
    exc: Exception, accepts: Callable[[Exception], bool], option: str, exhausted: str = ""
) -> str:
    """Why a failed attempt is not followed by another ("" when it may be).

    ``exhausted`` is the reason to give when the chain has no attempt left.
    """
    if isinstance(exc, NEVER_RETRIED):
        return "never repeated (control, cancellation, limit or configuration error)"
    if not accepts(exc):
        return f"not accepted by {option}"
    return exhausted


def error_text(exc: BaseException) -> str:
    """An error's message for an event (its type name when it has none)."""
    return str(exc) or type(exc).__name__


_non_negative = number(minimum=0, finite=False, allowed="a number >= 0")
_SECONDS = number(minimum=0, finite=False, allowed="seconds >= 0")


@frozen
class Backoff:
    """Exponential backoff: ``initial * multiplier**(retry - 1)``, capped, with jitter.

    ``jitter`` is a fraction: each delay is scaled by a random factor in
    ``[1 - jitter, 1 + jitter]`` (0 makes delays deterministic).
    """

    initial: float = field(default=0.5, validator=_non_negative)
    multiplier: float = field(
        default=2.0, validator=number(minimum=1, finite=False, allowed="a number >= 1")
    )
    maximum: float = field(default=30.0, validator=_non_negative)
    jitter: float = field(
        default=0.1, validator=fraction(zero=True, allowed="a fraction within [0, 1]")
    )

    def __attrs_post_init__(self) -> None:
        if self.maximum < self.initial:
            raise ConfigError(
                "maximum", self.maximum, f">= initial ({self.initial})", owner=owner_of(self)
            )

    def __call__(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1 for the first retry)."""
        delay = min(self.maximum, self.initial * self.multiplier ** max(0, retry - 1))
        if self.jitter:
            delay *= 1 + random.uniform(-self.jitter, self.jitter)
        return max(0.0, delay)


def backoff_schedule(value: Any, owner: str = "Retry") -> Callable[[int], float]:
    """The wait schedule from a Backoff, constant seconds, or a function (None: Backoff())."""
    if value is None:
        return Backoff()
    if isinstance(value, Backoff):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _SECONDS.check(value, "backoff", owner)
        return Backoff(initial=value, multiplier=1, maximum=value, jitter=0)
    if callable(value):
        return value  # type: ignore[no-any-return]
    raise ConfigError(
        "backoff",
        value,
        "a Backoff, constant seconds, or a function (retry number) -> seconds",
        owner=owner,
    )


def error_matcher(value: Any, field_name: str, owner: str) -> Callable[[Exception], bool]:
    """A predicate from exception types (a type or a tuple) or a predicate itself."""
    if isinstance(value, type) and issubclass(value, BaseException):
        value = (value,)
    if isinstance(value, tuple):
        if not value or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in value
        ):
            raise ConfigError(
                field_name, value, "exception types or a predicate (error) -> bool", owner=owner
            )
        types = value
        return lambda exc: isinstance(exc, types)
    if callable(value):
        predicate: Callable[[Exception], bool] = value
        return predicate
    raise ConfigError(
        field_name, value, "exception types or a predicate (error) -> bool", owner=owner
    )


@frozen
class RetryAttempt(Event):
    """One attempt of a retried call; ``outcome`` is ``ok``, ``control``, ``retry`` or ``raise``."""

    kind: ClassVar[str] = "retry.attempt"
    level: ClassVar[EventLevel] = "debug"
    attempt: int = 1
    attempts: int = 1
    outcome: str = "ok"
    error_type: str = ""
    error: str = ""
    delay: float = 0.0
    reason: str = ""


@frozen
class RetryFailed(RetryAttempt):
    """An attempt that failed: retried after ``delay``, or the error propagates (``reason``)."""

    kind: ClassVar[str] = "retry.failed"
    level: ClassVar[EventLevel] = "warning"


class Retry(Layer):
    """Retry the inner onion on transient errors (see the module doc)."""

    def __init__(
        self,
        attempts: int = 3,
        backoff: Backoff | float | Callable[[int], float] | None = None,
        retry_on: RetryOn = DEFAULT_RETRY_ON,
        *,
        max_delay: float = 60.0,
        on_failure: RetryFailurePolicy = "raise",
        name: str | None = None,
    ) -> None:
        integer(minimum=1).check(attempts, "attempts", "Retry")
        if on_failure not in ("raise", "continue"):
            check_callable(
                on_failure,
                2,
                "on_failure",
                "'raise', 'continue' or a function (error, attempts) -> str",
                owner="Retry",
            )
        self.on_failure: RetryFailurePolicy = on_failure
        _SECONDS.check(max_delay, "max_delay", "Retry")
        self.attempts = attempts
        self.backoff = backoff_schedule(backoff)
        self.retryable = error_matcher(retry_on, "retry_on", "Retry")
        self.max_delay = float(max_delay)
        if name is not None:
            self.name = name

    def _delay(self, exc: Exception, attempt: int) -> float | None:
        """The wait before the next attempt, or None when the server asks for too long."""
        delay = float(self.backoff(attempt))
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(exc, RetryableProviderError) and retry_after is not None:
            if retry_after > self.max_delay:
                return None
            delay = max(delay, float(retry_after))
        return min(delay, self.max_delay)

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        attempts = self.attempts
        attempt = 1
        while True:
            surfaced = check_attempt(ctx, "retry.before_attempt", attempt)
            if surfaced is not None:
                ctx.emit(RetryAttempt(attempt=attempt, attempts=attempts, outcome="control"))
                return surfaced
            try:
                response = await call_next(request, ctx)
            except Exception as exc:
                exhausted = f"all {attempt} attempts failed" if attempt >= self.attempts else ""
                why = refusal(exc, self.retryable, "retry_on", exhausted)
                delay = 0.0 if why else self._delay(exc, attempt)
                if delay is None:
                    why = f"retry_after exceeds max_delay={self.max_delay}"
                elif not why and ctx.control.pending:
                    # a stop or pause was requested meanwhile: it wins over another attempt
                    ctx.emit(
                        RetryFailed(
                            attempt=attempt,
                            attempts=attempts,
                            outcome="control",
                            reason="a control outcome is pending",
                            error_type=type(exc).__name__,
                            error=error_text(exc),
                        )
                    )
                    return ModelResponse.from_control(_taken(ctx))
                gave_up = delay is None or (bool(exhausted) and why == exhausted)
                ends = gave_up and self.on_failure != "raise"
                outcome = ("continue" if ends else "raise") if why else "retry"
                ctx.emit(
                    RetryFailed(
                        attempt=attempt,
                        attempts=attempts,
                        outcome=outcome,
                        delay=delay or 0.0,
                        reason=why,
                        error_type=type(exc).__name__,
                        error=error_text(exc),
                    )
                )
                if ends:
                    return self._give_up(exc, attempt)
                if why:
                    raise
                await backoff_sleep(ctx, delay or 0.0, "retry.backoff")
                attempt += 1
                continue
            outcome_name = "ok" if response.control is None else "control"
            ctx.emit(RetryAttempt(attempt=attempt, attempts=attempts, outcome=outcome_name))
            return response

    def _give_up(self, exc: Exception, attempts: int) -> ModelResponse:
        """End the run with an assistant message about ``exc`` (``on_failure`` not "raise")."""
        policy = self.on_failure
        if callable(policy):
            text = policy(exc, attempts)
            if not isinstance(text, str):
                raise TypeError(f"Retry.on_failure returned {type(text).__name__}, expected str")
        else:
            plural = "s" if attempts != 1 else ""
            text = GAVE_UP.format(
                attempts=attempts,
                plural=plural,
                error_type=type(exc).__name__,
                error=error_text(exc),
            )
        return ModelResponse.from_control(StopWithFinal(text))


def _taken(ctx: RunContext[Any]) -> Control:
    control = ctx.take_control()
    assert control is not None
    return control


async def backoff_sleep(ctx: RunContext[Any], delay: float, checkpoint: str) -> None:
    """Wait ``delay`` seconds unless the token is cancelled first (then RunCancelled)."""
    with ctx.cancellation.linked_scope(checkpoint):
        await anyio.sleep(delay)

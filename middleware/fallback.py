"""Fall back to alternative models when the primary fails.

:class:`Fallback` first calls the rest of the onion (the primary: inner layers and the
agent's model). When that raises an error ``on`` accepts, it calls the alternative model
handlers in order, directly (they are plain :class:`~tinyctx.model.ModelHandler` callables, so
place Fallback innermost when every layer should apply to whichever model answers).

The chain shares the guarantees of :class:`~tinyctx.middleware.retry.Retry`: before every
attempt the cancellation token is checked (cancelled: stop, raise ``RunCancelled``); from
the second attempt on a pending control outcome stops the chain and is returned as a value;
a response carrying ``control`` is returned as is; ``RunCancelled``, ``Interrupted``,
``LimitExceeded`` and ``ConfigError`` propagate unchanged and never advance the chain.
When every model fails, the last error propagates with a note per earlier failure. Every
attempt emits a :class:`FallbackAttempt` (a failed one a :class:`FallbackFailed`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from attrs import field, frozen

from tinyctx import (
    ConfigError,
    ContextLimitExceeded,
    Event,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    ProviderError,
    RunContext,
)
from tinyctx.config import function
from tinyctx.events import EventLevel
from tinyctx.model import ModelHandler
from tinyctx.ordering import Outside

from .retry import NEVER_RETRIED, Retry, RetryOn, check_attempt, error_matcher, error_text, refusal

__all__ = ["Fallback", "Alternative", "FallbackAttempt", "FallbackFailed", "DEFAULT_FALLBACK_ON"]

DEFAULT_FALLBACK_ON: tuple[type[Exception], ...] = (
    ProviderError,
    ConnectionError,
    TimeoutError,
    ContextLimitExceeded,
)


_handler = function(allowed="a model handler (request, ctx) -> ModelResponse")


@frozen
class Alternative:
    """An alternative model: its handler, and the model name its requests should carry."""

    handler: ModelHandler = field(validator=_handler)
    model: str | None = None
    label: str | None = None

    @property
    def name(self) -> str:
        return (
            self.label or self.model or str(getattr(self.handler, "name", "")) or repr(self.handler)
        )


@frozen
class FallbackAttempt(Event):
    """One model tried by a fallback chain; ``outcome`` is ``ok``, ``control``, ``next`` or
    ``raise``; ``index`` 0 is the primary."""

    kind: ClassVar[str] = "fallback.attempt"
    level: ClassVar[EventLevel] = "debug"
    index: int = 0
    model: str = ""
    outcome: str = "ok"
    error_type: str = ""
    error: str = ""
    reason: str = ""


@frozen
class FallbackFailed(FallbackAttempt):
    """A model of the chain failed: the next one is tried, or the error propagates."""

    kind: ClassVar[str] = "fallback.failed"
    level: ClassVar[EventLevel] = "warning"


class Fallback(Layer):
    """Call alternative models in order when the primary fails (see the module doc)."""

    constraints = (
        Outside(
            Retry,
            reason="Fallback calls its alternatives directly, so a Retry outside it would "
            "never retry the primary before falling back, and would re-walk the whole chain",
        ),
    )

    def __init__(
        self,
        *models: ModelHandler | Alternative,
        on: RetryOn = DEFAULT_FALLBACK_ON,
        name: str | None = None,
    ) -> None:
        if not models:
            raise ConfigError("models", (), "at least one alternative model", owner="Fallback")
        alternatives: list[Alternative] = []
        for index, model in enumerate(models):
            if isinstance(model, Alternative):
                alternatives.append(model)
            elif callable(model):
                alternatives.append(Alternative(model))
            else:
                raise ConfigError(
                    f"models[{index}]",
                    model,
                    "a model handler (request, ctx) -> ModelResponse or an Alternative",
                    owner="Fallback",
                )
        self.alternatives: tuple[Alternative, ...] = tuple(alternatives)
        self.falls_back = error_matcher(on, "on", "Fallback")
        if name is not None:
            self.name = name

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        last = len(self.alternatives)
        failures: list[str] = []
        for index in range(last + 1):
            surfaced = check_attempt(ctx, "fallback.before_attempt", index + 1)
            label = request.model or "primary"
            if index:
                alternative = self.alternatives[index - 1]
                label = alternative.name
            if surfaced is not None:
                ctx.emit(FallbackAttempt(index=index, model=label, outcome="control"))
                return surfaced
            try:
                if index == 0:
                    response = await call_next(request, ctx)
                else:
                    model = alternative.model
                    call = request if model is None else request.evolve(model=model)
                    # an alternative is called here, not at the onion's core: what the
                    # conversation committed is made durable first, as the core does
                    await ctx.commit()
                    response = await alternative.handler(call, ctx)
                    if model is not None and response.model is None:
                        response = response.evolve(model=model)
            except Exception as exc:
                exhausted = f"all {last + 1} models failed" if index == last else ""
                why = refusal(exc, self.falls_back, "on", exhausted)
                ctx.emit(
                    FallbackFailed(
                        index=index,
                        model=label,
                        outcome="raise" if why else "next",
                        reason=why,
                        error_type=type(exc).__name__,
                        error=error_text(exc),
                    )
                )
                if why:
                    if index and not isinstance(exc, NEVER_RETRIED):
                        for note in failures:
                            exc.add_note(note)
                    raise
                failures.append(
                    f"fallback: model {label!r} failed first: {type(exc).__name__}: {exc}"
                )
                continue
            outcome = "ok" if response.control is None else "control"
            ctx.emit(FallbackAttempt(index=index, model=label, outcome=outcome))
            return response
        raise AssertionError("unreachable: the last model either answers or raises")

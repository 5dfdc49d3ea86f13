"""The budget guard: keep every model request inside the usable context window.

Before each model call :class:`BudgetGuard` estimates the prompt (messages, tool schemas,
system prompt; calibrated by the provider's reported usage) against the usable window,
``max_tokens - reserved_output_tokens``:

- below ``trigger`` the request passes through untouched — the same object. By default
  the trigger is the hard limit: the guard acts only on a request that would not fit, so
  on a conversation that fits it never rewrites anything (and never breaks a provider's
  cached prompt prefix); a lower trigger relieves ahead of need;
- at or above it, a :class:`ContextPressure` event is emitted and the guard's policies run
  in order, re-estimating after each, until the estimate is at or under the low-water
  mark (``low_water``); each policy that changed something emits a
  :class:`ContextPolicyApplied` with the tokens freed;
- if the estimate is still above ``hard_limit`` (default 100 % of the usable window) the
  call fails with :class:`tinyctx.ContextLimitExceeded` naming the estimate, the window, the
  reserve and what each policy freed — and the conversation is left as it was.

The window comes from ``RunConfig.max_tokens`` (this run), else the guard's ``max_tokens``,
else the window the provider last reported (``Usage.context_window``), else the model
table (:func:`tinyctx.tokens.context_window`). An unknown window is a clear error, never a
guard that silently never fires.

Default policy order: drop non-essential context → clear old images (all but the newest 3)
→ microcompact tool outputs → summarize → trim oldest (:func:`default_policies`): old
images go before old text, as a screenshot costs much and says little once acted on.
``order="seed"`` gives the seed document's drop → trim → summarize → compact.
Summarizing policies sit behind a circuit breaker: ``breaker_threshold`` (3) consecutive
failures skip them until a trial succeeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tinyctx import (
    ConfigError,
    ContextLimitExceeded,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
)
from tinyctx.config import flag, fraction, implements, integer, text
from tinyctx.frozen import FrozenDict
from tinyctx.ordering import Once, Outside
from tinyctx.providers.clearing import provider_cleared
from tinyctx.reexport import publish
from tinyctx.tokens import (
    TokenCounter,
    context_window,
    default_counter,
    window_table,
)

from . import _budget_events, _budget_policies, _budget_state
from ._budget_env import (
    _COUNTER,
    _RELIEF_RUN,
    _fraction,
    _optional_int,
    _settings_reserve,
    guard_from_env,
    window_thresholds,
)
from ._budget_events import (
    BreakerChanged,
    ContextExhausted,
    ContextPolicyApplied,
    ContextPolicyFailed,
    ContextPolicySkipped,
    ContextPressure,
    ProviderContextLimit,
)
from ._budget_policies import (
    ORDERS,
    _order_roles,
    breaker_group,
    default_policies,
    exhausted,
    order_policies,
    policy_role,
    run_policies,
)
from ._budget_policies import OrderSpec as OrderSpec
from ._budget_policies import PolicyFailure as PolicyFailure
from ._budget_state import (
    BreakerState,
    BudgetStats,
    _GuardState,
    breaker_status,
)
from .fallback import Fallback
from .policy import PressurePolicy

publish(__name__, _budget_events, _budget_policies, _budget_state)

__all__ = [
    "BudgetGuard",
    "BudgetStats",
    "BreakerState",
    "ORDERS",
    "default_policies",
    "order_policies",
    "policy_role",
    "breaker_group",
    "ContextPressure",
    "ContextPolicyApplied",
    "ContextPolicyFailed",
    "ContextPolicySkipped",
    "BreakerChanged",
    "ContextExhausted",
    "ProviderContextLimit",
]

_POLICY = implements(
    PressurePolicy,
    allowed="a PressurePolicy (a `name` and `async relieve(messages, ctx, counter, *, need)`)",
)


class BudgetGuard(Layer):
    """Keeps each model request inside the usable context window (see the module doc).

    Fractions are of the usable window (``window - reserved_output_tokens``), with
    ``0 < low_water <= trigger <= hard_limit <= 1``. When the guard acts it relieves in one
    batch down to the low-water mark, so the calls after it append to a stable prefix (a
    provider's prompt cache reads it) until the trigger is reached again: the lower the mark,
    the rarer the rewrites that break the cached prefix, and the less context is kept. The
    built-in policies free what the guard asks for, oldest first.

    Args:
        max_tokens: The context window; default ``RunConfig.max_tokens``, then the window
            the provider reports, then the model-window table.
        reserved_output_tokens: Tokens kept free for the answer; default
            ``RunConfig.reserved_output_tokens``, else the request's ``max_tokens``-style
            output setting.
        trigger: The fraction the guard acts at; default ``hard_limit``, so it acts only on
            a request that would not fit (acting earlier rewrites a cached prefix the calls
            up to the limit would only have read; ``benchmarks/bench_cost.py`` checks this).
        hard_limit: The most a request sent may use (default 1.0); over it after every
            policy, :class:`~tinyctx.ContextLimitExceeded` is raised.
        low_water: The fraction a relief goes down to; default 0.5 (or the trigger when
            lower); :func:`~tinyctx.middleware.stacks.default_stack` uses 0.4, cheaper on
            real transcripts (``benchmarks/bench_cost.py``).
        policies: The pressure policies in the order they run; default by ``order``.
        order: A named order (:data:`ORDERS`) or a sequence of roles.
        counter: The token counter; default :func:`~tinyctx.tokens.default_counter`.
        persist: Commit a relieved history to the conversation (default) with
            ``replace(..., emit_new=False)``, keeping the next request's prefix stable; only
            when the request's messages are the conversation's. False relieves each request
            on its way and never touches the history.
        calibrate: Learn the ratio of the provider's ``input_tokens`` to the estimate.
        windows: Extra ``{model-name prefix: tokens}`` entries for the window table.
        breaker_threshold: Failures of a policy group that open its circuit breaker.
        breaker_cooldown: Firings an open breaker skips before trying once more; None:
            stays open until a policy of the group succeeds.
        retry_on_provider_limit: Answer the provider's "prompt too long" once: relieve down
            to ``provider_retry_factor`` of the smaller of the mark and the rejected
            estimate, and retry; a second rejection propagates.
        provider_retry_factor: See ``retry_on_provider_limit``; in (0, 1).
        relief_run: Make a relief buy room for at least this many calls at the rate the
            conversation grew per call (default 0, off; ``default_stack`` sets 20).
        relief_floor: The lowest a ``relief_run`` relief goes (default 0.2, or
            ``low_water`` when lower).
        name: The key of the guard's state; default the class name.

    State (calibration, breakers, stats) is per thread (its conversation; a sub-agent has
    its own), durable: a Session with a store keeps it with the thread. Read it with
    :meth:`stats`.
    """

    constraints = (
        Once(reason="two guards would each compact the same history for one window"),
        Outside(
            Fallback,
            reason="Fallback sends the request to its alternatives directly: a guard inside "
            "it would leave their requests unbudgeted",
        ),
    )

    def __init__(
        self,
        *,
        max_tokens: int | None = None,
        reserved_output_tokens: int | None = None,
        trigger: float | None = None,
        hard_limit: float = 1.0,
        low_water: float | None = None,
        policies: Sequence[PressurePolicy] | None = None,
        order: OrderSpec | None = None,
        counter: TokenCounter | None = None,
        persist: bool = True,
        calibrate: bool = True,
        windows: Mapping[str, int] | None = None,
        breaker_threshold: int = 3,
        breaker_cooldown: int | None = 5,
        retry_on_provider_limit: bool = True,
        provider_retry_factor: float = 0.5,
        relief_run: int = 0,
        relief_floor: float = 0.2,
        name: str | None = None,
    ) -> None:
        owner = "BudgetGuard"
        (
            self.max_tokens,
            self.reserved_output_tokens,
            self.hard_limit,
            self.trigger,
            self.low_water,
        ) = window_thresholds(max_tokens, reserved_output_tokens, trigger, hard_limit, low_water)
        self.counter: TokenCounter = (
            default_counter() if counter is None else _COUNTER.check(counter, "counter", owner)
        )
        self._set_policies(policies, order)
        self._groups = tuple(breaker_group(p) for p in self.policies)
        self.persist = _bool("persist", persist, owner)
        self.calibrate = _bool("calibrate", calibrate, owner)
        self.retry_on_provider_limit = _bool(
            "retry_on_provider_limit", retry_on_provider_limit, owner
        )
        self.windows = window_table(windows, owner=owner)
        self.breaker_threshold = integer(minimum=1).check(
            breaker_threshold, "breaker_threshold", owner
        )
        self.breaker_cooldown = _optional_int("breaker_cooldown", breaker_cooldown, 0, owner)
        self.provider_retry_factor = float(
            fraction(one=False).check(provider_retry_factor, "provider_retry_factor", owner)
        )
        self.relief_run = _RELIEF_RUN.check(relief_run, "relief_run", owner)
        self.relief_floor = _fraction("relief_floor", relief_floor, owner)
        if name is not None:
            self.name = name
        # model name -> table window; a pure function of the configuration, shared safely
        self._table_cache: dict[str | None, int | None] = {}

    def _set_policies(self, policies: Sequence[PressurePolicy] | None, order: Any) -> None:
        """The policies in order, each a PressurePolicy with a name unique in the guard."""
        owner = "BudgetGuard"
        if order is not None:
            _order_roles(order, owner)
        chosen = default_policies(order or "default") if policies is None else list(policies)
        for index, policy in enumerate(chosen):
            _POLICY.check(policy, f"policies[{index}]", owner)
        names = [p.name for p in chosen]
        for index, policy_name in enumerate(names):
            text().check(policy_name, f"policies[{index}].name", owner)
            if names.index(policy_name) != index:
                raise ConfigError(
                    f"policies[{index}].name",
                    policy_name,
                    "a name unique within the guard (set .name on one of them)",
                    owner=owner,
                )
        if policies is not None and order is not None:
            chosen = order_policies(chosen, order)
        self.policies: tuple[PressurePolicy, ...] = tuple(chosen)

    def trigger_tokens(self, usable: int) -> int:
        """The least estimate the guard acts on in a usable window of ``usable`` tokens:
        ``trigger * usable``, or one token over the hard limit when the trigger is the hard
        limit (the default: the guard acts only on a request that would not fit)."""
        if self.trigger >= self.hard_limit:
            return math.floor(self.hard_limit * usable) + 1
        return math.ceil(self.trigger * usable)

    def fires(self, estimate: int, usable: int) -> bool:
        """Whether the guard acts on a request of ``estimate`` tokens (see
        :meth:`trigger_tokens`)."""
        return estimate >= self.trigger_tokens(usable)

    def relief_goal(self, usable: int, estimate: int, growth: float | None) -> int:
        """The estimate a relief goes down to: ``low_water * usable``, or lower when
        ``relief_run`` calls at ``growth`` tokens per call would not fit above it (never
        below ``relief_floor``, or the mark when that is lower). ``growth`` None: unknown."""
        goal = math.floor(self.low_water * usable)
        if self.relief_run and growth is not None and growth > 0:
            floor = math.floor(min(self.relief_floor, self.low_water) * usable)
            goal = min(goal, max(floor, math.floor(usable - self.relief_run * growth)))
        return goal

    # -- construction from the environment ------------------------------------------------

    @classmethod
    def from_env(
        cls,
        prefix: str = "TINYCTX_CONTEXT_",
        *,
        environ: Mapping[str, str] | None = None,
        **options: Any,
    ) -> BudgetGuard:
        """A guard from ``options`` with overrides from ``{prefix}*`` environment variables.

        Variables: ``MAX_TOKENS``, ``RESERVED_OUTPUT_TOKENS``, ``TRIGGER``, ``HARD_LIMIT``,
        ``LOW_WATER``, ``RELIEF_FLOOR`` (fractions like
        ``0.9`` or percentages like ``90%``), ``RELIEF_RUN`` (calls), ``PERSIST``,
        ``CALIBRATE``, ``RETRY_ON_PROVIDER_LIMIT`` (booleans), ``ORDER`` (``default`` or
        ``seed``), ``BREAKER_THRESHOLD``, ``BREAKER_COOLDOWN`` (an integer or ``none``).
        An invalid value — or an unknown variable with the prefix — raises ConfigError
        naming the variable; nothing is silently ignored, and the same cross-field rules
        as the constructor apply (e.g. the trigger at or below the hard limit).
        """
        return guard_from_env(cls, prefix, environ, options)

    # -- state ---------------------------------------------------------------------------

    def _state(self, ctx: RunContext[Any]) -> _GuardState:
        return ctx.thread_state(self, _GuardState)

    def stats(self, ctx: RunContext[Any]) -> BudgetStats:
        """This guard's stats for the conversation of ``ctx`` (a session's, by default)."""
        state = self._state(ctx)
        usable = None
        if state.window is not None and state.reserved is not None:
            usable = state.window - state.reserved
        breakers = {
            group: BreakerState(
                group, breaker_status(b, self.breaker_cooldown), b.failures, b.skipped
            )
            for group, b in state.breakers.items()
        }
        return BudgetStats(
            utilisation=state.utilisation,
            estimate=state.estimate,
            window=state.window,
            reserved=state.reserved,
            usable=usable,
            window_source=state.window_source,
            last_input_tokens=state.last_input_tokens,
            last_output_tokens=state.last_output_tokens,
            calibration_ratio=state.calibration.ratio,
            hidden_tokens=state.calibration.hidden_tokens,
            breakers=FrozenDict(breakers),
            actions=FrozenDict(state.actions),
        )

    def reset_breakers(self, ctx: RunContext[Any]) -> None:
        """Close every circuit breaker of this conversation (failures forgotten)."""
        self._state(ctx).breakers.clear()

    # -- the window ----------------------------------------------------------------------

    def _table_window(self, model: str | None) -> int | None:
        cache = self._table_cache
        if model in cache:
            return cache[model]
        window = context_window(model, self.windows)
        if len(cache) < 256:
            cache[model] = window
        return window

    def resolve_window(self, request: ModelRequest, ctx: RunContext[Any]) -> tuple[int, int, str]:
        """``(window, reserved_output_tokens, source)`` for ``request`` in ``ctx``.

        ``source`` is "config" (``RunConfig.max_tokens``), "layer", "reported" or "table".
        Raises ConfigError when no window is known or the reserve does not fit it.
        """
        config = ctx.config
        window: int | None
        if config.max_tokens is not None:
            window, source = config.max_tokens, "config"
        elif self.max_tokens is not None:
            window, source = self.max_tokens, "layer"
        else:
            reported = self._state(ctx).reported_window
            if reported:
                window, source = reported, "reported"
            else:
                model = request.model or config.model
                window, source = self._table_window(model), "table"
                if window is None:
                    raise ConfigError(
                        "max_tokens",
                        None,
                        f"a known context window: model {model!r} is not in the window "
                        "table; pass BudgetGuard(max_tokens=...) or windows={prefix: tokens}, "
                        "set RunConfig.max_tokens, or use a provider that reports "
                        "Usage.context_window",
                        owner="BudgetGuard",
                    )
        reserved = self.reserved_output_tokens
        if reserved is None:
            reserved = config.reserved_output_tokens or _settings_reserve(request.settings)
        if reserved >= window:
            raise ConfigError(
                "reserved_output_tokens",
                reserved,
                f"fewer than the context window of {window} tokens (from {source})",
                owner="BudgetGuard",
            )
        return window, reserved, source

    # -- the hook ------------------------------------------------------------------------

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        state = self._state(ctx)
        window, reserved, source = self.resolve_window(request, ctx)
        usable = window - reserved
        raw = self.counter.count_request(request)
        estimate = state.calibration.estimate(raw, request.messages) if self.calibrate else raw
        state.actions["checks"] += 1
        checks = state.actions["checks"]
        mark = state.relief_mark
        if mark is None or mark[1] > checks:  # the first check (or counts from elsewhere)
            mark = state.relief_mark = (estimate, checks)
        self._remember(state, estimate, window, reserved, source)
        sent, sent_raw = request, raw
        # what provider-side layers outside this guard declared their provider will clear
        if self.fires(estimate - provider_cleared(request, self.counter), usable):
            calls = checks - mark[1]
            growth = (estimate - mark[0]) / calls if calls > 0 else None
            sent, sent_raw, estimate = await self._relieve(
                request,
                ctx,
                state,
                raw=raw,
                estimate=estimate,
                window=window,
                reserved=reserved,
                source=source,
                goal=self.relief_goal(usable, estimate, growth),
            )
        try:
            response = await call_next(sent, ctx)
        except ContextLimitExceeded as exc:
            if not self.retry_on_provider_limit:
                raise
            sent, sent_raw = await self._after_rejection(
                exc, sent, ctx, state, sent_raw, window, reserved, source
            )
            response = await call_next(sent, ctx)
        self._record(state, sent, sent_raw, response)
        return response

    def _remember(
        self, state: _GuardState, estimate: int, window: int, reserved: int, source: str
    ) -> None:
        state.estimate = estimate
        state.window = window
        state.reserved = reserved
        state.window_source = source
        state.utilisation = estimate / (window - reserved)

    def _record(
        self, state: _GuardState, sent: ModelRequest, sent_raw: int, response: ModelResponse
    ) -> None:
        usage = response.usage
        if usage is None:
            return
        if usage.input_tokens > 0:
            state.last_input_tokens = usage.input_tokens
            if self.calibrate:  # with the history reported on: a later rewrite makes it stale
                state.calibration.observe(sent_raw, usage.input_tokens, sent.messages)
        state.last_output_tokens = usage.output_tokens
        if usage.context_window:
            state.reported_window = usage.context_window

    async def _after_rejection(
        self,
        exc: ContextLimitExceeded,
        sent: ModelRequest,
        ctx: RunContext[Any],
        state: _GuardState,
        sent_raw: int,
        window: int,
        reserved: int,
        source: str,
    ) -> tuple[ModelRequest, int]:
        """The provider refused ``sent``: learn from it, relieve harder, or re-raise."""
        state.actions["provider_limit"] += 1
        told = exc.estimate if exc.estimate and exc.estimate > 0 else None
        if told is not None and self.calibrate:
            state.calibration.observe(sent_raw, told)
        estimate = state.calibration.estimate(sent_raw) if self.calibrate else sent_raw
        usable = window - reserved
        goal = math.floor(min(self.low_water * usable, estimate) * self.provider_retry_factor)
        ctx.emit(
            ProviderContextLimit(
                estimate=estimate, provider_estimate=told, error=str(exc), retrying=True
            )
        )
        self._remember(state, estimate, window, reserved, source)
        relieved, relieved_raw, _ = await self._relieve(
            sent,
            ctx,
            state,
            raw=sent_raw,
            estimate=estimate,
            window=window,
            reserved=reserved,
            source=source,
            goal=goal,
            provider_error=exc,
        )
        if relieved is sent:
            raise exc
        return relieved, relieved_raw

    async def _relieve(
        self,
        request: ModelRequest,
        ctx: RunContext[Any],
        state: _GuardState,
        *,
        raw: int,
        estimate: int,
        window: int,
        reserved: int,
        source: str,
        goal: int,
        provider_error: ContextLimitExceeded | None = None,
    ) -> tuple[ModelRequest, int, int]:
        """Run the policies until the estimate is at or under ``goal``; returns the request
        to send (``request`` itself when nothing changed), its raw count and estimate."""
        usable = window - reserved
        state.actions["pressure"] += 1
        ctx.emit(
            ContextPressure(
                utilisation=estimate / usable,
                estimate=estimate,
                usable=usable,
                window=window,
                reserved=reserved,
                trigger_tokens=self.trigger_tokens(usable),
                target_tokens=goal,
                window_source=source,
                model=request.model or ctx.config.model,
                provider_rejected=provider_error is not None,
            )
        )
        counter = self.counter
        conversation = ctx.conversation
        original = request.messages
        current = conversation.messages
        persist = self.persist and (original is current or original == current)
        before = estimate
        fixed = raw - counter.count_messages(original)
        messages, current_raw, estimate, freed = await run_policies(
            ctx,
            state,
            original,
            steps=zip(self.policies, self._groups, strict=True),
            counter=counter,
            calibrate=self.calibrate,
            cooldown=self.breaker_cooldown,
            threshold=self.breaker_threshold,
            fixed=fixed,
            raw=raw,
            estimate=estimate,
            goal=goal,
            persist=persist,
        )
        hard = math.floor(self.hard_limit * usable)
        if estimate > hard:
            exhausted(ctx, state, estimate, window, reserved, hard, freed, provider_error)
        self._remember(state, estimate, window, reserved, source)
        # the growth is the conversation's: a relief that is not kept leaves it as it was
        state.relief_mark = (estimate if persist else before, state.actions["checks"])
        if messages is original:
            return request, raw, estimate
        if persist:
            conversation.replace(messages, emit_new=False)
            state.actions["persisted"] += 1
        else:
            state.actions["transient"] += 1
        return request.evolve(messages=messages), current_raw, estimate


def _bool(name: str, value: Any, owner: str) -> bool:
    return flag().check(value, name, owner)

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
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

from attrs import field, frozen

from tinyctx import (
    ConfigError,
    ContextLimitExceeded,
    Event,
    Interrupted,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    PairingError,
    RunCancelled,
    RunContext,
    SystemMessage,
    TinyCtxError,
)
from tinyctx.config import Check, flag, fraction, implements, integer, number, optional, text
from tinyctx.events import EventLevel
from tinyctx.frozen import FrozenDict
from tinyctx.messages import check_pairing, pending_tool_calls
from tinyctx.ordering import Once, Outside
from tinyctx.tokens import (
    Calibration,
    TokenCounter,
    context_window,
    default_counter,
    window_table,
)

from .drop_nonessential import DropNonessential
from .fallback import Fallback
from .images import ClearOldImages
from .microcompact import Microcompact
from .policy import PressurePolicy, Relief
from .summarize import ExtractiveSummarizer, Summarize
from .trim import TrimOldest

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

Role = Literal["drop", "images", "compact", "summarize", "trim"]

ORDERS: FrozenDict[str, tuple[Role, ...]] = FrozenDict(
    {
        "default": ("drop", "images", "compact", "summarize", "trim"),
        "seed": ("drop", "trim", "summarize", "compact"),
    }
)
"""Named policy orders by role: the guard's default and the seed document's (000)."""

OrderSpec = str | Sequence[str]

# role -> factory of the built-in policy for it; one place lists what default_policies builds
_POLICY_FACTORIES: dict[str, Callable[[], PressurePolicy]] = {
    "drop": DropNonessential,
    "images": ClearOldImages,
    "compact": Microcompact,
    # offline and deterministic; pass Summarize(ModelSummarizer(model)) for model summaries
    "summarize": lambda: Summarize(ExtractiveSummarizer()),
    "trim": TrimOldest,
}


def policy_role(policy: object) -> str | None:
    """The role of ``policy`` ("drop", "images", "compact", "summarize", "trim") or None.

    Its ``role`` attribute when it has one, else guessed from its name (``Microcompact``
    → compact, ``Summarize`` → summarize, ...).
    """
    role = getattr(policy, "role", None)
    if isinstance(role, str) and role:
        return role
    name = str(getattr(policy, "name", "") or type(policy).__name__).lower()
    if "summar" in name:
        return "summarize"
    if "compact" in name:
        return "compact"
    if "trim" in name:
        return "trim"
    if "drop" in name:
        return "drop"
    return None


def breaker_group(policy: object) -> str | None:
    """The circuit-breaker group of ``policy``: its ``breaker_group`` attribute when it has
    one (None opts out), else ``"summarize"`` for a summarizing policy, else None."""
    if hasattr(policy, "breaker_group"):
        group = policy.breaker_group
        return group if isinstance(group, str) and group else None
    return "summarize" if policy_role(policy) == "summarize" else None


def _order_roles(order: OrderSpec, owner: str) -> tuple[str, ...]:
    if isinstance(order, str):
        roles = ORDERS.get(order)
        if roles is None:
            raise ConfigError(
                "order", order, f"one of {sorted(ORDERS)} or a sequence of roles", owner=owner
            )
        return roles
    roles_seq = tuple(order)
    known = set(ORDERS["default"])
    for role in roles_seq:
        if role not in known or roles_seq.count(role) > 1:
            raise ConfigError("order", order, f"distinct roles out of {sorted(known)}", owner=owner)
    return roles_seq


def order_policies(policies: Sequence[PressurePolicy], order: OrderSpec) -> list[PressurePolicy]:
    """``policies`` sorted by role in ``order`` (stable; unknown roles keep their place
    relative to each other, after the known ones)."""
    roles = _order_roles(order, "order_policies")
    rank = {role: i for i, role in enumerate(roles)}
    return sorted(policies, key=lambda p: rank.get(policy_role(p) or "", len(rank)))


def default_policies(order: OrderSpec = "default") -> list[PressurePolicy]:
    """Fresh instances of the built-in policies, in ``order`` (``"default"`` or ``"seed"``).

    The guard's default: drop non-essential context, clear old images, compact tool
    outputs, summarize, trim the oldest messages — each role filled by the built-in policy
    for it.
    """
    roles = _order_roles(order, "default_policies")
    return [_POLICY_FACTORIES[role]() for role in roles if role in _POLICY_FACTORIES]


# ---------------------------------------------------------------------------------------
# events


@frozen
class ContextPressure(Event):
    """The prompt reached the trigger; policies are about to run."""

    kind: ClassVar[str] = "context.pressure"
    level: ClassVar[EventLevel] = "info"
    utilisation: float = 0.0
    estimate: int = 0
    usable: int = 0
    window: int = 0
    reserved: int = 0
    trigger_tokens: int = 0
    target_tokens: int = 0
    window_source: str = ""
    model: str | None = None
    provider_rejected: bool = False

    def describe(self) -> str:
        return f"pressure {self.utilisation:.0%}"


@frozen
class ContextPolicyApplied(Event):
    """One policy changed the history; ``freed_tokens`` is the drop of the estimate."""

    kind: ClassVar[str] = "context.policy_applied"
    level: ClassVar[EventLevel] = "info"
    policy: str = ""
    freed_tokens: int = 0
    estimate_before: int = 0
    estimate_after: int = 0
    messages_before: int = 0
    messages_after: int = 0
    persisted: bool = False
    detail: FrozenDict[str, Any] = field(factory=FrozenDict)

    def describe(self) -> str:
        return f"{self.policy} -{self.freed_tokens}"


@frozen
class ContextPolicyFailed(Event):
    """A policy raised or broke the policy contract; the history is as it was."""

    kind: ClassVar[str] = "context.policy_failed"
    level: ClassVar[EventLevel] = "warning"
    policy: str = ""
    error_type: str = ""
    error: str = ""
    breaker_group: str | None = None
    failures: int = 0

    def describe(self) -> str:
        return f"{self.policy} failed ({self.error_type})"


@frozen
class ContextPolicySkipped(Event):
    """A policy was not run (its circuit breaker is open)."""

    kind: ClassVar[str] = "context.policy_skipped"
    level: ClassVar[EventLevel] = "info"
    policy: str = ""
    reason: str = ""

    def describe(self) -> str:
        return f"{self.policy} skipped"


@frozen
class BreakerChanged(Event):
    """A circuit breaker opened (after consecutive failures) or closed (after a success)."""

    kind: ClassVar[str] = "context.breaker"
    level: ClassVar[EventLevel] = "warning"
    group: str = ""
    state: str = ""
    failures: int = 0

    def describe(self) -> str:
        return f"breaker {self.group} {self.state}"


@frozen
class ContextExhausted(Event):
    """Every policy ran and the prompt is still over the hard limit."""

    kind: ClassVar[str] = "context.exhausted"
    level: ClassVar[EventLevel] = "error"
    estimate: int = 0
    usable: int = 0
    window: int = 0
    reserved: int = 0
    limit: int = 0
    freed: FrozenDict[str, int] = field(factory=FrozenDict)

    def describe(self) -> str:
        return f"exhausted ({self.estimate} > {self.limit})"


@frozen
class ProviderContextLimit(Event):
    """The provider rejected a prompt the guard had let through."""

    kind: ClassVar[str] = "context.provider_limit"
    level: ClassVar[EventLevel] = "warning"
    estimate: int = 0
    provider_estimate: int | None = None
    error: str = ""
    retrying: bool = False


# ---------------------------------------------------------------------------------------
# per-session state and stats


@frozen
class BreakerState:
    """One circuit breaker: ``state`` is "closed", "open" or "half_open" (next firing
    tries the policy once)."""

    group: str
    state: str
    failures: int
    skipped: int


@frozen
class BudgetStats:
    """A snapshot of one session's guard: the last check, usage, breakers, action counts.

    ``actions`` counts ``checks``, ``pressure``, ``exhausted``, ``provider_limit``,
    ``persisted``, ``transient`` and, per policy, ``"<name>.applied"``,
    ``"<name>.failed"`` and ``"<name>.skipped"``.
    """

    utilisation: float | None
    estimate: int | None
    window: int | None
    reserved: int | None
    usable: int | None
    window_source: str | None
    last_input_tokens: int | None
    last_output_tokens: int | None
    calibration_ratio: float
    hidden_tokens: int | None
    breakers: FrozenDict[str, BreakerState]
    actions: FrozenDict[str, int]


class _Breaker:
    __slots__ = ("failures", "open", "skipped")

    def __init__(self) -> None:
        self.failures = 0
        self.open = False
        self.skipped = 0

    def to_json(self) -> dict[str, Any]:
        return {"failures": self.failures, "open": self.open, "skipped": self.skipped}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Breaker:
        breaker = cls()
        breaker.failures = _state_int(data, "failures")
        breaker.skipped = _state_int(data, "skipped")
        is_open = data.get("open", False)
        if not isinstance(is_open, bool):
            raise TypeError(f"breaker 'open' must be true or false, got {is_open!r}")
        breaker.open = is_open
        return breaker


def _state_int(data: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be an integer >= 0, got {value!r}")
    return value


class _GuardState:
    """One conversation's guard state (the agent, and so the guard, is shared).

    Durable per-thread state (``ctx.thread_state``): the calibration, the reported window,
    the breakers and the action counts survive into a later session of the thread; the
    numbers of the last check are recomputed by the next one.
    """

    __slots__ = (
        "actions",
        "breakers",
        "calibration",
        "estimate",
        "last_input_tokens",
        "last_output_tokens",
        "relief_mark",
        "reported_window",
        "reserved",
        "utilisation",
        "window",
        "window_source",
    )

    def __init__(self, calibration: Calibration | None = None) -> None:
        self.calibration = calibration if calibration is not None else Calibration()
        self.reported_window: int | None = None
        self.estimate: int | None = None
        self.utilisation: float | None = None
        self.window: int | None = None
        self.reserved: int | None = None
        self.window_source: str | None = None
        self.last_input_tokens: int | None = None
        self.last_output_tokens: int | None = None
        self.breakers: dict[str, _Breaker] = {}
        self.actions: Counter[str] = Counter()
        # (estimate, checks) after the last relief (at the first check before any): the
        # conversation's growth per call since then sizes the next relief (relief_run)
        self.relief_mark: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "calibration": self.calibration.to_json(),
            "reported_window": self.reported_window,
            "last_input_tokens": self.last_input_tokens,
            "last_output_tokens": self.last_output_tokens,
            "breakers": {group: b.to_json() for group, b in sorted(self.breakers.items())},
            "actions": dict(sorted(self.actions.items())),
            "relief_mark": None if self.relief_mark is None else list(self.relief_mark),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _GuardState:
        state = cls()
        calibration = data.get("calibration")
        if not isinstance(calibration, Mapping):
            raise TypeError("calibration must be an object")
        state.calibration.load_json(calibration)
        state.reported_window = _state_int(data, "reported_window", optional=True)
        state.last_input_tokens = _state_int(data, "last_input_tokens", optional=True)
        state.last_output_tokens = _state_int(data, "last_output_tokens", optional=True)
        breakers = data.get("breakers", {})
        actions = data.get("actions", {})
        if not isinstance(breakers, Mapping) or not isinstance(actions, Mapping):
            raise TypeError("breakers and actions must be objects")
        state.breakers = {str(g): _Breaker.from_json(b) for g, b in breakers.items()}
        state.actions = Counter({str(k): _state_int(actions, k) for k in actions})
        mark = data.get("relief_mark")
        if mark is not None:
            if not isinstance(mark, list | tuple) or len(mark) != 2:
                raise TypeError("relief_mark must be [estimate, checks] or null")
            state.relief_mark = (
                _state_int({"estimate": mark[0]}, "estimate"),
                _state_int({"checks": mark[1]}, "checks"),
            )
        return state


# ---------------------------------------------------------------------------------------
# validation and environment parsing


def _fraction(
    name: str, value: Any, owner: str, *, low_open: bool = True, high: float = 1.0
) -> float:
    allowed = f"a number in (0, {high:g}]"
    if low_open:
        return float(number(above=0, maximum=high, allowed=allowed).check(value, name, owner))
    return float(number(minimum=0, maximum=high, allowed=allowed).check(value, name, owner))


_COUNTER: Check[TokenCounter] = implements(TokenCounter, allowed="a tinyctx.tokens.TokenCounter")
_RELIEF_RUN = integer(minimum=0, allowed="an integer >= 0 (calls; 0 is off)")


def _optional_int(name: str, value: Any, minimum: int, owner: str) -> int | None:
    return optional(integer(minimum=minimum)).check(value, name, owner)


def _parse_int(key: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw.strip().replace("_", ""), 10)
    except ValueError:
        raise ConfigError(
            key, raw, f"an integer >= {minimum}", owner="BudgetGuard.from_env"
        ) from None
    if value < minimum:
        raise ConfigError(key, raw, f"an integer >= {minimum}", owner="BudgetGuard.from_env")
    return value


def _parse_optional_int(key: str, raw: str, minimum: int) -> int | None:
    if raw.strip().lower() == "none":
        return None
    return _parse_int(key, raw, minimum)


def _parse_fraction(key: str, raw: str) -> float:
    text = raw.strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ConfigError(
            key,
            raw,
            "a fraction in (0, 1] such as 0.9, or a percentage such as 90%",
            owner="BudgetGuard.from_env",
        )
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(key: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(
        key, raw, f"a boolean: one of {sorted(_TRUE | _FALSE)}", owner="BudgetGuard.from_env"
    )


def _parse_order(key: str, raw: str) -> str:
    text = raw.strip().lower()
    if text not in ORDERS:
        raise ConfigError(key, raw, f"one of {sorted(ORDERS)}", owner="BudgetGuard.from_env")
    return text


_ENV: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "MAX_TOKENS": ("max_tokens", lambda k, v: _parse_int(k, v, 1)),
    "RESERVED_OUTPUT_TOKENS": ("reserved_output_tokens", lambda k, v: _parse_int(k, v, 0)),
    "TRIGGER": ("trigger", _parse_fraction),
    "HARD_LIMIT": ("hard_limit", _parse_fraction),
    "TARGET": ("target", _parse_fraction),
    "LOW_WATER": ("low_water", _parse_fraction),
    "PERSIST": ("persist", _parse_bool),
    "CALIBRATE": ("calibrate", _parse_bool),
    "ORDER": ("order", _parse_order),
    "BREAKER_THRESHOLD": ("breaker_threshold", lambda k, v: _parse_int(k, v, 1)),
    "BREAKER_COOLDOWN": ("breaker_cooldown", lambda k, v: _parse_optional_int(k, v, 0)),
    "RETRY_ON_PROVIDER_LIMIT": ("retry_on_provider_limit", _parse_bool),
    "RELIEF_RUN": ("relief_run", lambda k, v: _parse_int(k, v, 0)),
    "RELIEF_FLOOR": ("relief_floor", _parse_fraction),
}

_SETTINGS_OUTPUT_KEYS = ("max_output_tokens", "max_completion_tokens", "max_tokens")


# ---------------------------------------------------------------------------------------
# the layer


class BudgetGuard(Layer):
    """Keeps each model request inside the usable context window (see the module doc).

    ``trigger``, ``hard_limit`` and ``low_water`` are fractions of the usable window (``window -
    reserved_output_tokens``) with ``0 < low_water <= trigger <= hard_limit <= 1``. ``trigger``
    defaults to ``hard_limit``: the guard then acts only when the request would not fit under
    the hard limit, never on a conversation that fits (acting earlier rewrites a cached prefix
    the calls up to the limit would only have read, so it never costs less on a conversation
    that ends before it; ``benchmarks/bench_cost.py`` checks this on real transcripts). When the
    guard acts it relieves in one batch down to the low-water mark, so the calls after it append
    to a stable prefix (a provider's prompt cache reads it) until the trigger is reached again:
    the lower the mark, the rarer the rewrites that break the cached prefix, and the less
    context is kept. ``low_water`` defaults to half the usable window (or the trigger, when that
    is lower); :func:`~tinyctx.middleware.stacks.default_stack` relieves to 0.4, which
    ``benchmarks/bench_cost.py`` shows is cheaper on real transcripts. ``target`` is its older
    name (give one or the other). The built-in policies free what the guard asks for, oldest
    first, so the mark decides how much context a relief keeps.

    ``relief_run`` (default 0, off; ``default_stack`` sets 20) makes a relief buy room for at
    least that many calls: at the rate the conversation grew per call since the last relief,
    a relief goes below ``low_water`` when the mark would leave room for fewer calls, but
    never below ``relief_floor`` (0.2 of the usable window, or ``low_water`` when that is
    lower). A fast-growing conversation then breaks the cached prefix about once per
    ``relief_run`` calls instead of at every few, and a slow one keeps the mark's context.
    ``reserved_output_tokens`` defaults to ``RunConfig.reserved_output_tokens``, or to the
    request's ``max_tokens``-style output setting when the config reserves nothing.

    ``persist=True`` (default) commits a relieved history to the conversation with
    ``replace(..., emit_new=False)``, so the next request starts from it and a provider's
    prompt-cache prefix stays stable; it can only do so when the request's messages are the
    conversation's (an outer layer that injected messages makes that call transient).
    ``persist=False`` relieves each request on its way and never touches the history.

    A :class:`~tinyctx.ContextLimitExceeded` raised by the model (the provider said the
    prompt is too long) is answered once: the guard relieves harder — down to
    ``provider_retry_factor`` of the smaller of the target and the rejected estimate — and
    retries; a second rejection propagates.

    State (calibration, breakers, stats) is per thread (its conversation; a sub-agent has
    its own), durable: a Session with a store keeps it with the thread, so a later session
    continues the calibration and the breakers. Read it with :meth:`stats`.
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
        target: float | None = None,
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
        self._set_window(max_tokens, reserved_output_tokens, trigger, hard_limit, target, low_water)
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

    def _set_window(
        self,
        max_tokens: Any,
        reserved_output_tokens: Any,
        trigger: Any,
        hard_limit: Any,
        target: Any,
        low_water: Any,
    ) -> None:
        """The window and the thresholds, with every rule that relates them (one place)."""
        owner = "BudgetGuard"
        self.max_tokens = _optional_int("max_tokens", max_tokens, 1, owner)
        self.reserved_output_tokens = _optional_int(
            "reserved_output_tokens", reserved_output_tokens, 0, owner
        )
        if (
            self.max_tokens is not None
            and self.reserved_output_tokens is not None
            and self.reserved_output_tokens >= self.max_tokens
        ):
            raise ConfigError(
                "reserved_output_tokens",
                reserved_output_tokens,
                f"0 <= reserved_output_tokens < max_tokens ({self.max_tokens})",
                owner=owner,
            )
        self.hard_limit = _fraction("hard_limit", hard_limit, owner)
        self.trigger = self.hard_limit if trigger is None else _fraction("trigger", trigger, owner)
        if not self.trigger <= self.hard_limit:
            raise ConfigError(
                "trigger",
                trigger,
                f"0 < trigger <= hard_limit ({self.hard_limit:g}) <= 1",
                owner=owner,
            )
        if target is not None and low_water is not None and target != low_water:
            raise ConfigError(
                "target",
                target,
                f"the same as low_water ({low_water!r}) or None: target is its older name",
                owner=owner,
            )
        mark, mark_name = (low_water, "low_water") if low_water is not None else (target, "target")
        if mark is None:
            self.low_water = min(0.5, self.trigger)
        else:
            self.low_water = _fraction(mark_name, mark, owner)
            if self.low_water > self.trigger:
                raise ConfigError(
                    mark_name,
                    mark,
                    f"0 < {mark_name} <= trigger ({self.trigger:g})",
                    owner=owner,
                )

    def _set_policies(self, policies: Sequence[PressurePolicy] | None, order: Any) -> None:
        """The policies in order, each a PressurePolicy with a name unique in the guard."""
        owner = "BudgetGuard"
        if order is not None:
            _order_roles(order, owner)
        chosen = default_policies(order or "default") if policies is None else list(policies)
        for index, policy in enumerate(chosen):
            if not isinstance(policy, PressurePolicy):
                raise ConfigError(
                    f"policies[{index}]",
                    policy,
                    "a PressurePolicy (a `name` and `async relieve(messages, ctx, counter, "
                    "*, need)`)",
                    owner=owner,
                )
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

    @property
    def target(self) -> float:
        """The low-water mark under its older name."""
        return self.low_water

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
        ``LOW_WATER`` (or its older name ``TARGET``), ``RELIEF_FLOOR`` (fractions like
        ``0.9`` or percentages like ``90%``), ``RELIEF_RUN`` (calls), ``PERSIST``,
        ``CALIBRATE``, ``RETRY_ON_PROVIDER_LIMIT`` (booleans), ``ORDER`` (``default`` or
        ``seed``), ``BREAKER_THRESHOLD``, ``BREAKER_COOLDOWN`` (an integer or ``none``).
        An invalid value — or an unknown variable with the prefix — raises ConfigError
        naming the variable; nothing is silently ignored, and the same cross-field rules
        as the constructor apply (e.g. the trigger at or below the hard limit).
        """
        env = os.environ if environ is None else environ
        overrides: dict[str, Any] = {}
        source: dict[str, str] = {}
        for key in sorted(env):
            if not key.startswith(prefix):
                continue
            raw = env[key]
            spec = _ENV.get(key[len(prefix) :])
            if spec is None:
                known = ", ".join(prefix + k for k in _ENV)
                raise ConfigError(
                    key, raw, f"a known setting ({known})", owner="BudgetGuard.from_env"
                )
            field_name, parse = spec
            overrides[field_name] = parse(key, raw)
            source[field_name] = key
        try:
            return cls(**{**options, **overrides})
        except ConfigError as exc:
            culprit = source.get(exc.field)
            if culprit is None:
                raise
            raise ConfigError(
                culprit, env[culprit], exc.allowed, owner="BudgetGuard.from_env"
            ) from exc

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
            group: BreakerState(group, self._breaker_status(b), b.failures, b.skipped)
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

    def _breaker_status(self, breaker: _Breaker) -> str:
        if not breaker.open:
            return "closed"
        cooldown = self.breaker_cooldown
        if cooldown is not None and breaker.skipped >= cooldown:
            return "half_open"
        return "open"

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
        estimate = state.calibration.estimate(raw) if self.calibrate else raw
        state.actions["checks"] += 1
        checks = state.actions["checks"]
        mark = state.relief_mark
        if mark is None or mark[1] > checks:  # the first check (or counts from elsewhere)
            mark = state.relief_mark = (estimate, checks)
        self._remember(state, estimate, window, reserved, source)
        sent, sent_raw = request, raw
        if self.fires(estimate, usable):
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
        self._record(state, sent_raw, response)
        return response

    def _remember(
        self, state: _GuardState, estimate: int, window: int, reserved: int, source: str
    ) -> None:
        state.estimate = estimate
        state.window = window
        state.reserved = reserved
        state.window_source = source
        state.utilisation = estimate / (window - reserved)

    def _record(self, state: _GuardState, sent_raw: int, response: ModelResponse) -> None:
        usage = response.usage
        if usage is None:
            return
        if usage.input_tokens > 0:
            state.last_input_tokens = usage.input_tokens
            if self.calibrate:
                state.calibration.observe(sent_raw, usage.input_tokens)
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
        calibration = state.calibration
        conversation = ctx.conversation
        original = request.messages
        current = conversation.messages
        persist = self.persist and (original is current or original == current)
        before = estimate
        fixed = raw - counter.count_messages(original)
        messages = original
        current_raw = raw
        freed: dict[str, int] = {}
        for policy, group in zip(self.policies, self._groups, strict=True):
            if estimate <= goal:
                break
            name = policy.name
            breaker = state.breakers.get(group) if group is not None else None
            if breaker is not None and breaker.open:
                cooldown = self.breaker_cooldown
                if cooldown is None or breaker.skipped < cooldown:
                    breaker.skipped += 1
                    state.actions[f"{name}.skipped"] += 1
                    ctx.emit(ContextPolicySkipped(policy=name, reason=f"breaker {group} open"))
                    continue
            need = estimate - goal
            if self.calibrate:
                need = calibration.raw_for(need)
            try:
                relief = await policy.relieve(messages, ctx, counter, need=need)
                _check_relief(relief, messages)
                if relief.error is not None:
                    raise PolicyFailure(relief.error)
            except (RunCancelled, Interrupted):
                raise
            except Exception as exc:
                self._failed(ctx, state, name, group, exc)
                continue
            if group is not None:
                self._succeeded(ctx, state, group)
            after = relief.messages
            if after is messages or after == messages:
                continue
            new_raw = fixed + counter.count_messages(after)
            new_estimate = calibration.estimate(new_raw) if self.calibrate else new_raw
            state.actions[f"{name}.applied"] += 1
            ctx.emit(
                ContextPolicyApplied(
                    policy=name,
                    freed_tokens=estimate - new_estimate,
                    estimate_before=estimate,
                    estimate_after=new_estimate,
                    messages_before=len(messages),
                    messages_after=len(after),
                    persisted=persist,
                    detail=relief.detail,
                )
            )
            freed[name] = freed.get(name, 0) + estimate - new_estimate
            messages, current_raw, estimate = after, new_raw, new_estimate
        hard = math.floor(self.hard_limit * usable)
        if estimate > hard:
            state.actions["exhausted"] += 1
            ctx.emit(
                ContextExhausted(
                    estimate=estimate,
                    usable=usable,
                    window=window,
                    reserved=reserved,
                    limit=hard,
                    freed=FrozenDict(freed),
                )
            )
            raise ContextLimitExceeded(
                estimate=estimate,
                window=window,
                reserved=reserved,
                limit=hard,
                freed=freed,
                provider_message=str(provider_error) if provider_error is not None else None,
            )
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

    # -- circuit breaker -----------------------------------------------------------------

    def _failed(
        self,
        ctx: RunContext[Any],
        state: _GuardState,
        name: str,
        group: str | None,
        exc: Exception,
    ) -> None:
        state.actions[f"{name}.failed"] += 1
        failures = 0
        if group is not None:
            breaker = state.breakers.setdefault(group, _Breaker())
            breaker.failures += 1
            breaker.skipped = 0
            failures = breaker.failures
        ctx.emit(
            ContextPolicyFailed(
                policy=name,
                error_type=type(exc).__name__,
                error=str(exc),
                breaker_group=group,
                failures=failures,
            )
        )
        if group is not None:
            breaker = state.breakers[group]
            if not breaker.open and breaker.failures >= self.breaker_threshold:
                breaker.open = True
                ctx.emit(BreakerChanged(group=group, state="open", failures=breaker.failures))

    def _succeeded(self, ctx: RunContext[Any], state: _GuardState, group: str) -> None:
        breaker = state.breakers.get(group)
        if breaker is None:
            return
        was_open = breaker.open
        breaker.failures = 0
        breaker.open = False
        breaker.skipped = 0
        if was_open:
            ctx.emit(BreakerChanged(group=group, state="closed", failures=0))


def _bool(name: str, value: Any, owner: str) -> bool:
    return flag().check(value, name, owner)


def _settings_reserve(settings: Mapping[str, Any]) -> int:
    """The output cap a request's settings ask for (OpenAI/Anthropic/Gemini spellings)."""
    for key in _SETTINGS_OUTPUT_KEYS:
        value = settings.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


class PolicyFailure(TinyCtxError):
    """A policy reported a failure in its Relief (``error``) instead of raising."""


def _check_relief(relief: object, before: tuple[Message, ...]) -> None:
    """The policy contract: a Relief whose history keeps pairing and every system message."""
    if not isinstance(relief, Relief):
        raise TypeError(f"relieve() returned {type(relief).__name__}, expected a Relief")
    after = relief.messages
    if after is before:
        return
    if relief.error is not None:
        raise TypeError("a policy that reports an error must return the history unchanged")
    try:
        check_pairing(after)
    except PairingError as exc:
        raise PairingError(
            f"policy broke tool-call pairing: {exc}", index=exc.index, tool_call_id=exc.tool_call_id
        ) from exc
    waiting = {call.id for call in pending_tool_calls(before)}
    for call in pending_tool_calls(after):
        if call.id not in waiting:
            raise PairingError(
                f"policy broke tool-call pairing: call {call.id!r} lost its result",
                index=len(after),
                tool_call_id=call.id,
            )
    systems = [m for m in before if isinstance(m, SystemMessage)]
    if systems:
        kept_ids = {id(m) for m in after}
        kept = set(after)
        lost = [m for m in systems if id(m) not in kept_ids and m not in kept]
        if lost:
            raise ValueError(f"policy dropped {len(lost)} system message(s)")

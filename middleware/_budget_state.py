"""The guard's per-thread state: calibration, breakers and stats, kept with the thread."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from tinyctx.context import RunContext
from tinyctx.frozen import FrozenDict
from tinyctx.tokens import (
    Calibration,
)

from ._budget_events import BreakerChanged, ContextPolicyFailed


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
# breaker transitions


def breaker_status(breaker: _Breaker, cooldown: int | None) -> str:
    """ "closed", "open", or "half_open" once ``cooldown`` firings were skipped."""
    if not breaker.open:
        return "closed"
    if cooldown is not None and breaker.skipped >= cooldown:
        return "half_open"
    return "open"


def breaker_failed(
    ctx: RunContext[Any],
    state: _GuardState,
    name: str,
    group: str | None,
    exc: Exception,
    threshold: int,
) -> None:
    """Count a policy's failure; its group's breaker opens at ``threshold`` failures."""
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
        if not breaker.open and breaker.failures >= threshold:
            breaker.open = True
            ctx.emit(BreakerChanged(group=group, state="open", failures=breaker.failures))


def breaker_succeeded(ctx: RunContext[Any], state: _GuardState, group: str) -> None:
    """A policy of ``group`` succeeded: its breaker closes, its failures are forgotten."""
    breaker = state.breakers.get(group)
    if breaker is None:
        return
    was_open = breaker.open
    breaker.failures = 0
    breaker.open = False
    breaker.skipped = 0
    if was_open:
        ctx.emit(BreakerChanged(group=group, state="closed", failures=0))

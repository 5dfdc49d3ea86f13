"""The guard's settings checks and its ``from_env`` parsing.

Fractions or percentages, integers, booleans and orders, each naming its variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tinyctx import (
    ConfigError,
)
from tinyctx.config import Check, implements, integer, number, optional
from tinyctx.tokens import (
    TokenCounter,
)

from ._budget_policies import (
    ORDERS,
)


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
# thresholds, output reserve and the environment


T = TypeVar("T")


def guard_from_env(
    cls: Callable[..., T],
    prefix: str,
    environ: Mapping[str, str] | None,
    options: Mapping[str, Any],
) -> T:
    """``cls(**options)`` with overrides from ``{prefix}*`` variables (see ``from_env``)."""
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
            raise ConfigError(key, raw, f"a known setting ({known})", owner="BudgetGuard.from_env")
        field_name, parse = spec
        overrides[field_name] = parse(key, raw)
        source[field_name] = key
    try:
        return cls(**{**options, **overrides})
    except ConfigError as exc:
        culprit = source.get(exc.field)
        if culprit is None:
            raise
        raise ConfigError(culprit, env[culprit], exc.allowed, owner="BudgetGuard.from_env") from exc


def window_thresholds(
    max_tokens: Any,
    reserved_output_tokens: Any,
    trigger: Any,
    hard_limit: Any,
    low_water: Any,
    owner: str = "BudgetGuard",
) -> tuple[int | None, int | None, float, float, float]:
    """The window and the thresholds, with every rule that relates them (one place):
    ``(max_tokens, reserved_output_tokens, hard_limit, trigger, low_water)``."""
    checked_max_tokens = _optional_int("max_tokens", max_tokens, 1, owner)
    checked_reserved_output_tokens = _optional_int(
        "reserved_output_tokens", reserved_output_tokens, 0, owner
    )
    if (
        checked_max_tokens is not None
        and checked_reserved_output_tokens is not None
        and checked_reserved_output_tokens >= checked_max_tokens
    ):
        raise ConfigError(
            "reserved_output_tokens",
            reserved_output_tokens,
            f"0 <= reserved_output_tokens < max_tokens ({checked_max_tokens})",
            owner=owner,
        )
    checked_hard_limit = _fraction("hard_limit", hard_limit, owner)
    checked_trigger = (
        checked_hard_limit if trigger is None else _fraction("trigger", trigger, owner)
    )
    if not checked_trigger <= checked_hard_limit:
        raise ConfigError(
            "trigger",
            trigger,
            f"0 < trigger <= hard_limit ({checked_hard_limit:g}) <= 1",
            owner=owner,
        )
    if low_water is None:
        checked_low_water = min(0.5, checked_trigger)
    else:
        checked_low_water = _fraction("low_water", low_water, owner)
        if checked_low_water > checked_trigger:
            raise ConfigError(
                "low_water",
                low_water,
                f"0 < low_water <= trigger ({checked_trigger:g})",
                owner=owner,
            )
    return (
        checked_max_tokens,
        checked_reserved_output_tokens,
        checked_hard_limit,
        checked_trigger,
        checked_low_water,
    )


def _settings_reserve(settings: Mapping[str, Any]) -> int:
    """The output cap a request's settings ask for (OpenAI/Anthropic/Gemini spellings)."""
    for key in _SETTINGS_OUTPUT_KEYS:
        value = settings.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0

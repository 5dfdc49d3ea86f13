"""The guard's policies: the built-in ones by role, named orders, breaker groups, the
policy contract and the loop that runs them until the request fits."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NoReturn

from tinyctx import ConfigError
from tinyctx.context import RunContext
from tinyctx.errors import (
    ContextLimitExceeded,
    Interrupted,
    PairingError,
    RunCancelled,
    TinyCtxError,
)
from tinyctx.frozen import FrozenDict
from tinyctx.messages import Message, SystemMessage, check_pairing, pending_tool_calls
from tinyctx.tokens import TokenCounter

from ._budget_events import ContextExhausted, ContextPolicyApplied, ContextPolicySkipped
from ._budget_state import _GuardState, breaker_failed, breaker_succeeded
from .drop_nonessential import DropNonessential
from .images import ClearOldImages
from .microcompact import Microcompact
from .policy import PressurePolicy, Relief
from .summarize import ExtractiveSummarizer, Summarize
from .trim import TrimOldest

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
# the policy contract and the relief loop


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


async def run_policies(
    ctx: RunContext[Any],
    state: _GuardState,
    messages: tuple[Message, ...],
    *,
    steps: Iterable[tuple[PressurePolicy, str | None]],
    counter: TokenCounter,
    calibrate: bool,
    cooldown: int | None,
    threshold: int,
    fixed: int,
    raw: int,
    estimate: int,
    goal: int,
    persist: bool,
) -> tuple[tuple[Message, ...], int, int, dict[str, int]]:
    """Run the policies in order until the estimate is at or under ``goal``, skipping those
    whose breaker is open; returns the history, its raw count and estimate, and the tokens
    each policy freed. ``fixed`` is the raw count of the request beyond its messages."""
    calibration = state.calibration
    current_raw = raw
    freed: dict[str, int] = {}
    for policy, group in steps:
        if estimate <= goal:
            break
        name = policy.name
        breaker = state.breakers.get(group) if group is not None else None
        if (
            breaker is not None
            and breaker.open
            and (cooldown is None or breaker.skipped < cooldown)
        ):
            breaker.skipped += 1
            state.actions[f"{name}.skipped"] += 1
            ctx.emit(ContextPolicySkipped(policy=name, reason=f"breaker {group} open"))
            continue
        need = estimate - goal
        if calibrate:
            need = calibration.raw_for(need)
        try:
            relief = await policy.relieve(messages, ctx, counter, need=need)
            _check_relief(relief, messages)
            if relief.error is not None:
                raise PolicyFailure(relief.error)
        except (RunCancelled, Interrupted):
            raise
        except Exception as exc:
            breaker_failed(ctx, state, name, group, exc, threshold)
            continue
        if group is not None:
            breaker_succeeded(ctx, state, group)
        after = relief.messages
        if after is messages or after == messages:
            continue
        new_raw = fixed + counter.count_messages(after)
        new_estimate = calibration.estimate(new_raw) if calibrate else new_raw
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
    return messages, current_raw, estimate, freed


def exhausted(
    ctx: RunContext[Any],
    state: _GuardState,
    estimate: int,
    window: int,
    reserved: int,
    hard: int,
    freed: dict[str, int],
    provider_error: ContextLimitExceeded | None,
) -> NoReturn:
    """Every policy ran and the request is still over the hard limit: say so and raise."""
    usable = window - reserved
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

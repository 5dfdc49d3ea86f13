"""The tinyctx layer library: one concern per file, built on the public tinyctx API only."""

from .budget import (
    ORDERS,
    BreakerChanged,
    BreakerState,
    BudgetGuard,
    BudgetStats,
    ContextExhausted,
    ContextPolicyApplied,
    ContextPolicyFailed,
    ContextPolicySkipped,
    ContextPressure,
    ProviderContextLimit,
    default_policies,
    order_policies,
    policy_role,
)
from .drop_nonessential import DropNonessential, drop_nonessential
from .policy import PressurePolicy, Relief
from .trim import TrimOldest, trim_oldest

__all__: list[str] = [
    # context-pressure policies
    "PressurePolicy",
    "Relief",
    "DropNonessential",
    "drop_nonessential",
    "TrimOldest",
    "trim_oldest",
    # budget guard
    "BudgetGuard",
    "BudgetStats",
    "BreakerState",
    "ORDERS",
    "default_policies",
    "order_policies",
    "policy_role",
    "ContextPressure",
    "ContextPolicyApplied",
    "ContextPolicyFailed",
    "ContextPolicySkipped",
    "BreakerChanged",
    "ContextExhausted",
    "ProviderContextLimit",
]

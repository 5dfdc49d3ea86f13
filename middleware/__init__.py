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
from .context_view import (
    VIEW_GLOBAL_KEY,
    VIEW_KEY,
    VIEW_STEP_KEY,
    ContextPolicy,
    ContextView,
    ContextViewBuilt,
    ViewSpec,
    view_mapping,
    with_step_values,
)
from .control import (
    ControlIgnored,
    ControlOutcomes,
    ControlSurfaced,
    PendingCallsDropped,
    pending_control,
    take_as_response,
)
from .drop_nonessential import (
    DropNonessential,
    drop_nonessential,
)
from .extractors import (
    ExtractionJob,
    Extractor,
    ModelExtractor,
    RuleExtractor,
)
from .fallback import (
    Alternative,
    Fallback,
    FallbackAttempt,
    FallbackFailed,
)
from .inheritance import (
    Inherit,
    SubagentFinished,
    SubagentResult,
    run_subagent,
    subagent_tool,
)
from .limits import (
    CallLimits,
)
from .policy import (
    PressurePolicy,
    Relief,
)
from .retry import (
    Backoff,
    Retry,
    RetryAttempt,
    RetryFailed,
)
from .session_memory import (
    MemoryCounters,
    MemoryThresholds,
    SessionMemory,
)
from .trim import (
    TrimOldest,
    trim_oldest,
)

__all__ = [
    "PressurePolicy",
    "Relief",
    "Inherit",
    "run_subagent",
    "subagent_tool",
    "SubagentResult",
    "SubagentFinished",
    "ContextView",
    "ContextPolicy",
    "ViewSpec",
    "ContextViewBuilt",
    "view_mapping",
    "with_step_values",
    "VIEW_KEY",
    "VIEW_GLOBAL_KEY",
    "VIEW_STEP_KEY",
    "ControlOutcomes",
    "ControlIgnored",
    "ControlSurfaced",
    "PendingCallsDropped",
    "pending_control",
    "take_as_response",
    "CallLimits",
    "Retry",
    "Backoff",
    "RetryAttempt",
    "RetryFailed",
    "Fallback",
    "Alternative",
    "FallbackAttempt",
    "FallbackFailed",
    "SessionMemory",
    "MemoryCounters",
    "MemoryThresholds",
    "Extractor",
    "ExtractionJob",
    "RuleExtractor",
    "ModelExtractor",
    "DropNonessential",
    "drop_nonessential",
    "TrimOldest",
    "trim_oldest",
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

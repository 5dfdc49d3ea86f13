"""The tinyctx layer library: one concern per file, built on the public tinyctx API only."""

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
from .extractors import (
    ExtractionJob,
    Extractor,
    ModelExtractor,
    RuleExtractor,
)
from .fallback import Alternative, Fallback, FallbackAttempt, FallbackFailed
from .inheritance import (
    Inherit,
    SubagentFinished,
    SubagentResult,
    run_subagent,
    subagent_tool,
)
from .limits import CallLimits
from .policy import PressurePolicy, Relief
from .retry import Backoff, Retry, RetryAttempt, RetryFailed
from .session_memory import (
    MemoryCounters,
    MemoryThresholds,
    SessionMemory,
)

__all__ = [
    # the pressure-policy protocol
    "PressurePolicy",
    "Relief",
    # inheritance and the context view
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
    # control outcomes
    "ControlOutcomes",
    "ControlIgnored",
    "ControlSurfaced",
    "PendingCallsDropped",
    "pending_control",
    "take_as_response",
    # limits, retry, fallback
    "CallLimits",
    "Retry",
    "Backoff",
    "RetryAttempt",
    "RetryFailed",
    "Fallback",
    "Alternative",
    "FallbackAttempt",
    "FallbackFailed",
    # session memory
    "SessionMemory",
    "MemoryCounters",
    "MemoryThresholds",
    "Extractor",
    "ExtractionJob",
    "RuleExtractor",
    "ModelExtractor",
]

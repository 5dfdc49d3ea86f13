"""The tinyctx layer library: one concern per file, built on the public tinyctx API only.

This package exports the layers and the values their settings take. The events a layer
emits, its stats and its pure history functions are imported from the layer's own module,
e.g. ``from tinyctx.middleware.budget import ContextPolicyApplied`` or
``from tinyctx.middleware.microcompact import microcompact_history``."""

from .approvals import (
    Approvals,
    Review,
)
from .budget import (
    BudgetGuard,
    default_policies,
)
from .context_view import (
    ContextPolicy,
    ContextView,
    ViewSpec,
)
from .control import (
    ControlOutcomes,
)
from .drop_nonessential import (
    DropNonessential,
)
from .extractors import (
    Extractor,
    ModelExtractor,
    RuleExtractor,
)
from .fallback import (
    Alternative,
    Fallback,
)
from .images import (
    ClearOldImages,
)
from .inheritance import (
    Inherit,
    check_subagent_resume,
    run_subagent,
    subagent_tool,
)
from .limits import (
    CallLimits,
)
from .microcompact import (
    Microcompact,
)
from .policy import (
    PressurePolicy,
    Relief,
)
from .retry import (
    Backoff,
    Retry,
)
from .session_memory import (
    MemoryThresholds,
    SessionMemory,
)
from .summarize import (
    ExtractiveSummarizer,
    ModelSummarizer,
    SummarizationError,
    Summarize,
    Summarizer,
)
from .tool_result_budget import (
    ShrinkToolResults,
    ToolResultBudget,
)
from .tool_retry import (
    ToolRetry,
)
from .trim import (
    TrimOldest,
)

__all__ = [
    # the layers
    "Approvals",
    "BudgetGuard",
    "CallLimits",
    "ClearOldImages",
    "ContextView",
    "ControlOutcomes",
    "DropNonessential",
    "Fallback",
    "Inherit",
    "Microcompact",
    "Retry",
    "SessionMemory",
    "ShrinkToolResults",
    "Summarize",
    "ToolResultBudget",
    "ToolRetry",
    "TrimOldest",
    # what their settings take
    "Review",
    "Alternative",
    "Backoff",
    "MemoryThresholds",
    "ContextPolicy",
    "ViewSpec",
    "Summarizer",
    "ModelSummarizer",
    "ExtractiveSummarizer",
    "Extractor",
    "RuleExtractor",
    "ModelExtractor",
    "PressurePolicy",
    "Relief",
    "default_policies",
    # subagents
    "subagent_tool",
    "run_subagent",
    "check_subagent_resume",
    # errors
    "SummarizationError",
]

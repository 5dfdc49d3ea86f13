"""The tinyctx layer library: one concern per file, built on the public tinyctx API only."""

from .microcompact import (
    DEFAULT_PLACEHOLDER,
    Microcompact,
    MicrocompactApplied,
    MicrocompactStats,
    microcompact,
)
from .summarize import (
    DEFAULT_SUMMARY_PROMPT,
    SUMMARY_PREFIX,
    ExtractiveSummarizer,
    ModelSummarizer,
    SummarizationError,
    Summarize,
    Summarizer,
    SummaryApplied,
    SummaryFailed,
    SummaryStats,
    is_summary,
    render_transcript,
    summarize_history,
    summary_split,
)
from .tool_result_budget import (
    DEFAULT_BUDGET_BYTES,
    BudgetStats,
    HistoryBudgetStats,
    ToolResultBudget,
    ToolResultTruncated,
    budget_history,
    budget_tool_result,
)

__all__: list[str] = [
    # tool-result budget
    "ToolResultBudget",
    "budget_tool_result",
    "budget_history",
    "BudgetStats",
    "HistoryBudgetStats",
    "ToolResultTruncated",
    "DEFAULT_BUDGET_BYTES",
    # microcompaction
    "Microcompact",
    "microcompact",
    "MicrocompactStats",
    "MicrocompactApplied",
    "DEFAULT_PLACEHOLDER",
    # summarization
    "Summarize",
    "Summarizer",
    "ModelSummarizer",
    "ExtractiveSummarizer",
    "summarize_history",
    "summary_split",
    "render_transcript",
    "is_summary",
    "SummaryStats",
    "SummarizationError",
    "SummaryApplied",
    "SummaryFailed",
    "SUMMARY_PREFIX",
    "DEFAULT_SUMMARY_PROMPT",
]

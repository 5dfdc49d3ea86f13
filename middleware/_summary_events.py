"""The events of summarization: a summary applied, a summary failed (the history unchanged).

Kept apart from :mod:`tinyctx.middleware.summarize`, which re-exports them under its name.
"""

from __future__ import annotations

from typing import ClassVar

from attrs import frozen

from tinyctx import Event
from tinyctx.events import EventLevel

from ._summary_history import Summarizer, SummaryStats

__all__ = ["SummaryApplied", "SummaryFailed"]


@frozen
class SummaryApplied(Event):
    """The older part of the history was replaced by a summary."""

    kind: ClassVar[str] = "compaction.summary"
    level: ClassVar[EventLevel] = "info"
    summarized: int = 0
    kept: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    summarizer: str = ""
    persisted: bool = False
    source: str = "layer"

    @classmethod
    def of(
        cls,
        stats: SummaryStats,
        summarizer: Summarizer,
        *,
        persisted: bool = False,
        source: str = "layer",
    ) -> SummaryApplied:
        return cls(
            summarized=stats.summarized,
            kept=stats.kept,
            tokens_before=stats.tokens_before,
            tokens_after=stats.tokens_after,
            summarizer=type(summarizer).__name__,
            persisted=persisted,
            source=source,
        )

    def describe(self) -> str | None:
        if self.source != "layer":
            return None  # as a guard policy, the guard's own event reports it
        return f"summary of {self.summarized} -{self.tokens_before - self.tokens_after}"


@frozen
class SummaryFailed(Event):
    """A summary failed; the history is unchanged. ``disabled``: the layer stopped trying."""

    kind: ClassVar[str] = "compaction.summary_failed"
    level: ClassVar[EventLevel] = "warning"
    error: str = ""
    consecutive_failures: int = 0
    disabled: bool = False
    source: str = "layer"

    def describe(self) -> str | None:
        return None if self.source != "layer" else "summary failed"

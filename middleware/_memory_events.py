"""Session memory's events.

Every state change is an event: ``session_memory.started``, ``.completed`` (notes
written), ``.failed`` (why, and whether it was a cancellation), ``.skipped`` (debug: which
thresholds were not met, or why else), ``.loaded`` (notes offered), ``.load_failed`` and
``.toggled``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from attrs import frozen

from tinyctx import (
    Event,
)
from tinyctx.events import EventLevel


@frozen
class MemoryExtractionStarted(Event):
    """An extraction started in the background; the growth that triggered it."""

    kind: ClassVar[str] = "session_memory.started"
    level: ClassVar[EventLevel] = "info"
    namespace: str = ""
    extraction: int = 0
    tokens: int = 0
    tool_calls: int = 0
    turns: int = 0
    messages: int = 0


@frozen
class MemoryExtractionCompleted(Event):
    """An extraction finished: ``notes_written`` new notes (``seqs``) in ``namespace``."""

    kind: ClassVar[str] = "session_memory.completed"
    level: ClassVar[EventLevel] = "info"
    namespace: str = ""
    extraction: int = 0
    notes_written: int = 0
    proposed: int = 0
    duplicates: int = 0
    seqs: tuple[int, ...] = ()
    seconds: float = 0.0


@frozen
class MemoryExtractionFailed(Event):
    """An extraction failed or was cancelled; nothing was written, the deltas stay."""

    kind: ClassVar[str] = "session_memory.failed"
    level: ClassVar[EventLevel] = "warning"
    namespace: str = ""
    extraction: int = 0
    error: str = ""
    cancelled: bool = False
    seconds: float = 0.0


@frozen
class MemoryExtractionSkipped(Event):
    """A run ended without starting an extraction, and why."""

    kind: ClassVar[str] = "session_memory.skipped"
    level: ClassVar[EventLevel] = "debug"
    reason: Literal["thresholds", "run_failed", "no_namespace"] = "thresholds"
    unmet: tuple[str, ...] = ()
    detail: str = ""


@frozen
class MemoryExtractionQueued(Event):
    """A run ended with the thresholds met while extraction ``behind`` was in progress: an
    extraction is queued and runs right after it (several such runs queue one)."""

    kind: ClassVar[str] = "session_memory.queued"
    level: ClassVar[EventLevel] = "info"
    namespace: str = ""
    behind: int = 0
    messages: int = 0


@frozen
class MemoryLoaded(Event):
    """Stored notes were loaded at run start; ``injected`` of them fit the section."""

    kind: ClassVar[str] = "session_memory.loaded"
    level: ClassVar[EventLevel] = "debug"
    namespace: str = ""
    notes: int = 0
    injected: int = 0
    tokens: int = 0


@frozen
class MemoryLoadFailed(Event):
    """Reading notes for injection failed; the run goes on without (new) notes."""

    kind: ClassVar[str] = "session_memory.load_failed"
    level: ClassVar[EventLevel] = "warning"
    namespace: str = ""
    error: str = ""


@frozen
class MemoryToggled(Event):
    kind: ClassVar[str] = "session_memory.toggled"
    level: ClassVar[EventLevel] = "info"
    enabled: bool = True

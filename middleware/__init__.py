"""The tinyctx layer library: one concern per file, built on the public tinyctx API only."""

from .extractors import (
    ExtractionJob,
    Extractor,
    ModelExtractor,
    RuleExtractor,
)
from .session_memory import (
    MemoryCounters,
    MemoryThresholds,
    SessionMemory,
)

__all__: list[str] = [
    # session memory
    "SessionMemory",
    "MemoryCounters",
    "MemoryThresholds",
    "Extractor",
    "ExtractionJob",
    "RuleExtractor",
    "ModelExtractor",
]

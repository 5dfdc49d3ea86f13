"""Session memory's run state and settings checks.

The section offered to model calls, the queued extraction, and what one run holds.
"""

from __future__ import annotations

from typing import Any

import anyio
from attrs import frozen

from tinyctx import Message, RunContext
from tinyctx.config import (
    Check,
    function,
    implements,
    integer,
    optional,
)
from tinyctx.conversation import Conversation, MessageTap
from tinyctx.stores import Note, Store
from tinyctx.tokens import TokenCounter

from ._memory_counters import (
    MemoryCounters,
    MemoryThresholds,
    _non_negative_count,
)
from ._unread import Unread, fingerprint
from .extractors import (
    Extractor,
)


@frozen
class MemorySection:
    """The system-prompt section offered to model calls: its text, notes and tokens."""

    text: str
    notes: tuple[Note, ...]
    tokens: int


SECTION_HEADER = (
    "## Session memory\n"
    "Notes saved from earlier conversations, newest first. Use them when relevant; "
    "the current conversation takes precedence."
)


_Source = tuple[Conversation, "MessageTap | None"]
"""Where an extraction reads: the session's conversation and the layer's tap on it."""


@frozen
class _Queued:
    """An extraction triggered while another ran: what it extracts, and where to."""

    ctx: RunContext[Any]
    messages: tuple[Message, ...]
    namespace: str
    store: Store


class _MemoryState:
    """What one thread keeps for the layer (durable: ``ctx.thread_state``).

    ``pending`` marks an extraction that was due but did not complete: it was in progress
    or queued when the state was written (the process may stop), or was cancelled when its
    session ended. A later session of the thread starts it at its next run end, thresholds
    or not. ``queued`` is the extraction triggered while another ran (in this process).
    """

    __slots__ = (
        "counters",
        "pending",
        "queued",
        "section",
        "seen_fingerprint",
        "seen_last",
        "seen_upto",
        "unread",
        "view",
    )

    def __init__(self, counters: MemoryCounters) -> None:
        self.counters = counters
        # (agent run id, the view carriers its model calls had here): extraction for that
        # run runs under the same filtered view
        self.view: tuple[str, dict[str, Any]] | None = None
        self.section: MemorySection | None = None
        # at most one extraction waits for the running one (the newest trigger's history)
        self.queued: _Queued | None = None
        # how far successful extractions of this thread read the conversation
        self.seen_upto = 0
        self.seen_last: Message | None = None
        # a restored mark knows its last message by fingerprint until it is matched again
        self.seen_fingerprint: str | None = None
        self.pending = False
        # every message committed since the last extraction, as committed (compaction
        # rewrites the conversation, not this): what the next extraction reads
        self.unread = Unread()

    def since(self, messages: tuple[Message, ...]) -> int:
        upto = self.seen_upto
        if 0 < upto <= len(messages):
            last = messages[upto - 1]
            if last is self.seen_last:
                return upto
            if self.seen_fingerprint is not None and fingerprint(last) == self.seen_fingerprint:
                self.seen_last, self.seen_fingerprint = last, None
                return upto
        return 0  # nothing read yet, or the history was rewritten since

    def advance(self, messages: tuple[Message, ...], unread: int = 0) -> None:
        """Extractions read ``messages`` up to its last ``unread`` (the mark a later
        session continues from; a rewrite that shrank the tail only moves it earlier)."""
        upto = max(0, len(messages) - unread)
        self.seen_upto = upto
        self.seen_last = messages[upto - 1] if upto else None
        self.seen_fingerprint = None

    def reading(self, messages: tuple[Message, ...]) -> tuple[tuple[Message, ...], int]:
        """What the next extraction reads: the history already read (as it is now, empty
        when it was rewritten) followed by every message committed since, as committed;
        and how many of those there are."""
        since = self.since(messages)
        if not self.unread.is_open:
            return messages, len(messages) - since
        fresh = self.unread.messages
        return (*messages[:since], *fresh), len(fresh)

    def to_json(self) -> dict[str, Any]:
        last = self.seen_last
        data = {
            "counters": self.counters.to_json(),
            "seen_upto": self.seen_upto,
            "seen": fingerprint(last) if last is not None else self.seen_fingerprint,
            "pending": self.pending or self.counters.in_progress or self.queued is not None,
        }
        unread = self.unread.to_json()
        if unread is not None:
            data["unread"] = unread
        return data

    @classmethod
    def from_json(cls, data: Any, thresholds: MemoryThresholds) -> _MemoryState:
        if not isinstance(data, dict):
            raise TypeError(f"SessionMemory state must be an object, got {data!r}")
        state = cls(MemoryCounters.from_json(data.get("counters"), thresholds))
        state.unread = Unread.from_json(data.get("unread"))
        state.seen_upto = _non_negative_count("seen_upto", data.get("seen_upto", 0))
        seen = data.get("seen")
        if seen is not None and not isinstance(seen, str):
            raise TypeError(f"SessionMemory state: seen must be a string, got {seen!r}")
        state.seen_fingerprint = seen
        pending = data.get("pending", False)
        if not isinstance(pending, bool):
            raise TypeError(f"SessionMemory state: pending must be true or false, got {pending!r}")
        state.pending = pending
        return state


def _error_text(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return "cancelled before it finished (the session ended or was cancelled)"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_POSITIVE = integer(minimum=1)
_EXTRACTOR: Check[Extractor] = Check(
    lambda value: callable(getattr(value, "extract", None)),
    "an object with async extract(job, ctx)",
)
_STORE: Check[Store | str] = Check(
    lambda value: isinstance(value, Store) or (isinstance(value, str) and bool(value)),
    "a tinyctx Store or the name of one in ctx.stores",
)
_NAMESPACE = optional(function(), allowed="None or a function (RunConfig) -> str | None")
_COUNTER: Check[TokenCounter | None] = optional(
    implements(TokenCounter), allowed="a TokenCounter or None"
)

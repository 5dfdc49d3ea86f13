"""Session memory: durable notes extracted in the background and offered to later calls.

Three pieces:

- :class:`MemoryCounters`, one per session: how much the conversation grew since the last
  extraction (tokens, tool calls, turns) and the extraction state machine. It is the only
  mutable thing here and has a narrow API.
- an :class:`~tinyctx.middleware.extractors.Extractor` that turns conversation into note
  texts (:class:`~tinyctx.middleware.extractors.RuleExtractor` by default).
- :class:`SessionMemory`, the layer: it feeds the counters, starts an extraction in the
  session's task group when they say so, writes the notes to a
  :class:`~tinyctx.stores.Store`, and offers stored notes to later model calls.

**Counters.** ``tokens`` grows with the context the provider reports: each model response's
``input_tokens + output_tokens`` is the conversation's size at that call, and the counter
adds how much it grew since the previous report (a shrink, e.g. after compaction, adds
nothing), so it never goes down and counts each new token of conversation once. ``tool_calls``
counts finished tool calls, ``turns`` finished runs. ``should_extract()`` is true only when
enabled, no extraction is in progress, and every growth since the last successful
extraction reached its threshold (:class:`MemoryThresholds`, defaults 4000 / 8 / 4).

``begin()`` returns a ticket holding the counters *at start* and marks the extraction in
progress; ``complete(ticket)`` moves the marks to those start values (whatever arrived
while it ran stays counted for the next one); ``fail(ticket)`` only clears in-progress (the
deltas stay, so the next turn retries). Disabled counters do no bookkeeping at all and
never extract; an extraction already running when they are disabled still finishes.

**Extraction.** At the end of a run that produced a result, the layer ticks a turn and,
when ``should_extract()``, starts the extraction with ``ctx.spawn``: the run returns
without waiting. A run whose thresholds are met while an extraction is in progress queues
one (``session_memory.queued``; several such runs queue one, over the newest history): it
starts in the same background task as soon as the running one ends, so the last facts of
a session are extracted too, and leaving the session waits for the queue within its grace
period. A queue cut off by the grace period stays pending (:meth:`SessionMemory.pending`).
The extractor gets a child context of the run (tag
``session_memory.extraction``, its own empty conversation, linked cancellation, and the
filtered context view the run's model calls had at this layer, so a field an enclosing
``Inherit`` policy excluded never reaches it: place ``Inherit`` outside this layer) and
every message committed since the last extraction, as it was committed: a tool result
Microcompact cleared, or a head Summarize or a budget relief replaced, reaches the
extractor with its original content (the layer reads them through a
:class:`~tinyctx.MessageTap` on the conversation, and its thread state keeps what is still
unread for a later session: see ``middleware/_unread.py``). Its bullets are de-duplicated
against the newest
``scan_notes`` stored notes and written in one atomic batch (shielded from cancellation once
started, so a note batch is all written or not at all). An extractor that raises, or is
cancelled when the session ends after its grace period, fails the extraction: nothing is
written and the deltas stay. The batch is fenced by the session's thread lease
(``ctx.thread_lease()``): a worker that lost its thread to another (frozen past its lease)
gets ``FencedOut``, reported as ``.failed``, and writes nothing; the new owner extracts those
messages once. A run that ends interrupted ticks nothing (its resumption will).

**Namespaces.** Notes of a run go to ``"{prefix}:thread:{thread_id}"`` (``scope="thread"``,
the default) or ``"{prefix}:user:{user_id}"`` (``scope="user"``; a run without a user id
falls back to its thread). ``namespace=`` takes a function of the ``RunConfig`` for any
other scheme (returning None skips memory for that run).

**Injection.** With ``inject=True`` the newest ``scan_notes`` notes of the run's namespace
are loaded when a run starts and offered to every model call of the run as a section
appended to the system prompt: newest first, greedily (a note too big for what is left is
skipped, an older shorter one may still fit), the whole section at most
``inject_max_tokens`` by ``counter``. The request is rewritten for the call only; the
conversation is never changed. Notes written during a run are offered from the next run
on (a stable system prompt within a run keeps the provider's prompt cache warm), including
in a new session of the same thread (or user).

Every state change is an event: ``session_memory.started``, ``.completed`` (notes
written), ``.failed`` (why, and whether it was a cancellation), ``.skipped`` (debug: which
thresholds were not met, or why else), ``.loaded`` (notes offered), ``.load_failed`` and
``.toggled``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import anyio
import attrs
from attrs import field, frozen

from tinyctx import (
    ConfigError,
    Event,
    Interrupted,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunConfig,
    RunContext,
    RunResult,
    TinyCtxError,
    ToolCall,
    ToolError,
    ToolResult,
)
from tinyctx.chain import ToolCallHandler
from tinyctx.config import (
    Check,
    flag,
    function,
    implements,
    integer,
    one_of,
    optional,
    owned_by,
    text,
)
from tinyctx.conversation import Conversation, MessageTap
from tinyctx.events import EventLevel
from tinyctx.ordering import Inside, Once
from tinyctx.stores import Note, Store, append_notes
from tinyctx.tokens import TokenCounter, default_counter

from ._unread import Unread, fingerprint
from .context_view import VIEW_GLOBAL_KEY, VIEW_KEY, VIEW_STEP_KEY
from .extractors import (
    ExtractionJob,
    Extractor,
    RuleExtractor,
    check_bullets,
    dedupe_bullets,
)
from .inheritance import Inherit

__all__ = [
    "SessionMemory",
    "MemoryCounters",
    "MemoryThresholds",
    "Counts",
    "ExtractionTicket",
    "ExtractionStateError",
    "MemorySection",
    "EXTRACTION_TAG",
    "MemoryExtractionStarted",
    "MemoryExtractionCompleted",
    "MemoryExtractionFailed",
    "MemoryExtractionSkipped",
    "MemoryExtractionQueued",
    "MemoryLoaded",
    "MemoryLoadFailed",
    "MemoryToggled",
]

VIEW_CARRIERS = (VIEW_KEY, VIEW_GLOBAL_KEY, VIEW_STEP_KEY)
"""``configurable`` keys of a materialized context view (raw tiers shadowed) that an
extraction takes over from the run's model calls."""

EXTRACTION_TAG = "session_memory.extraction"
"""Tag of an extraction's context; the layer neither counts nor injects in such calls."""

Scope = Literal["thread", "user"]


# ---------------------------------------------------------------------------------------
# configuration and counters


_count_at_least_zero = integer(minimum=0)


@frozen
class MemoryThresholds:
    """How much the conversation must grow between extractions (each must be reached).

    0 means "no requirement" for that counter.
    """

    min_tokens: int = field(default=4000, validator=_count_at_least_zero)
    min_tool_calls: int = field(default=8, validator=_count_at_least_zero)
    min_turns: int = field(default=4, validator=_count_at_least_zero)

    def evolve(self, **changes: Any) -> MemoryThresholds:
        return attrs.evolve(self, **changes)


@frozen
class Counts:
    """Token growth, tool calls and turns: totals, marks or deltas."""

    tokens: int = 0
    tool_calls: int = 0
    turns: int = 0

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.tokens - other.tokens,
            self.tool_calls - other.tool_calls,
            self.turns - other.turns,
        )


@frozen
class ExtractionTicket:
    """One started extraction: its number and the counters when it started."""

    number: int
    at: Counts


class ExtractionStateError(TinyCtxError):
    """A transition the extraction state machine does not allow (a bug in the caller)."""


def _non_negative_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"MemoryCounters: {name} must be an integer >= 0, got {value!r}")
    return value


class MemoryCounters:
    """Per-session growth counters and the extraction state (see the module docstring).

    Every method validates before it changes anything, so a bad call leaves the state as it
    was; no method awaits, so no transition can be interleaved with another.
    """

    __slots__ = (
        "_baseline",
        "_enabled",
        "_extractions",
        "_failures",
        "_marks",
        "_started",
        "_ticket",
        "_tokens",
        "_tool_calls",
        "_turns",
        "thresholds",
    )

    def __init__(self, thresholds: MemoryThresholds | None = None, *, enabled: bool = True) -> None:
        if thresholds is not None and not isinstance(thresholds, MemoryThresholds):
            raise ConfigError(
                "thresholds", thresholds, "a MemoryThresholds or None", owner="MemoryCounters"
            )
        self.thresholds = thresholds if thresholds is not None else MemoryThresholds()
        self._enabled = bool(enabled)
        self._tokens = 0
        self._tool_calls = 0
        self._turns = 0
        # the context size last reported; None after re-enabling: the next report is a
        # new baseline, so growth while disabled is never counted
        self._baseline: int | None = 0
        self._marks = Counts()
        self._ticket: ExtractionTicket | None = None
        self._started = 0
        self._extractions = 0
        self._failures = 0

    def __repr__(self) -> str:
        state = "disabled" if not self._enabled else "in progress" if self._ticket else "idle"
        return f"<MemoryCounters {state} totals={self.totals} marks={self._marks}>"

    # -- reading -------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def in_progress(self) -> bool:
        return self._ticket is not None

    @property
    def ticket(self) -> ExtractionTicket | None:
        """The extraction in progress, if any."""
        return self._ticket

    @property
    def totals(self) -> Counts:
        """Everything counted in this session (never decreases)."""
        return Counts(self._tokens, self._tool_calls, self._turns)

    @property
    def marks(self) -> Counts:
        """The totals when the last successful extraction started (zeros before one)."""
        return self._marks

    def deltas(self) -> Counts:
        """Growth since the last successful extraction's start: ``totals - marks``."""
        return self.totals - self._marks

    @property
    def extractions(self) -> int:
        """Extractions that completed."""
        return self._extractions

    @property
    def failures(self) -> int:
        """Extractions that failed (or were cancelled)."""
        return self._failures

    @property
    def started(self) -> int:
        return self._started

    def unmet(self) -> tuple[str, ...]:
        """Names of the thresholds the deltas have not reached (``tokens``, ``tool_calls``,
        ``turns``), in that order."""
        deltas, t = self.deltas(), self.thresholds
        missing: list[str] = []
        if deltas.tokens < t.min_tokens:
            missing.append("tokens")
        if deltas.tool_calls < t.min_tool_calls:
            missing.append("tool_calls")
        if deltas.turns < t.min_turns:
            missing.append("turns")
        return tuple(missing)

    def should_extract(self) -> bool:
        """Enabled, nothing in progress, and every threshold reached."""
        return self._enabled and self._ticket is None and not self.unmet()

    def describe(self) -> str:
        """``"tokens 120/4000, tool_calls 3/8, turns 1/4"``: deltas against thresholds."""
        d, t = self.deltas(), self.thresholds
        return (
            f"tokens {d.tokens}/{t.min_tokens}, tool_calls {d.tool_calls}/{t.min_tool_calls}, "
            f"turns {d.turns}/{t.min_turns}"
        )

    # -- bookkeeping (no-ops while disabled) ---------------------------------------------

    def record_usage(self, context_tokens: int) -> None:
        """A model call reported a context of ``context_tokens`` (input + output tokens)."""
        size = _non_negative_count("context_tokens", context_tokens)
        if not self._enabled:
            return
        baseline = self._baseline
        if baseline is not None and size > baseline:
            self._tokens += size - baseline
        self._baseline = size

    def record_tool_calls(self, count: int = 1) -> None:
        """``count`` tool calls finished."""
        count = _non_negative_count("count", count)
        if self._enabled:
            self._tool_calls += count

    def tick_turn(self) -> None:
        """A turn (a run) finished."""
        if self._enabled:
            self._turns += 1

    # -- the extraction state machine ----------------------------------------------------

    def begin(self) -> ExtractionTicket:
        """Mark an extraction in progress; the ticket remembers the counters now."""
        if not self._enabled:
            raise ExtractionStateError("session memory is disabled: no extraction may start")
        if self._ticket is not None:
            raise ExtractionStateError(
                f"extraction {self._ticket.number} is still in progress; finish it first"
            )
        self._started += 1
        ticket = ExtractionTicket(self._started, self.totals)
        self._ticket = ticket
        return ticket

    def _finish(self, ticket: ExtractionTicket, outcome: str) -> None:
        if not isinstance(ticket, ExtractionTicket) or ticket is not self._ticket:
            current = self._ticket.number if self._ticket is not None else "none"
            raise ExtractionStateError(
                f"cannot {outcome} {ticket!r}: it is not the extraction in progress "
                f"(in progress: {current})"
            )
        self._ticket = None

    def complete(self, ticket: ExtractionTicket) -> None:
        """The extraction of ``ticket`` succeeded: marks move to the counters at its start."""
        self._finish(ticket, "complete")
        self._marks = ticket.at
        self._extractions += 1

    def fail(self, ticket: ExtractionTicket) -> None:
        """The extraction of ``ticket`` failed: in-progress clears, the deltas stay."""
        self._finish(ticket, "fail")
        self._failures += 1

    def disable(self) -> None:
        """Stop all bookkeeping; nothing extracts until :meth:`enable`."""
        self._enabled = False

    def enable(self) -> None:
        """Resume bookkeeping; growth while disabled is not counted."""
        if not self._enabled:
            self._enabled = True
            self._baseline = None

    # -- durable form ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Totals, marks, the baseline and the tallies as plain JSON. An extraction in
        progress is not part of it: it did not complete, so its deltas are still counted
        (the layer records it as pending work)."""
        return {
            "enabled": self._enabled,
            "totals": [self._tokens, self._tool_calls, self._turns],
            "marks": [self._marks.tokens, self._marks.tool_calls, self._marks.turns],
            "baseline": self._baseline,
            "started": self._started,
            "extractions": self._extractions,
            "failures": self._failures,
        }

    @classmethod
    def from_json(cls, data: Any, thresholds: MemoryThresholds | None = None) -> MemoryCounters:
        """Counters that continue from :meth:`to_json`'s document (ValueError names the key)."""
        if not isinstance(data, dict):
            raise TypeError(f"MemoryCounters state must be an object, got {data!r}")
        enabled = data.get("enabled")
        if not isinstance(enabled, bool):
            raise TypeError(f"MemoryCounters state: enabled must be true or false, got {enabled!r}")
        counters = cls(thresholds, enabled=enabled)
        totals = _three_counts(data, "totals")
        marks = _three_counts(data, "marks")
        if any(m > t for m, t in zip(marks, totals, strict=True)):
            raise ValueError(f"MemoryCounters state: marks {marks} exceed totals {totals}")
        counters._tokens, counters._tool_calls, counters._turns = totals
        counters._marks = Counts(*marks)
        baseline = data.get("baseline")
        counters._baseline = None if baseline is None else _non_negative_count("baseline", baseline)
        counters._started = _non_negative_count("started", data.get("started"))
        counters._extractions = _non_negative_count("extractions", data.get("extractions"))
        counters._failures = _non_negative_count("failures", data.get("failures"))
        return counters


def _three_counts(data: dict[str, Any], key: str) -> tuple[int, int, int]:
    value = data.get(key)
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"MemoryCounters state: {key} must be [tokens, tool_calls, turns]")
    tokens, tool_calls, turns = (_non_negative_count(f"{key}[{i}]", v) for i, v in enumerate(value))
    return tokens, tool_calls, turns


# ---------------------------------------------------------------------------------------
# events


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


# ---------------------------------------------------------------------------------------
# the layer


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


class SessionMemory(Layer):
    """Extract durable notes in the background and offer them to later calls.

    ``SessionMemory(extractor=None, *, store="memory", min_tokens=4000, min_tool_calls=8,
    min_turns=4, enabled=True, inject=True, inject_max_tokens=800, scan_notes=200,
    scope="thread", namespace=None, prefix="session_memory", counter=None)``

    ``extractor`` defaults to an offline :class:`RuleExtractor`; pass a
    :class:`ModelExtractor` for model-written notes. ``store`` is a :class:`Store` or the
    name of one in ``ctx.stores`` (an unknown name fails the run at its start, loudly).
    ``enabled=False`` turns off counting and extraction (injection is ``inject``'s
    business: an application can offer notes written elsewhere). See the module docstring
    for counters, namespaces and injection.
    """

    constraints = (
        Once(reason="two would extract the same conversation twice into one store"),
        Inside(
            Inherit,
            reason="extraction runs under the context view this layer sees; outside Inherit "
            "it would see fields Inherit's policy excludes",
        ),
    )

    def __init__(
        self,
        extractor: Extractor | None = None,
        *,
        store: Store | str = "memory",
        min_tokens: int = 4000,
        min_tool_calls: int = 8,
        min_turns: int = 4,
        enabled: bool = True,
        inject: bool = True,
        inject_max_tokens: int = 800,
        scan_notes: int = 200,
        scope: Scope = "thread",
        namespace: Callable[[RunConfig], str | None] | None = None,
        prefix: str = "session_memory",
        counter: TokenCounter | None = None,
        name: str | None = None,
    ) -> None:
        if extractor is None:
            extractor = RuleExtractor()
        _EXTRACTOR.check(extractor, "extractor", "SessionMemory")
        _STORE.check(store, "store", "SessionMemory")
        flag().check(enabled, "enabled", "SessionMemory")
        flag().check(inject, "inject", "SessionMemory")
        one_of(("thread", "user")).check(scope, "scope", "SessionMemory")
        _NAMESPACE.check(namespace, "namespace", "SessionMemory")
        text().check(prefix, "prefix", "SessionMemory")
        _COUNTER.check(counter, "counter", "SessionMemory")
        self.extractor: Extractor = extractor
        self.store = store
        with owned_by("SessionMemory"):
            self.thresholds = MemoryThresholds(min_tokens, min_tool_calls, min_turns)
        self.enabled = enabled
        self.inject = inject
        self.inject_max_tokens = _POSITIVE.check(
            inject_max_tokens, "inject_max_tokens", "SessionMemory"
        )
        self.scan_notes = _POSITIVE.check(scan_notes, "scan_notes", "SessionMemory")
        self.scope: Scope = scope
        self.prefix = prefix
        self.counter: TokenCounter = counter if counter is not None else default_counter()
        self._namespace = namespace
        if name is not None:
            self.name = name

    # -- per-session state and lookups -------------------------------------------------

    def _new_state(self) -> _MemoryState:
        return _MemoryState(MemoryCounters(self.thresholds, enabled=self.enabled))

    def _restore_state(self, data: Any) -> _MemoryState:
        return _MemoryState.from_json(data, self.thresholds)

    def _state(self, ctx: RunContext[Any]) -> _MemoryState:
        state = ctx.thread_state(self, self._new_state, self._restore_state)
        unread = state.unread
        if state.counters.enabled:
            if not unread.is_open:
                # from here every committed message is recorded as committed; what came
                # before and no extraction read yet is the backlog
                unread.open(ctx.conversation, state.since(ctx.conversation.messages))
        elif unread.is_open:  # disabled: no bookkeeping at all
            unread.close()
        return state

    def counters(self, ctx: RunContext[Any]) -> MemoryCounters:
        """This session's counters (``ctx`` is the session's or any of its runs')."""
        return self._state(ctx).counters

    def section(self, ctx: RunContext[Any]) -> MemorySection | None:
        """The section this session currently offers to model calls, if any."""
        return self._state(ctx).section

    def disable(self, ctx: RunContext[Any]) -> None:
        """Stop counting and extracting in this session."""
        counters = self.counters(ctx)
        if counters.enabled:
            counters.disable()
            ctx.emit(MemoryToggled(enabled=False))

    def enable(self, ctx: RunContext[Any]) -> None:
        """Resume counting and extracting in this session."""
        counters = self.counters(ctx)
        if not counters.enabled:
            counters.enable()
            ctx.emit(MemoryToggled(enabled=True))

    def namespace_for(self, config: RunConfig) -> str | None:
        """The notes namespace of a run (see the module docstring)."""
        if self._namespace is not None:
            return self._namespace(config)
        if self.scope == "user" and config.user_id is not None:
            return f"{self.prefix}:user:{config.user_id}"
        return f"{self.prefix}:thread:{config.thread_id}"

    def store_for(self, ctx: RunContext[Any]) -> Store:
        """The store given, or the one named in ``ctx.stores`` (KeyError names the known)."""
        store = self.store
        return ctx.stores[store] if isinstance(store, str) else store

    def render(self, notes: Sequence[Note]) -> MemorySection | None:
        """The section for ``notes`` (oldest first, as stores return them): newest first,
        greedy, at most ``inject_max_tokens``; None when no note fits."""
        count = self.counter.count_text
        budget = self.inject_max_tokens
        used = count(SECTION_HEADER)
        chosen: list[Note] = []
        for note in reversed(notes):
            cost = count(f"\n- {note.text}")
            if used + cost <= budget:
                chosen.append(note)
                used += cost
        while chosen:
            text = SECTION_HEADER + "".join(f"\n- {note.text}" for note in chosen)
            tokens = count(text)
            if tokens <= budget:  # per-piece rounding may differ from the whole: verify
                return MemorySection(text, tuple(chosen), tokens)
            chosen.pop()
        return None

    # -- hooks ---------------------------------------------------------------------------

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        if EXTRACTION_TAG in ctx.tags:
            return
        store = self.store_for(ctx)  # a misnamed store fails the run now, not at its end
        if not self.inject:
            return
        state = self._state(ctx)
        namespace = self.namespace_for(ctx.config)
        if namespace is None:
            state.section = None
            return
        try:
            notes = await store.notes(namespace, limit=self.scan_notes)
        except Exception as exc:
            # memory is advice: the run goes on with what was offered before
            ctx.emit(MemoryLoadFailed(namespace=namespace, error=_error_text(exc)))
            return
        section = self.render(notes)
        state.section = section
        ctx.emit(
            MemoryLoaded(
                namespace=namespace,
                notes=len(notes),
                injected=len(section.notes) if section else 0,
                tokens=section.tokens if section else 0,
            )
        )

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        if EXTRACTION_TAG in ctx.tags:
            return await call_next(request, ctx)
        state = self._state(ctx)
        configurable = ctx.config.configurable
        if VIEW_KEY in configurable:
            run = ctx.config.agent_run_id or ctx.run_id
            if state.view is None or state.view[0] != run:
                carried = {k: configurable[k] for k in VIEW_CARRIERS if k in configurable}
                state.view = (run, carried)
        section = state.section
        if section is not None:
            system = request.system_prompt
            text = f"{system}\n\n{section.text}" if system else section.text
            request = request.evolve(system_prompt=text)
        response = await call_next(request, ctx)
        usage = response.usage
        if usage is not None:
            state.counters.record_usage(usage.input_tokens + usage.output_tokens)
        return response

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        try:
            result = await call_next(call, ctx)
        except ToolError:
            # a failed call is a tool call too (the model reads its error)
            if EXTRACTION_TAG not in ctx.tags:
                self._state(ctx).counters.record_tool_calls(1)
            raise
        if EXTRACTION_TAG not in ctx.tags:
            self._state(ctx).counters.record_tool_calls(1)
        return result

    async def on_run_end(
        self, ctx: RunContext[Any], result: RunResult | None, error: BaseException | None
    ) -> None:
        if EXTRACTION_TAG in ctx.tags:
            return
        state = self._state(ctx)
        # what is unread now becomes the durable record (not at every step: see _unread)
        state.unread.snapshot(ctx.conversation)
        counters = state.counters
        if not counters.enabled or isinstance(error, Interrupted):
            return
        counters.tick_turn()
        if result is None:
            ctx.emit(MemoryExtractionSkipped(reason="run_failed", detail=_error_text(error)))
            return
        namespace = self.namespace_for(ctx.config)
        if namespace is None:
            ctx.emit(MemoryExtractionSkipped(reason="no_namespace", detail=counters.describe()))
            return
        unmet = counters.unmet()
        if unmet and not state.pending:  # pending work of an earlier session runs anyway
            ctx.emit(
                MemoryExtractionSkipped(
                    reason="thresholds", unmet=unmet, detail=counters.describe()
                )
            )
            return
        running = counters.ticket
        if running is not None:
            child = self._child(ctx, namespace)
            if child is None:
                return
            messages = ctx.conversation.messages
            state.queued = _Queued(child, messages, namespace, self.store_for(ctx))
            ctx.emit(
                MemoryExtractionQueued(
                    namespace=namespace,
                    behind=running.number,
                    messages=len(messages) - state.since(messages),
                )
            )
            return
        self._start(ctx, state, self.store_for(ctx), namespace)

    # -- extraction ----------------------------------------------------------------------

    def pending(self, ctx: RunContext[Any]) -> bool:
        """Whether an extraction of this thread is due and has not run: queued behind the
        one in progress, or cut off when its session ended (a later session of the thread
        runs it at its next run end)."""
        state = self._state(ctx)
        return state.queued is not None or state.pending

    def _child(self, ctx: RunContext[Any], namespace: str) -> RunContext[Any] | None:
        """The context an extraction of ``ctx``'s run runs under (None, reported, when
        there is no room for one, e.g. a run already at max_depth)."""
        view = self._state(ctx).view
        run = ctx.config.agent_run_id or ctx.run_id
        carried = view[1] if view is not None and view[0] == run else None
        try:
            return ctx.derive(
                tags=(EXTRACTION_TAG,), conversation=Conversation(), configurable=carried
            )
        except Exception as exc:
            ctx.emit(MemoryExtractionFailed(namespace=namespace, error=_error_text(exc)))
            return None

    def _begin(
        self,
        child: RunContext[Any],
        state: _MemoryState,
        messages: tuple[Message, ...],
        namespace: str,
    ) -> tuple[ExtractionTicket, ExtractionJob]:
        counters = state.counters
        read, fresh = state.reading(messages)
        job = ExtractionJob(read, since=len(read) - fresh, namespace=namespace)
        deltas = counters.deltas()
        ticket = counters.begin()
        state.pending = False  # in progress now; written as pending until it completes
        child.emit(
            MemoryExtractionStarted(
                namespace=namespace,
                extraction=ticket.number,
                tokens=deltas.tokens,
                tool_calls=deltas.tool_calls,
                turns=deltas.turns,
                messages=len(job.new_messages),
            )
        )
        return ticket, job

    def _start(
        self, ctx: RunContext[Any], state: _MemoryState, store: Store, namespace: str
    ) -> None:
        child = self._child(ctx, namespace)
        if child is None:
            return
        state.queued = None  # one left by an ended session: this extraction covers it
        conversation = ctx.conversation
        ticket, job = self._begin(child, state, conversation.messages, namespace)
        source = (conversation, state.unread.tap)
        try:
            ctx.spawn(
                self._extract_all,
                child,
                state,
                store,
                ticket,
                (job, source),
                name=f"{self.name}.extract",
            )
        except Exception as exc:
            state.counters.fail(ticket)
            child.emit(
                MemoryExtractionFailed(
                    namespace=namespace, extraction=ticket.number, error=_error_text(exc)
                )
            )

    async def _extract_all(
        self,
        ctx: RunContext[Any],
        state: _MemoryState,
        store: Store,
        ticket: ExtractionTicket,
        work: tuple[ExtractionJob, _Source],
    ) -> None:
        """Extract, then whatever was queued meanwhile, in this same background task (so
        leaving the session waits for the queue within its grace period). A queued
        extraction reads everything committed up to when it starts."""
        job, (conversation, _) = work
        while True:
            await self._extract(ctx, state, store, ticket, work)
            queued = state.queued
            if queued is None or not state.counters.enabled:
                return
            state.queued = None
            ctx, store = queued.ctx, queued.store
            ticket, job = self._begin(ctx, state, conversation.messages, queued.namespace)
            work = (job, (conversation, state.unread.tap))

    def _note_metadata(self, ctx: RunContext[Any]) -> dict[str, Any]:
        config = ctx.config
        meta: dict[str, Any] = {
            "source": "session_memory",
            "extractor": str(getattr(self.extractor, "name", type(self.extractor).__name__)),
            "thread_id": config.thread_id,
            "run_id": config.parent_run_id,
        }
        if config.user_id is not None:
            meta["user_id"] = config.user_id
        return meta

    async def _extract(
        self,
        ctx: RunContext[Any],
        state: _MemoryState,
        store: Store,
        ticket: ExtractionTicket,
        work: tuple[ExtractionJob, _Source],
    ) -> None:
        job, (conversation, tap) = work
        counters = state.counters
        started = time.perf_counter()
        try:
            existing = await store.notes(job.namespace, limit=self.scan_notes)
            job = attrs.evolve(job, existing=existing)
            proposed = check_bullets(await self.extractor.extract(job, ctx), self.extractor)
            fresh = dedupe_bullets(proposed, job.existing_texts)
            # once the write starts it finishes: a batch is all written or not at all, and
            # only while this session still holds its thread's lease (a worker that lost
            # the thread gets FencedOut: the new owner extracts these messages instead)
            with anyio.CancelScope(shield=True):
                written = await append_notes(
                    store,
                    job.namespace,
                    fresh,
                    metadata=self._note_metadata(ctx),
                    fence=ctx.thread_lease(store),
                )
        except BaseException as exc:
            counters.fail(ticket)
            cancelled = isinstance(exc, (RunCancelled, anyio.get_cancelled_exc_class()))
            if cancelled:
                state.pending = True  # the session ended first: the next one extracts it
            ctx.emit(
                MemoryExtractionFailed(
                    namespace=job.namespace,
                    extraction=ticket.number,
                    error=_error_text(exc),
                    cancelled=cancelled,
                    seconds=time.perf_counter() - started,
                )
            )
            if isinstance(exc, Exception):
                return  # reported above; not a BackgroundTaskFailed as well
            raise
        counters.complete(ticket)
        if tap is not None and state.unread.tap is tap:
            # read; what came meanwhile is the next one's
            state.unread.drop(len(job.new_messages))
            state.advance(conversation.messages, state.unread.in_history())
            state.unread.snapshot(conversation)
        else:  # disabled while it ran: no bookkeeping goes on
            state.advance(conversation.messages)
        ctx.emit(
            MemoryExtractionCompleted(
                namespace=job.namespace,
                extraction=ticket.number,
                notes_written=len(written),
                proposed=len(proposed),
                duplicates=len(proposed) - len(fresh),
                seqs=tuple(note.seq for note in written),
                seconds=time.perf_counter() - started,
            )
        )

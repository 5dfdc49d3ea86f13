"""Session memory's thresholds and counters, kept in the layer's state.

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
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import field, frozen

from tinyctx import (
    TinyCtxError,
)
from tinyctx.config import implements, integer, optional

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
        optional(implements(MemoryThresholds), allowed="a MemoryThresholds or None").check(
            thresholds, "thresholds", "MemoryCounters"
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

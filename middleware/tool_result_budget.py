"""Tool-result budget: cap one tool result at ``budget_bytes`` before it enters history.

:func:`budget_tool_result` is the pure function (text in, text and stats out);
:class:`ToolResultBudget` wraps it on the tool onion, and as a pressure policy applies it to
every tool result of a history (:func:`budget_history`).

A result over the budget is cut on a UTF-8 character boundary and ends with a marker that
says how many bytes were dropped and how to see the rest. The result never exceeds the
budget in UTF-8 bytes, whatever the budget: when the full marker does not fit, a short one
is used, and when even that does not fit, the marker itself is cut. ``budget_bytes=0``
disables the layer (it then does no work at all). A result exactly at the budget is
untouched. Error results are budgeted too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
from attrs import frozen

from tinyctx import Event, Layer, Message, RunContext, TextPart, ToolCall, ToolError, ToolResult
from tinyctx.chain import ToolCallHandler
from tinyctx.config import fraction, optional, text
from tinyctx.events import EventLevel
from tinyctx.frozen import FrozenDict
from tinyctx.parts import Content, Part
from tinyctx.tokens import TokenCounter, default_counter

from ._compaction import as_history, check_int, mark, protected_from, utf8_len
from ._result_cuts import (
    DEFAULT_BUDGET_BYTES,
    DEFAULT_HINT,
    TruncationStats,
    _check_keep,
    _cut_text,
    _Encodings,
    budget_tool_result,
)
from .policy import Relief

__all__ = [
    "ShrinkToolResults",
    "DEFAULT_BUDGET_BYTES",
    "DEFAULT_HINT",
    "TruncationStats",
    "HistoryBudgetStats",
    "budget_tool_result",
    "budget_history",
    "ToolResultBudget",
    "ToolResultTruncated",
]


@frozen
class HistoryBudgetStats:
    """What :func:`budget_history` did: one ``(tool_call_id, name, stats)`` per cut result."""

    truncated: tuple[tuple[str, str, TruncationStats], ...] = ()
    freed_tokens: int = 0

    @property
    def results_truncated(self) -> int:
        return len(self.truncated)

    @property
    def bytes_freed(self) -> int:
        return sum(s.original_bytes - s.final_bytes for _, _, s in self.truncated)


def _budgeted(
    result: ToolResult,
    budget_bytes: int,
    hint: str,
    keep: str = "head",
    known: _Encodings | None = None,
) -> tuple[ToolResult, TruncationStats]:
    """``result`` with its content budgeted and marked, or ``result`` itself when untouched.

    Content parts: images and documents are whole units that no byte cut may split (a cut
    base64 string is no image), so they pass as they are and in place; the text parts are
    budgeted together as one text (joined by newlines) that takes the first text part's
    place. The budget and the stats then speak of the text's bytes.
    """
    content = result.content
    if not isinstance(content, str):
        return _budgeted_parts(result, content, budget_bytes, hint, keep)
    text, stats = _cut_text(content, budget_bytes, hint, keep, known)
    if not stats.truncated:
        return result, stats
    return _marked(result, text, stats, budget_bytes), stats


def _marked(
    result: ToolResult, content: Content, stats: TruncationStats, budget_bytes: int
) -> ToolResult:
    # built frozen (ints only): mark adopts it without walking it
    truncated: FrozenDict[str, int] = FrozenDict(
        original_bytes=stats.original_bytes,
        final_bytes=stats.final_bytes,
        budget_bytes=budget_bytes,
    )
    meta = mark(result.metadata, "truncated", truncated)
    return attrs.evolve(result, content=content, metadata=meta)


def _budgeted_parts(
    result: ToolResult, parts: tuple[Part, ...], budget_bytes: int, hint: str, keep: str
) -> tuple[ToolResult, TruncationStats]:
    text, stats = _cut_text(result.text, budget_bytes, hint, keep)
    if not stats.truncated:
        return result, stats
    out: list[Part] = []
    placed = False
    for part in parts:
        if not isinstance(part, TextPart):
            out.append(part)
        elif not placed:
            placed = True
            if text:
                out.append(TextPart(text))
    return _marked(result, tuple(out) if out else "", stats, budget_bytes), stats


def budget_history(
    history: Sequence[Message],
    budget_bytes: int,
    *,
    hint: str = DEFAULT_HINT,
    counter: TokenCounter | None = None,
    keep: str = "head",
) -> tuple[tuple[Message, ...], HistoryBudgetStats]:
    """Every tool result of ``history`` budgeted; the same tuple back when nothing changed.

    Messages are replaced one for one, so every ``tool_call_id`` and the pairing survive.
    With a ``counter``, a cut that would not lower that result's token estimate is skipped
    (a marker can cost more tokens than a little dense text), so the history never grows.
    """
    history = as_history(history)
    check_int(budget_bytes, "budget_bytes", "budget_history")
    _check_keep(keep, "budget_history")
    return _budget_results(history, budget_bytes, hint, counter, keep, None)


def _budget_results(
    history: tuple[Message, ...],
    budget_bytes: int,
    hint: str,
    counter: TokenCounter | None,
    keep: str,
    known: _Encodings | None,
) -> tuple[tuple[Message, ...], HistoryBudgetStats]:
    """:func:`budget_history` of settings already checked (``known``: see :func:`_cut_text`)."""
    if budget_bytes == 0:
        return history, HistoryBudgetStats()
    out: list[Message] | None = None
    cut: list[tuple[str, str, TruncationStats]] = []
    freed_tokens = 0
    for index, message in enumerate(history):
        if not isinstance(message, ToolResult):
            continue
        new, stats = _budgeted(message, budget_bytes, hint, keep, known)
        if new is message:
            continue
        if counter is not None:
            saved = counter.count_message(message) - counter.count_message(new)
            if saved <= 0:
                continue
            freed_tokens += saved
        if out is None:
            out = list(history)
        out[index] = new
        cut.append((message.tool_call_id, message.name, stats))
    if out is None:
        return history, HistoryBudgetStats()
    return tuple(out), HistoryBudgetStats(tuple(cut), freed_tokens)


@frozen
class ToolResultTruncated(Event):
    """A tool result was cut to the budget (``where``: "tool" as it arrived, "history")."""

    kind: ClassVar[str] = "compaction.tool_result_budget"
    level: ClassVar[EventLevel] = "info"
    tool: str = ""
    tool_call_id: str = ""
    original_bytes: int = 0
    final_bytes: int = 0
    budget_bytes: int = 0
    where: str = "tool"
    # the heuristic tokens the cut saved, when cut as it arrived (a guard's cut reports its
    # own total): a later relief may remove the result, so a replay cannot always recount it
    freed_tokens: int | None = None

    def describe(self) -> str | None:
        if self.where != "tool":
            return None  # cut as a guard policy: the guard's own event reports it
        return f"{self.tool} result cut to {self.final_bytes}B"


def _fraction(value: object, field: str) -> float | None:
    """None, or a number in (0, 1] as a float; anything else a ConfigError naming ``field``."""
    checked = _FRACTION.check(value, field, "ToolResultBudget")
    return None if checked is None else float(checked)


_FRACTION = optional(fraction(), allowed="None or a number in (0, 1]")


def _share(fraction: float | None, usable: int) -> int:
    """``fraction`` of ``usable`` tokens (the whole of it for None)."""
    return usable if fraction is None else int(fraction * usable)


class ToolResultBudget(Layer):
    """Caps every tool result at ``budget_bytes`` (default 16384; 0 disables) on the tool onion.

    ``window_fraction`` (default None: off) caps a result further, to that fraction of the
    run's usable window (``RunConfig.usable_tokens``) in tokens of the heuristic counter,
    so that at a small window one result cannot take a large share of it (with a 32K
    window and 0.1, about 8 KiB; a 128K window leaves the 16 KiB budget in charge). Results
    are cut as they enter the history, so this never breaks a cached prompt prefix.

    ``keep`` says what a cut keeps: ``"head"`` (default) the start, ``"middle"`` the start
    and the end around a marker (see :func:`budget_tool_result`).

    ``room`` (default None: off) keeps what the window can afford while there is no
    pressure: a result over ``budget_bytes`` but within ``window_fraction`` of the usable
    window enters whole while the conversation with it stays under ``room`` of the usable
    window (with 0.8 and a 128K window, a 40 KB file read early in a run is not cut).
    ``room_fraction`` (default: ``window_fraction``) is the share of the usable window one
    result may take whole while there is such room; a result over ``window_fraction``
    enters whole only while the conversation with it and one more like it stays under
    ``room`` (a large read leaves the window room to read another), else it is cut to
    ``window_fraction``.

    As a pressure policy (``relieve``) it budgets every tool result already in the history.
    """

    def __init__(
        self,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        *,
        hint: str = DEFAULT_HINT,
        window_fraction: float | None = None,
        keep: str = "head",
        room: float | None = None,
        room_fraction: float | None = None,
        name: str | None = None,
    ) -> None:
        self.budget_bytes = check_int(budget_bytes, "budget_bytes", "ToolResultBudget")
        self.keep = _check_keep(keep, "ToolResultBudget")
        self.hint = text(empty=True, allowed="a string (may be empty)").check(
            hint, "hint", "ToolResultBudget"
        )
        self.window_fraction = _fraction(window_fraction, "window_fraction")
        self.room = _fraction(room, "room")
        self.room_fraction = _fraction(room_fraction, "room_fraction")
        if name is not None:
            self.name = name

    def budget_for(self, result: ToolResult, ctx: RunContext[Any]) -> int:
        """The byte budget of ``result`` in ``ctx``: ``budget_bytes``, lowered to
        ``window_fraction`` of the usable window when that is known (0: no budget); with
        ``room``, the result's whole size while it is within ``room_fraction`` (default
        ``window_fraction``) and the conversation with it (with it twice, when it is over
        ``window_fraction``) stays under ``room`` of the usable window."""
        budget = self.budget_bytes
        usable = ctx.config.usable_tokens
        if budget == 0 or not usable or (self.window_fraction is None and self.room is None):
            return budget
        counter = default_counter()
        tokens = counter.count_text(result.text)
        limit = max(1, _share(self.window_fraction, usable))
        whole = max(1, _share(self.room_fraction or self.window_fraction, usable))
        if self.room is not None and tokens <= whole:
            # over the cap, it must leave room for one more like it under the mark
            after = tokens if tokens <= limit else 2 * tokens
            if counter.count_messages(ctx.conversation.messages) + after <= self.room * usable:
                return max(budget, utf8_len(result.text))  # the window can afford it whole
        if tokens <= limit:
            return budget
        size = utf8_len(result.text)
        return max(1, min(budget, size * limit // tokens))

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        try:
            result = await call_next(call, ctx)
        except ToolError as failure:
            # the failure stays an exception for the layers outside; its text is budgeted
            if self.budget_bytes == 0:
                raise
            probe = ToolResult.for_call(call, failure.content, is_error=True)
            budgeted = self._budget(call, probe, ctx)
            if budgeted is probe:
                raise
            raise failure.with_content(budgeted.text) from failure.error
        if self.budget_bytes == 0:
            return result
        return self._budget(call, result, ctx)

    def _budget(self, call: ToolCall, result: ToolResult, ctx: RunContext[Any]) -> ToolResult:
        budget = self.budget_for(result, ctx)
        new, stats = _budgeted(result, budget, self.hint, self.keep)
        if new is not result:
            counter = default_counter()
            ctx.emit(
                ToolResultTruncated(
                    tool=result.name or call.name,
                    tool_call_id=result.tool_call_id,
                    original_bytes=stats.original_bytes,
                    final_bytes=stats.final_bytes,
                    budget_bytes=budget,
                    freed_tokens=counter.count_message(result) - counter.count_message(new),
                )
            )
        return new

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        """Budget every tool result already in ``messages`` (nothing when disabled)."""
        new, stats = budget_history(
            messages, self.budget_bytes, hint=self.hint, counter=counter, keep=self.keep
        )
        for tool_call_id, tool, cut in stats.truncated:
            ctx.emit(
                ToolResultTruncated(
                    tool=tool,
                    tool_call_id=tool_call_id,
                    original_bytes=cut.original_bytes,
                    final_bytes=cut.final_bytes,
                    budget_bytes=self.budget_bytes,
                    where="history",
                )
            )
        return Relief(
            new,
            stats.freed_tokens,
            {
                "results_truncated": stats.results_truncated,
                "bytes_freed": stats.bytes_freed,
                "freed_tokens": stats.freed_tokens,
            },
        )


def _was_cut(result: ToolResult) -> bool:
    """Whether a budget already cut ``result`` (its ``metadata["tinyctx"]["truncated"]``)."""
    marks = result.metadata.get("tinyctx")
    return isinstance(marks, Mapping) and "truncated" in marks


class ShrinkToolResults:
    """Last-resort pressure policy: cut every tool result, the newest turn's too, to the
    largest per-result byte budget that frees what the guard still needs.

    A guard's other policies protect the newest tool turn (microcompaction keeps it, a trim
    cannot split it); when that turn alone is bigger than the window, this is what keeps
    the run going. It never removes a message (every call keeps its result), never cuts a
    result below ``floor_bytes``, and never makes one cost more tokens than before.

    When the results after the newest one already cut (by an earlier relief or the tool
    budget) free enough alone, only they are cut: the history up to it is a prefix the
    provider has cached, and re-cutting it to a new common size would rewrite it all.

    ``keep_recent=N`` (default 0: every result may be cut) leaves the results of the newest
    ``N`` tool-call turns whole. Placed before microcompaction, it makes a relief shrink the
    older results to their heads before clearing any whole (``default_stack``, issue #38).
    """

    role = "shrink"  # sorts after drop/compact/summarize/trim in a guard's order
    breaker_group: str | None = None

    def __init__(
        self,
        floor_bytes: int = 1024,
        *,
        hint: str = DEFAULT_HINT,
        keep_recent: int = 0,
        name: str = "ShrinkToolResults",
    ) -> None:
        self.floor_bytes = check_int(floor_bytes, "floor_bytes", "ShrinkToolResults", minimum=1)
        self.keep_recent = check_int(keep_recent, "keep_recent", "ShrinkToolResults")
        self.hint = hint
        self.name = name

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        cutoff = protected_from(messages, self.keep_recent)
        if not cutoff:  # fewer tool-call turns than it keeps whole, or none before them
            return Relief(messages)
        if cutoff == len(messages):
            return self._shrink(messages, ctx, counter, need)
        older = self._shrink(messages[:cutoff], ctx, counter, need)
        if not older.detail:  # nothing to cut there
            return Relief(messages)
        return Relief(older.messages + messages[cutoff:], older.freed_tokens, older.detail)

    def _shrink(
        self, messages: tuple[Message, ...], ctx: RunContext[Any], counter: TokenCounter, need: int
    ) -> Relief:
        """The results after the newest one already cut, when cutting those alone frees
        ``need`` (the history up to it is what an earlier relief or the tool budget wrote,
        a prefix the provider has cached), else every tool result of ``messages``, cut to
        the largest budget that frees ``need``."""
        last = max(
            (i for i, m in enumerate(messages) if isinstance(m, ToolResult) and _was_cut(m)),
            default=-1,
        )
        if 0 <= last < len(messages) - 1 and need > 0:
            tail = self._plan(messages[last + 1 :], counter, need)
            if tail is not None and tail[1].freed_tokens >= need:
                return self._cut(messages[: last + 1] + tail[0], tail[1], tail[2], ctx)
        best = self._plan(messages, counter, need)
        if best is None:
            return Relief(messages)
        return self._cut(*best, ctx)

    def _plan(
        self, messages: tuple[Message, ...], counter: TokenCounter, need: int
    ) -> tuple[tuple[Message, ...], HistoryBudgetStats, int] | None:
        """Every tool result of ``messages`` cut to the largest budget that frees ``need``
        (all it can at the floor when none does); None when there is nothing to cut."""
        sizes = [utf8_len(m.text) for m in messages if isinstance(m, ToolResult)]
        largest = max(sizes, default=0)
        if need <= 0 or largest <= self.floor_bytes:
            return None
        # the largest budget that frees enough: freed tokens only grow as the budget shrinks
        low, high = self.floor_bytes, largest - 1
        best: tuple[tuple[Message, ...], HistoryBudgetStats, int] | None = None
        known: _Encodings = {}  # each result encoded once for the whole search
        while low <= high:
            budget = (low + high) // 2
            new, stats = _budget_results(messages, budget, self.hint, counter, "head", known)
            if stats.freed_tokens >= need:
                best, low = (new, stats, budget), budget + 1
            else:
                high = budget - 1
        if best is None:  # even the floor does not free enough: free all it can
            floor = self.floor_bytes
            new, stats = _budget_results(messages, floor, self.hint, counter, "head", known)
            best = (new, stats, self.floor_bytes)
        return best

    def _cut(
        self,
        new: tuple[Message, ...],
        stats: HistoryBudgetStats,
        budget: int,
        ctx: RunContext[Any],
    ) -> Relief:
        """Report the cuts of a planned relief (one event per result) and return it."""
        for tool_call_id, tool, cut in stats.truncated:
            ctx.emit(
                ToolResultTruncated,
                tool=tool,
                tool_call_id=tool_call_id,
                original_bytes=cut.original_bytes,
                final_bytes=cut.final_bytes,
                budget_bytes=budget,
                where="pressure",
            )
        return Relief(
            new,
            stats.freed_tokens,
            {
                "budget_bytes": budget,
                "results_truncated": stats.results_truncated,
                "bytes_freed": stats.bytes_freed,
            },
        )

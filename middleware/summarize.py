"""Summarization: replace the older part of a history with one summary message.

:func:`summarize_history` is the function (history in, new history and stats out) that the
:class:`Summarize` layer wraps and the budget guard reuses as a pressure policy. The text
comes from a :class:`Summarizer`: :class:`ModelSummarizer` asks a model through the same
``call_model`` signature, :class:`ExtractiveSummarizer` works offline and deterministically.

The newest ``keep_recent`` messages stay verbatim. The split moves back (the kept tail
grows) until no tool call is separated from its results, so calls still waiting for their
results are never summarized. Leading system messages stay in front, and system messages
inside the summarized part are kept too (a summary never drops a system message). The
summarized messages become one user message, marked ``metadata["tinyctx"]["summary"]``,
whose text starts ``[auto-compacted] Summary of N earlier messages:``. An empty or failing
summary raises :class:`SummarizationError` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tinyctx import (
    ConfigError,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    PairingError,
    RunContext,
    SystemMessage,
)
from tinyctx.config import fraction, implements, optional
from tinyctx.messages import check_pairing
from tinyctx.reexport import publish
from tinyctx.tokens import Calibration, TokenCounter, default_counter

from . import _summarizers, _summary_events, _summary_history
from ._compaction import (
    check_bool,
    check_counter,
    check_int,
    commit,
)
from ._summarizers import (
    ExtractiveSummarizer,
    ModelSummarizer,
)
from ._summary_events import SummaryApplied, SummaryFailed
from ._summary_history import (
    DEFAULT_SUMMARY_PROMPT,
    REFERENCE_KINDS,
    REFERENCES_HEADING,
    SUMMARY_PREFIX,
    SummarizationError,
    Summarizer,
    SummaryStats,
    _may_be_task,
    _stack,
    _system_lead,
    digest_end,
    is_summary,
    render_transcript,
    summarize_history,
    summary_references,
    summary_split,
)
from .policy import Relief
from .triggers import Keep, Trigger, fits_after
from .triggers import keep as as_keep
from .triggers import trigger as as_trigger

publish(__name__, _summarizers, _summary_events, _summary_history)

__all__ = [
    "SUMMARY_PREFIX",
    "REFERENCES_HEADING",
    "REFERENCE_KINDS",
    "DEFAULT_SUMMARY_PROMPT",
    "Summarizer",
    "SummarizationError",
    "SummaryStats",
    "summary_split",
    "summarize_history",
    "summary_references",
    "is_summary",
    "digest_end",
    "render_transcript",
    "ModelSummarizer",
    "ExtractiveSummarizer",
    "Summarize",
    "SummaryApplied",
    "SummaryFailed",
]


class _Breaker:
    """Consecutive failures of the layer in one thread, and the trigger's calibration by
    the usage the provider reported (durable per-thread state)."""

    __slots__ = ("calibration", "failures")

    def __init__(self) -> None:
        self.failures = 0
        self.calibration = Calibration()

    def to_json(self) -> dict[str, Any]:
        if not self.calibration.observations:  # nothing reported yet: nothing to keep
            return {"failures": self.failures}
        return {"failures": self.failures, "calibration": self.calibration.to_json()}

    @classmethod
    def from_json(cls, data: Any) -> _Breaker:
        failures = data.get("failures") if isinstance(data, dict) else None
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
            raise ValueError(f"failures must be an integer >= 0, got {failures!r}")
        breaker = cls()
        breaker.failures = failures
        calibration = data.get("calibration")
        if calibration is not None:  # state written before the trigger calibrated has none
            if not isinstance(calibration, dict):
                raise ValueError(f"calibration must be an object, got {calibration!r}")
            breaker.calibration.load_json(calibration)
        return breaker


def _remap(
    before: tuple[Message, ...], summary: Message
) -> Callable[[tuple[Message, ...]], tuple[tuple[Message, ...], bool] | None]:
    """Replace, in the conversation, the block of summarized messages by the summary.

    The summarized messages must sit there as one block (system messages aside, which are
    kept); otherwise, or if the result would break pairing, nothing maps back.
    """
    gone = {id(m) for m in before if not isinstance(m, SystemMessage)} - {id(summary)}

    def remap(current: tuple[Message, ...]) -> tuple[tuple[Message, ...], bool] | None:
        positions = [i for i, m in enumerate(current) if id(m) in gone]
        if not positions:
            return None
        start, end = positions[0], positions[-1] + 1
        block = current[start:end]
        if len(positions) != sum(1 for m in block if not isinstance(m, SystemMessage)):
            return None
        kept = tuple(m for m in block if isinstance(m, SystemMessage))
        updated = (*current[:start], *kept, summary, *current[end:])
        try:
            check_pairing(updated)
        except PairingError:
            return None
        return updated, True

    return remap


_REFERENCES = optional(fraction(), allowed="None or a number in (0, 1]")


def _tail_within(messages: tuple[Message, ...], budget: int, counter: TokenCounter) -> int:
    """How many of the newest messages fit in ``budget`` tokens (at least one)."""
    count = counter.count_message
    total = kept = 0
    for message in reversed(messages):
        total += count(message)
        if total > budget and kept:
            break
        kept += 1
    return kept


class Summarize(Layer):
    """Summarizes the older history once a request's estimate reaches ``trigger_tokens``.

    ``trigger_tokens=None`` (the default) summarizes only a request that would not fit the
    run's usable window (``RunConfig.max_tokens`` minus reserved output; an error when the
    window is unknown): a summary rewrites the cached prompt prefix, so on a conversation
    that fits the layer never costs more than no management. ``trigger`` says when in
    any of the ways of :mod:`tinyctx.middleware.triggers` instead: tokens, a fraction of the
    window, a message count, AND (a mapping) and OR (a list) of them — LangChain's spellings
    such as ``[("fraction", 0.8), ("messages", 200)]`` work as they are. ``keep`` says how much
    of the newest history stays verbatim: ``("messages", 20)``, ``("tokens", 4000)`` (the
    newest messages that fit, at least one, grown back so no tool call loses its result) or
    ``("fraction", 0.3)`` of the usable window; the default is ``keep_recent`` messages.
    ``persist=True`` (the default) commits the summary to the conversation, so later calls start
    from it and the summary is paid for once; ``persist=False`` rewrites only this call's request.
    With the window known, a summary that could not make the request fit (the kept tail and lead
    alone overflow) is held back, with no summarizer call: the call overflows either way, and a
    later call summarizes once the tail that does not fit has aged into the head, in one rewrite. A
    failed summary is reported (``SummaryFailed``) and the call goes on with the history as it was;
    a summary that would not make the history smaller counts as a failed one (refused); after
    ``max_failures`` consecutive failures the layer stops trying for the thread (0: never stops; the
    count is durable thread state, so a later session of a thread with a store continues it), and a
    success resets the count. As a pressure policy (``relieve``) it summarizes the least of the head
    that frees what the guard needs (the kept tail is the newest messages that fit once the summary
    is in), whatever the trigger says, reports failure in ``Relief.detail["failed"]``, and leaves
    the history as it was when the summary would not make it smaller.

    ``keep_task=True`` keeps the first user message (the task, when it is at most an eighth
    of the history it fires on, or as a guard's policy of the usable window) verbatim in
    front of the summary. ``keep_summaries=N`` stacks summaries
    instead of folding them: the earlier summaries at the front of the history (after the
    system messages and the kept task) stay verbatim while there are at most ``N`` of them,
    and only what follows them is summarized, into a new summary placed after them; so the
    provider's cached prefix survives through the last summary and each summary rewrites
    less. When there are more than ``N``, the next summary folds them all into one (a single
    bigger rewrite), so at most ``N + 1`` summaries ever stand in front. ``0`` (the default)
    folds every time: each summary replaces the previous one.

    Args:
        summarizer: Writes the summary (:class:`ModelSummarizer`,
            :class:`ExtractiveSummarizer` or any :class:`Summarizer`).
        trigger_tokens: The estimate that fires the layer; None: only a request that
            would not fit the usable window.
        keep_recent: Messages kept verbatim when ``keep`` is not given.
        persist: Commit the summary to the conversation (True) or rewrite only this
            call's request.
        counter: The token counter; default :func:`~tinyctx.tokens.default_counter`.
        trigger: When to fire, in any spelling of :mod:`tinyctx.middleware.triggers`
            (instead of ``trigger_tokens``).
        keep: How much of the newest history stays verbatim: ``("messages", n)``,
            ``("tokens", n)`` or ``("fraction", f)``.
        max_failures: Consecutive failures after which the layer stops trying for the
            thread (0: never stops).
        keep_task: Keep the first user message verbatim in front of the summary.
        keep_summaries: Earlier summaries stacked verbatim before they are folded.
        references: The share of the summary's budget (the summarizer's ``max_tokens``,
            else 1024) a references section may take: the paths, identifiers, numbers and
            hex strings of the summarized messages that the summary and the kept messages
            lack, verbatim, newest first (None: no section).
        name: The key of the layer's state; default the class name.
    """

    role = "summarize"  # its place in a BudgetGuard's policy order
    breaker_group: str | None = "summarize"  # a guard's circuit breaker counts its failures

    def __init__(
        self,
        summarizer: Summarizer,
        trigger_tokens: int | None = None,
        keep_recent: int = 10,
        persist: bool = True,
        counter: TokenCounter | None = None,
        *,
        trigger: Any = None,
        keep: Any = None,
        max_failures: int = 3,
        keep_task: bool = False,
        keep_summaries: int = 0,
        references: float | None = None,
        name: str | None = None,
    ) -> None:
        owner = type(self).__name__
        self.summarizer = implements(
            Summarizer, allowed="an object with async summarize(messages, ctx) -> str"
        ).check(summarizer, "summarizer", owner)
        self.trigger_tokens = (
            None
            if trigger_tokens is None
            else check_int(trigger_tokens, "trigger_tokens", owner, minimum=1)
        )
        if trigger is not None and trigger_tokens is not None:
            raise ConfigError(
                "trigger_tokens",
                trigger_tokens,
                "None when trigger is given (trigger_tokens=N is trigger=N)",
                owner=owner,
            )
        self.trigger: Trigger | None = None if trigger is None else as_trigger(trigger, owner=owner)
        self.keep_recent = check_int(keep_recent, "keep_recent", owner)
        if keep is not None and keep_recent != 10:
            raise ConfigError(
                "keep_recent", keep_recent, "10 (the default) when keep is given", owner=owner
            )
        self.keep: Keep = as_keep(keep_recent if keep is None else keep, owner=owner)
        if self.keep.kind == "messages":
            self.keep_recent = int(self.keep.value)
        self.persist = check_bool(persist, "persist", owner)
        self.counter = check_counter(counter, owner)
        self.max_failures = check_int(max_failures, "max_failures", owner)
        self.keep_task = check_bool(keep_task, "keep_task", owner)
        self.keep_summaries = check_int(keep_summaries, "keep_summaries", owner)
        self.references = _REFERENCES.check(references, "references", owner)
        if name is not None:
            self.name = name

    def fires(self, request: ModelRequest, ctx: RunContext[Any], counter: TokenCounter) -> bool:
        """Whether this request reaches the trigger (``trigger``, else ``trigger_tokens``,
        else one token over the usable window), by :meth:`calibrated_count`."""
        tokens = self.calibrated_count(request, ctx, counter)
        if self.trigger is not None:
            return self.trigger.fires(
                tokens, len(request.messages), ctx.config.usable_tokens, type(self).__name__
            )
        return tokens >= self.trigger_for(ctx)

    def calibrated_count(
        self, request: ModelRequest, ctx: RunContext[Any], counter: TokenCounter
    ) -> int:
        """The request's tokens as the trigger reads them: the usage the provider reported
        for the thread's last call plus the estimate of what was added since, as the budget
        guard calibrates (:class:`~tinyctx.tokens.Calibration`); the estimate scaled by the
        last report once the history was rewritten; the estimate before any report."""
        calibration = ctx.thread_state(self, _Breaker).calibration
        return calibration.estimate(counter.count_request(request), request.messages)

    async def _send(
        self,
        request: ModelRequest,
        ctx: RunContext[Any],
        call_next: ModelCall,
        counter: TokenCounter,
    ) -> ModelResponse:
        """Call on, and learn from the usage the provider reports for what was sent."""
        response = await call_next(request, ctx)
        usage = response.usage
        if usage is not None and usage.input_tokens > 0:
            raw = counter.count_request(request)
            calibration = ctx.thread_state(self, _Breaker).calibration
            calibration.observe(raw, usage.input_tokens, request.messages)
        return response

    def keep_for(
        self, messages: tuple[Message, ...], ctx: RunContext[Any], counter: TokenCounter
    ) -> int:
        """How many of the newest messages stay verbatim: ``keep`` in messages, or as many
        newest messages as fit its token budget (at least one)."""
        budget = self.keep.tail_tokens(ctx.config.usable_tokens, type(self).__name__)
        if budget is None:
            return self.keep_recent
        return _tail_within(messages, budget, counter)

    def _keep_for_need(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        need: int,
        kept_head: int,
    ) -> int:
        """As a guard's policy: keep the newest messages that leave the history ``need``
        tokens smaller once the summary (``max_tokens`` of the summarizer, else 1024, and its
        heading) is in, besides the ``kept_head`` leading messages; at least one message.
        ``need <= 0``: the layer's own ``keep``."""
        if need <= 0:
            return self.keep_for(messages, ctx, counter)
        allowance = self._allowance() + self.reference_tokens()
        allowance += counter.count_text(SUMMARY_PREFIX) + 8  # the heading and its count
        head = counter.count_messages(messages[:kept_head])
        room = counter.count_messages(messages) - need - allowance - head
        return _tail_within(messages, room, counter)

    def _allowance(self) -> int:
        """The summary's budget: the summarizer's ``max_tokens``, else 1024."""
        allowance = getattr(self.summarizer, "max_tokens", None)
        if not isinstance(allowance, int) or isinstance(allowance, bool) or allowance <= 0:
            return 1024
        return allowance

    def reference_tokens(self) -> int:
        """The most tokens the references section of a summary takes (0: none)."""
        return 0 if self.references is None else int(self.references * self._allowance())

    def _pins_task(
        self, messages: tuple[Message, ...], counter: TokenCounter, room: int | None = None
    ) -> bool:
        """Whether the first user message stays in front of the summary (see
        :meth:`_keeps_task`)."""
        return self._keeps_task(messages, counter, room) > _system_lead(messages)

    def _keeps_task(
        self, messages: tuple[Message, ...], counter: TokenCounter, room: int | None = None
    ) -> int:
        """How many leading messages stay in front of the summary: the system messages,
        and with ``keep_task`` the first user message when it is at most an eighth of
        ``room`` (a long one is summarized like the rest) or was kept in front of an
        earlier summary (it stays there, and so does the cached prefix up to it).

        ``room`` is the history, where the layer fires on its own trigger: a task kept
        there never leaves the history near a low trigger after the summary. A guard's
        relief passes the usable window: the guard's earlier policies (microcompaction)
        shrink the history first, and a task measured against what is left of it was
        summarized alone, which rewrote the prompt from the task on, where keeping it
        leaves the system prompt and the task a cached prefix that survives every later
        relief."""
        lead = _system_lead(messages)
        if not self.keep_task or lead >= len(messages):
            return lead
        first = messages[lead]
        if not _may_be_task(first):
            return lead
        kept_before = lead + 1 < len(messages) and is_summary(messages[lead + 1])
        if room is None:
            room = counter.count_messages(messages)
        if not kept_before and counter.count_message(first) * 8 > room:
            return lead
        return lead + 1

    def _stack_for_need(
        self, messages: tuple[Message, ...], counter: TokenCounter, need: int, room: int | None
    ) -> tuple[int, int]:
        """As a guard's policy: ``(keep_summaries, kept_head)`` for this relief. The earlier
        summaries stay in front (``keep_summaries``, when there are at most that many) only
        while they take at most half of what the relief leaves (the history less ``need``);
        else this summary folds them all in (``0``), so they never crowd out the recent
        tail. ``kept_head`` counts the leading messages left in front of the summary."""
        lead = self._keeps_task(messages, counter, room)
        stacked = _stack(messages, lead, self.keep_summaries)[0]
        if stacked == lead:
            return self.keep_summaries, lead
        left = counter.count_messages(messages) - max(need, 0)
        if counter.count_messages(messages[lead:stacked]) * 2 > left:
            return 0, lead
        return self.keep_summaries, stacked

    def trigger_for(self, ctx: RunContext[Any]) -> int:
        """The token estimate at which this layer summarizes, for ``ctx``'s window
        (``trigger_tokens``, else one token over the usable window: a request that would
        not fit)."""
        if self.trigger_tokens is not None:
            return self.trigger_tokens
        usable = ctx.config.usable_tokens
        if usable is None:
            raise ConfigError(
                "trigger_tokens",
                None,
                "an integer >= 1, or None only when RunConfig.max_tokens is set",
                owner=type(self).__name__,
            )
        return usable + 1

    def _can_fit(
        self,
        request: ModelRequest,
        ctx: RunContext[Any],
        counter: TokenCounter,
        keep_recent: int,
        keep_task: bool,
    ) -> bool:
        """Whether a summary with this split can make the request fit the usable window:
        the request's estimate less the head the summary replaces (the summary itself
        counted as nothing) fits, or the window is unknown. When even that overflows, the
        summary is held back (:func:`~tinyctx.middleware.triggers.fits_after`): no
        summarizer call and no broken prefix for a call that overflows either way; a later
        call, once the tail that does not fit has aged into the head, summarizes in one
        rewrite."""
        usable = ctx.config.usable_tokens
        if usable is None:
            return True
        messages = request.messages
        plan = summary_split(
            messages, keep_recent, keep_task=keep_task, keep_summaries=self.keep_summaries
        )
        if plan is None:
            return True  # nothing to summarize: summarize_history says so
        lead, split = plan
        gone = counter.count_messages(
            tuple(m for m in messages[lead:split] if not isinstance(m, SystemMessage))
        )
        return fits_after(counter.count_request(request) - gone, usable)

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        if self.trigger is None:
            self.trigger_for(ctx)  # an unknown window is an error on every call, not just some
        breaker = ctx.thread_state(self, _Breaker)
        counter = self.counter or default_counter(request.model or ctx.config.model)
        if self.max_failures and breaker.failures >= self.max_failures:
            return await self._send(request, ctx, call_next, counter)
        if not self.fires(request, ctx, counter):
            return await self._send(request, ctx, call_next, counter)
        messages = request.messages
        keep_recent = self.keep_for(messages, ctx, counter)
        keep_task = self._pins_task(messages, counter)
        if not self._can_fit(request, ctx, counter, keep_recent, keep_task):
            return await self._send(request, ctx, call_next, counter)
        try:
            new, stats = await summarize_history(
                messages,
                self.summarizer,
                ctx,
                keep_recent,
                counter=counter,
                keep_task=keep_task,
                keep_summaries=self.keep_summaries,
                references=self.reference_tokens(),
            )
            if stats.changed and stats.freed_tokens <= 0:
                raise SummarizationError(
                    f"the summary of {stats.summarized} messages would not shrink the history "
                    f"({stats.tokens_before} tokens before, {stats.tokens_after} after); refused"
                )
        except SummarizationError as exc:
            breaker.failures += 1
            ctx.emit(
                SummaryFailed(
                    error=str(exc),
                    consecutive_failures=breaker.failures,
                    disabled=bool(self.max_failures) and breaker.failures >= self.max_failures,
                )
            )
            return await self._send(request, ctx, call_next, counter)
        breaker.failures = 0
        if not stats.changed:
            return await self._send(request, ctx, call_next, counter)
        persisted = False
        if self.persist:
            summary = new[len(new) - (len(messages) - stats.split) - 1]
            replaced = messages[stats.lead : stats.split]
            persisted, new = commit(ctx, messages, new, _remap(replaced, summary))
            if persisted:
                ctx.conversation.add_message_event(summary)
        ctx.emit(SummaryApplied.of(stats, self.summarizer, persisted=persisted))
        return await self._send(request.evolve(messages=new), ctx, call_next, counter)

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        keep_summaries, head = self._stack_for_need(
            messages, counter, need, ctx.config.usable_tokens
        )
        try:
            new, stats = await summarize_history(
                messages,
                self.summarizer,
                ctx,
                self._keep_for_need(messages, ctx, counter, need, head),
                counter=counter,
                keep_task=self._pins_task(messages, counter, ctx.config.usable_tokens),
                forward=need > 0,
                keep_summaries=keep_summaries,
                references=self.reference_tokens(),
            )
        except SummarizationError as exc:
            ctx.emit(SummaryFailed(error=str(exc), source="policy"))
            return Relief(messages, 0, {"failed": True, "error": str(exc)}, error=str(exc))
        detail = {
            "failed": False,
            "summarized": stats.summarized,
            "kept": stats.kept,
            "tokens_before": stats.tokens_before,
            "tokens_after": stats.tokens_after,
        }
        if not stats.changed or stats.freed_tokens <= 0:
            return Relief(messages, 0, {**detail, "applied": False})
        ctx.emit(SummaryApplied.of(stats, self.summarizer, source="policy"))
        return Relief(new, stats.freed_tokens, {**detail, "applied": True})

"""Named stacks and TOML-friendly layer factories, registered as entry points.

The ``tinyctx`` command finds stacks (``tinyctx.stacks``) and layers (``tinyctx.layers``) by
name through entry points, so the kernel never imports a concrete layer and an application
can register its own layers for ``--stack FILE`` the same way (see pyproject.toml).

A stack factory takes ``counter=`` (the token counter the command uses) and returns the
layer list. A layer factory takes plain TOML values as keyword arguments.
"""

from __future__ import annotations

from typing import Any

from tinyctx.chain import LayerLike
from tinyctx.config import one_of
from tinyctx.tokens import TokenCounter

from .budget import BudgetGuard, OrderSpec, default_policies, policy_role
from .policy import PressurePolicy
from .summarize import ExtractiveSummarizer, Summarize
from .tool_result_budget import ShrinkToolResults, ToolResultBudget
from .trim import TrimOldest

__all__ = [
    "default_stack",
    "seed_order_stack",
    "summarize",
    "SUMMARIZERS",
    "DEFAULT_LOW_WATER",
    "DEFAULT_TRIGGER",
    "DEFAULT_RESULT_SHARE",
    "DEFAULT_KEEP_SUMMARIES",
    "DEFAULT_RELIEF_RUN",
    "DEFAULT_ORDER",
    "DEFAULT_RESULT_BYTES",
    "DEFAULT_RESULT_KEEP",
    "DEFAULT_RESULT_ROOM",
    "DEFAULT_RESULT_ROOM_SHARE",
    "DEFAULT_SHRINK_KEEP_RECENT",
    "DEFAULT_SUMMARY_REFERENCES",
]

SUMMARIZERS = ("extractive",)


DEFAULT_LOW_WATER = 0.3
"""default_stack's low-water mark: a relief goes down to 30% of the usable window, so the
calls after it grow the cached prefix for a while (see docs/budget-and-compaction.md).
(0.4 before issue #38: with the order and cap below, 0.3 forgets less and costs less.)"""

SEED_LOW_WATER = 0.4
"""seed_order_stack's low-water mark."""

DEFAULT_ORDER = ("drop", "images", "compact", "summarize", "trim")
"""default_stack's policy order: drop non-essential context, clear old images, shrink the
older tool results to excerpts (:data:`DEFAULT_SHRINK_KEEP_RECENT`), microcompact, then
summarize the head, and trim the oldest turns when that is not enough (the guard's own
order). With the excerpts first, trimming before summarizing (main's order for a while in
issue #38) lost about as many uses on the shared transcripts (7.2% against 7.3% at 32K) but
cost more at a high low-water mark: a trim rewrites the prompt from the task on, where
stacked summaries keep a cached prefix, and it lifted the 32K cost curve above LangChain's
on astroid and sqlfluff (``benchmarks/bench_cost.py``, issue #20)."""

DEFAULT_RESULT_BYTES = 16384
"""default_stack's byte cap on one tool result (with :data:`DEFAULT_RESULT_SHARE`), lifted
while the window has room (:data:`DEFAULT_RESULT_ROOM`)."""

DEFAULT_RESULT_ROOM = 0.8
"""default_stack keeps a tool result over its cap whole (up to
:data:`DEFAULT_RESULT_ROOM_SHARE` of the window) while the conversation with it stays under
80% of the usable window (``ToolResultBudget(room=0.8)``; with it twice for a result over
10% of the window): what the window can afford while there is no pressure. A fixed cut
lost the lines of large file reads the agent copied a few calls later."""

DEFAULT_RESULT_ROOM_SHARE = 0.3
"""While there is room (:data:`DEFAULT_RESULT_ROOM`), one tool result may take up to 30% of
the usable window whole (``ToolResultBudget(room_fraction=0.3)``); under pressure the cap is
back to :data:`DEFAULT_RESULT_SHARE`."""

DEFAULT_SHRINK_KEEP_RECENT = 1
"""default_stack's relief first shrinks the tool results older than the newest tool-call
turn to their heads, to the largest common size that frees what the relief needs
(``ShrinkToolResults(keep_recent=1)`` before microcompaction), so it clears whole results
and trims whole turns only when excerpts do not free enough."""

DEFAULT_RESULT_KEEP = "middle"
"""default_stack's cut of a tool result over its cap: the start and the end are kept, the
middle dropped (``ToolResultBudget(keep="middle")``)."""

DEFAULT_TRIGGER = 1.0
"""default_stack's trigger: relieve only when a request would not fit the usable window, and
deep (to the low-water mark), so that one relief buys the widest run of calls that append to
a cached prefix, and a conversation that fits is never rewritten."""

DEFAULT_RELIEF_RUN = 20
"""default_stack's relief run: a relief leaves room for at least 20 calls at the rate the
conversation grew since the last one (going below the low-water mark when it must, never
below 0.2 of the usable window), so it breaks the cached prefix about once per 20 calls
(``BudgetGuard(relief_run=...)``)."""

DEFAULT_RESULT_SHARE = 0.1
"""default_stack's cap on one tool result: 10% of the usable window (and 16 KiB)."""

DEFAULT_SUMMARY_REFERENCES: float | None = 0.1
"""default_stack's summaries carry the spans they lack: up to 10% of a summary's budget
(``Summarize(references=0.1)``) holds the paths, identifiers, numbers and hex strings of
the summarized messages that the summary text and the kept messages do not, verbatim,
newest first. On the shared transcripts (issue #38) it lost fewer or as many uses as the
summary without them on every transcript at 24K, 32K, 48K, 64K and 128K, at about the same
cost: most uses a relief still lost at 32K were of spans a summary had dropped."""

DEFAULT_KEEP_SUMMARIES = 3
"""default_stack's summaries stack: up to 3 earlier summaries stay verbatim in front of a new
one (``Summarize(keep_summaries=3)``), the 5th folds them all into one."""


def _keeping_the_task(
    policies: list[PressurePolicy], keep_summaries: int, references: float | None = None
) -> list[PressurePolicy]:
    """``policies`` with the built-in summary keeping the task and the earlier summaries in
    front of it (``Summarize(keep_task=True, keep_summaries=...)``: the prefix up to the
    last summary stays cached across reliefs)."""
    return [
        Summarize(
            ExtractiveSummarizer(),
            keep_task=True,
            keep_summaries=keep_summaries,
            references=references,
        )
        if policy_role(p) == "summarize"
        else p
        for p in policies
    ]


def default_stack(
    *,
    counter: TokenCounter | None = None,
    low_water: float = DEFAULT_LOW_WATER,
    keep_summaries: int = DEFAULT_KEEP_SUMMARIES,
    relief_run: int = DEFAULT_RELIEF_RUN,
    order: OrderSpec = DEFAULT_ORDER,
    result_bytes: int = DEFAULT_RESULT_BYTES,
    result_keep: str = DEFAULT_RESULT_KEEP,
    result_room: float | None = DEFAULT_RESULT_ROOM,
    result_room_share: float | None = DEFAULT_RESULT_ROOM_SHARE,
    shrink_first: bool = True,
    keep_task: bool = True,
    summary_references: float | None = DEFAULT_SUMMARY_REFERENCES,
) -> list[LayerLike]:
    """Budget every tool result, then guard the window with the policies in ``order``.

    A tool result is cut to 10% of the usable window and 16 KiB, keeping its start and its
    end, unless the window has room for it whole. The guard acts only when a request would
    not fit the usable window and relieves in one batch down to ``low_water``, or deeper
    when the conversation grows so fast that the mark would not leave room for 20 calls
    (``relief_run``), so that rewrites, which break a provider's cached prefix, stay rare.
    Its policies: drop non-essential context, clear old images, shrink the tool results
    before the newest turn to their heads, microcompact old tool results, summarize (the
    task and up to ``keep_summaries`` earlier summaries stay in front, and the summary
    carries the paths and identifiers it lacks verbatim, see :class:`Summarize`), trim the
    oldest turns, and last shrink every tool result (the newest turn's too) before giving
    up.

    Args:
        counter: the token counter the guard measures with (default: the heuristic one).
        low_water: where a relief goes down to, a fraction of the usable window (0.3).
        keep_summaries: earlier summaries kept verbatim in front of a new one (3).
        relief_run: calls a relief leaves room for at the conversation's growth (20; 0
            lets the mark alone decide: more context on a fast conversation, more breaks).
        order: the guard's policy order by role (:data:`DEFAULT_ORDER`).
        result_bytes: the byte cap on one tool result while the window has no room (16 KiB).
        result_keep: what a cut keeps: ``"middle"`` (start and end) or ``"head"``.
        result_room: a result enters whole while the conversation with it stays under
            this fraction of the usable window (0.8; None: never).
        result_room_share: the share of the usable window one result may take whole while
            there is room (0.3; None: the 10% cap).
        shrink_first: shrink the older results to excerpts before microcompaction clears
            any whole (True).
        keep_task: the trim removes the first user message, the task, last (True).
        summary_references: the share of a summary's budget its references section (the
            summarized spans it lacks, verbatim) may take (0.1; None: no section;
            ``Summarize(references=...)``).

    The defaults were chosen by what the stack forgets (:mod:`tinyctx.forgetting`) beside
    what it costs (issue #38); the stack before issue #38 is ``default_stack(low_water=0.4,
    result_keep="head", result_room=None, result_room_share=None, shrink_first=False,
    keep_task=False, summary_references=None)``."""
    budget = ToolResultBudget(
        result_bytes,
        window_fraction=DEFAULT_RESULT_SHARE,
        keep=result_keep,
        room=result_room,
        room_fraction=result_room_share,
    )
    policies: list[PressurePolicy] = []
    for policy in default_policies(order):
        if shrink_first and policy_role(policy) == "compact":
            policies.append(
                ShrinkToolResults(
                    keep_recent=DEFAULT_SHRINK_KEEP_RECENT, name="ShrinkOlderToolResults"
                )
            )
        keep = keep_task and policy_role(policy) == "trim"
        policies.append(TrimOldest(keep_task=True) if keep else policy)
    return _guarded(
        policies, counter, low_water, keep_summaries, relief_run, budget, summary_references
    )


def seed_order_stack(
    *,
    counter: TokenCounter | None = None,
    low_water: float = SEED_LOW_WATER,
    keep_summaries: int = DEFAULT_KEEP_SUMMARIES,
    relief_run: int = DEFAULT_RELIEF_RUN,
) -> list[LayerLike]:
    """The stack before issue #38 with seed 000's order: drop → trim → summarize →
    compact (→ shrink), every tool result cut to 16 KiB and 10% of the usable window (its
    head kept), relieved down to 0.4."""
    return _guarded(default_policies("seed"), counter, low_water, keep_summaries, relief_run)


def _guarded(
    policies: list[PressurePolicy],
    counter: TokenCounter | None,
    low_water: float,
    keep_summaries: int,
    relief_run: int,
    budget: ToolResultBudget | None = None,
    references: float | None = None,
) -> list[LayerLike]:
    """The named stacks' shape for one policy order: every tool result budgeted, then the
    guard (acting only on a request that would not fit) with ``policies``, their summary
    keeping the task and stacking, and shrinking tool results last."""
    return [
        budget or ToolResultBudget(window_fraction=DEFAULT_RESULT_SHARE),
        BudgetGuard(
            policies=[
                *_keeping_the_task(policies, keep_summaries, references),
                ShrinkToolResults(),
            ],
            counter=counter,
            trigger=DEFAULT_TRIGGER,
            low_water=low_water,
            relief_run=relief_run,
        ),
    ]


def summarize(
    summarizer: str = "extractive",
    *,
    max_tokens: int = 1024,
    counter: TokenCounter | None = None,
    **options: Any,
) -> Summarize:
    """``Summarize`` from plain values: ``summarizer`` names an offline summarizer.

    (A model-backed summarizer needs a model handler, which a TOML file cannot give; build
    ``Summarize(ModelSummarizer(model))`` in code.)
    """
    one_of(SUMMARIZERS, allowed=f"one of {SUMMARIZERS}").check(
        summarizer, "summarizer", "summarize"
    )
    return Summarize(ExtractiveSummarizer(max_tokens=max_tokens), counter=counter, **options)

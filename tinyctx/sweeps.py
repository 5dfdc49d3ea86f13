"""Sweeps: replay a stack over a range of one knob, the cost curve a user picks a setting
from, its frontiers, and how two curves compare."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

if TYPE_CHECKING:
    from .chain import LayerLike
    from .messages import Message
    from .tokens import TokenCounter

from .prices import DEFAULT_PRICE, ModelPrice, price_for
from .pricing import price_replay

__all__ = [
    "CurveComparison",
    "SweepPoint",
    "compare_curves",
    "cost_at",
    "frontier",
    "lost_frontier",
    "sweep",
]


@frozen
class SweepPoint:
    """One setting of a sweep: the knob's value and what the replay cost at it.

    ``series`` names the other settings the point was replayed with when a sweep has more
    than one (``tinyctx replay --sweep`` replays a stack whose guard has a relief run with
    it and without it: ``"relief_run=20"``, ``"relief_run=0"``); None in a one-series sweep.

    Args:
        value: The knob's value.
        average_prompt_tokens: The replay's mean prompt size, in tokens.
        cost: What the replay cost, USD.
        breaks: How many calls broke the cached prefix.
        calls: How many model calls were replayed.
        error: Why the replay stopped, or None.
        series: The other settings the point was replayed with, or None.
        uses: Uses of earlier context by the replayed replies, or None.
        lost: Those the sent requests had lost, or None.
    """

    value: float
    average_prompt_tokens: float
    cost: float
    breaks: int
    calls: int
    error: str | None = None
    series: str | None = None
    uses: int | None = None
    """Uses of earlier context by the replayed replies (:mod:`tinyctx.forgetting`)."""
    lost: int | None = None
    """Those the sent requests had lost."""

    @property
    def lost_rate(self) -> float | None:
        return self.lost / self.uses if self.uses and self.lost is not None else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "value": self.value,
            "average_prompt_tokens": self.average_prompt_tokens,
            "cost": self.cost,
            "prefix_breaks": self.breaks,
            "calls": self.calls,
            "error": self.error,
        }
        if self.series is not None:
            out["series"] = self.series
        if self.uses is not None:
            out.update(uses=self.uses, lost_uses=self.lost, lost_rate=self.lost_rate)
        return out


def sweep(
    transcript: Sequence[Message],
    stack_for: Callable[[float], Sequence[LayerLike]],
    values: Iterable[float],
    *,
    price: ModelPrice | str = DEFAULT_PRICE,
    window: int | None = None,
    reserved: int = 0,
    counter: TokenCounter | None = None,
    series: str | None = None,
) -> tuple[SweepPoint, ...]:
    """Replay ``transcript`` through ``stack_for(value)`` for each value and price it.

    The points come back in the order of ``values``, labelled ``series``; a replay the
    stack could not keep in the window carries its ``error`` (and the cost of the calls
    made until then). Sweep again with another ``stack_for`` and ``series`` to put a second
    knob on the same curve (:func:`frontier` takes the points of both).

    Args:
        transcript: The conversation to replay.
        stack_for: The stack for a knob's value (a fresh one each time).
        values: The knob's values, in the order the points come back.
        price: The model's price, or its name.
        window: The context window, or None for the model's.
        reserved: Tokens kept free for the reply.
        counter: The token counter (the default one when None).
        series: The label of these points, or None.
    """
    from .forgetting import UsesIndex
    from .replay import replay_sync
    from .tokens import default_counter

    chosen = price_for(price) if isinstance(price, str) else price
    counter = counter or default_counter()
    transcript = tuple(transcript)
    uses = UsesIndex.build(transcript)
    points: list[SweepPoint] = []
    for value in values:
        report = replay_sync(
            transcript,
            stack_for(value),
            window=window,
            reserved=reserved,
            counter=counter,
            uses=uses,
        )
        cost = price_replay(report, chosen)
        points.append(
            SweepPoint(
                float(value),
                cost.average_prompt_tokens,
                cost.total,
                cost.breaks,
                len(cost.calls),
                report.error,
                series,
                report.uses,
                report.lost,
            )
        )
    return tuple(points)


def frontier(points: Iterable[SweepPoint]) -> tuple[SweepPoint, ...]:
    """The settings of a sweep a user would pick from, by average prompt tokens.

    Points with an ``error`` (the stack did not keep the window) are left out, and so is
    every point another point dominates: one that keeps at least as many average prompt
    tokens for no more cost. What remains is sorted by average prompt tokens, and its cost
    rises strictly with them (a sweep's points need not: the knob does not map monotonically
    onto the average, so interpolating the raw points would zigzag)."""
    ordered = sorted(
        (p for p in points if p.error is None),
        key=lambda p: (-p.average_prompt_tokens, p.cost),
    )
    kept: list[SweepPoint] = []
    for point in ordered:  # from the most context down: keep what is cheaper than all above
        if not kept or point.cost < kept[-1].cost:
            kept.append(point)
    return tuple(reversed(kept))


def lost_frontier(points: Iterable[SweepPoint]) -> tuple[SweepPoint, ...]:
    """The settings of a sweep worth picking by cost and forgetting: those no other point
    beats on both (no more cost and no higher lost rate, one of them strictly less),
    sorted by cost, their lost rate falling strictly. Points with an ``error`` or without
    a lost rate are left out."""
    ordered = sorted(
        (p for p in points if p.error is None and p.lost_rate is not None),
        key=lambda p: (p.cost, p.lost_rate),
    )
    kept: list[SweepPoint] = []
    for point in ordered:  # from the cheapest up: keep what forgets less than all below
        rate = point.lost_rate
        assert rate is not None
        if not kept or rate < (kept[-1].lost_rate or 0.0):
            kept.append(point)
    return tuple(kept)


def _interpolate(curve: Sequence[SweepPoint], x: float) -> float | None:
    """The cost of a :func:`frontier` at ``x`` average prompt tokens, linear between its
    points; None outside its range."""
    if not curve or x < curve[0].average_prompt_tokens or x > curve[-1].average_prompt_tokens:
        return None
    for a, b in itertools.pairwise(curve):
        x0, x1 = a.average_prompt_tokens, b.average_prompt_tokens
        if x0 <= x <= x1:
            return a.cost + (x - x0) / (x1 - x0) * (b.cost - a.cost)
    return curve[0].cost  # a one-point frontier


def cost_at(points: Sequence[SweepPoint], average_prompt_tokens: float) -> float | None:
    """The cost a curve gives at ``average_prompt_tokens``: linear interpolation along its
    :func:`frontier` (the points not dominated, sorted by average prompt tokens), or None
    outside the frontier's range."""
    return _interpolate(frontier(points), average_prompt_tokens)


@frozen
class CurveComparison:
    """Two sweep curves compared at equal average prompt tokens (:func:`compare_curves`).

    ``samples`` holds ``(average_prompt_tokens, ours, theirs)`` at every point of either
    frontier inside the range both cover (``low`` to ``high``), each curve interpolated
    linearly along its frontier; empty when the ranges do not meet."""

    low: float
    high: float
    samples: tuple[tuple[float, float, float], ...]

    @property
    def below(self) -> bool:
        """Whether ours costs no more than theirs at every compared point (and one was)."""
        return bool(self.samples) and all(o <= t for _, o, t in self.samples)

    @property
    def worst(self) -> tuple[float, float, float] | None:
        """The sample where ours compares worst (the highest ratio of our cost to theirs)."""
        return max(self.samples, key=lambda s: s[1] / s[2] if s[2] else math.inf, default=None)

    @property
    def mean_ratio(self) -> float | None:
        """Our cost over theirs, averaged over the samples."""
        ratios = [o / t for _, o, t in self.samples if t]
        return math.fsum(ratios) / len(ratios) if ratios else None

    def to_json(self) -> dict[str, Any]:
        return {
            "low": self.low,
            "high": self.high,
            "samples": [list(s) for s in self.samples],
            "below": self.below,
            "worst": list(self.worst) if self.worst else None,
            "mean_ratio": self.mean_ratio,
        }


def compare_curves(ours: Iterable[SweepPoint], theirs: Iterable[SweepPoint]) -> CurveComparison:
    """Compare two sweeps at equal average prompt tokens, over the range both cover.

    Each curve is its :func:`frontier`; both are interpolated at every frontier point of
    either that lies in the common range (its ends included). Outside that range one curve
    has no setting to compare with, so nothing is claimed there."""
    mine, other = frontier(ours), frontier(theirs)
    if not mine or not other:
        return CurveComparison(math.nan, math.nan, ())
    low = max(mine[0].average_prompt_tokens, other[0].average_prompt_tokens)
    high = min(mine[-1].average_prompt_tokens, other[-1].average_prompt_tokens)
    if low > high:
        return CurveComparison(low, high, ())
    xs = sorted(
        {low, high}
        | {
            p.average_prompt_tokens
            for p in (*mine, *other)
            if low <= p.average_prompt_tokens <= high
        }
    )
    samples = []
    for x in xs:
        a, b = _interpolate(mine, x), _interpolate(other, x)
        if a is not None and b is not None:
            samples.append((x, a, b))
    return CurveComparison(low, high, tuple(samples))

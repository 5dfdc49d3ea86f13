"""What a context policy costs: model prices, prompt-cache accounting and sweeps.

Providers cache prompt prefixes: a call whose prompt starts with what an earlier call sent
pays a fraction of the input price for that part (a *cache read*), and Anthropic charges a
premium for the part it stores (a *cache write*). What a policy costs therefore depends less
on how many tokens it sends than on how often it breaks the cached prefix.

The model used here (:func:`price_calls`), per model call ``i`` of a replay:

- the *shared prefix* is the longest run of leading messages equal to the previous call's
  (system prompt and tool schemas first: if they differ nothing is shared), measured in
  tokens with the per-message counts of the replay's counter;
- the prefix *broke* when the previous prompt is not wholly a prefix of this one, i.e. a
  layer rewrote something the provider had cached; ``break_at`` is the index of the first
  message that differs (0 when the system prompt or tools changed);
- ``cache_read`` is the shared prefix when it reaches the model's ``min_cacheable`` tokens
  (rounded down to ``cache_granularity``: OpenAI caches in 128-token steps) and the previous
  prompt was itself cacheable; with explicit caching (Anthropic) everything else of a
  cacheable prompt is ``cache_write``, with automatic caching (OpenAI, no write charge) it
  is ``uncached``, as is all of a prompt under ``min_cacheable``;
- ``cost = uncached * input + cache_write * cache_write_price + cache_read * cache_read_price
  + output * output_price`` (prices per million tokens).

This is the cache a provider keeps when each call marks its end as a breakpoint (Anthropic's
automatic mode, or an explicit breakpoint on the last message) and no entry expires: calls of
one replay follow each other at once. It ignores Anthropic's 20-block lookback (a read can
only start at a block an earlier call cached; here a prefix of the previous call is always
found) and time-to-live, so it is exact for the common agent loop and slightly optimistic
about prefixes recovered after a break.

:func:`price_replay` prices a :class:`tinyctx.replay.ReplayReport`; :func:`sweep` replays a
stack over a range of one knob and returns the cost curve a user picks a setting from.
"""

from __future__ import annotations

import itertools
import math
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from attrs import field, frozen

from .config import integer, number
from .errors import ConfigError
from .frozen import FrozenDict

if TYPE_CHECKING:
    from .chain import LayerLike
    from .messages import Message
    from .replay import ReplayReport
    from .tokens import TokenCounter

__all__ = [
    "Caching",
    "ModelPrice",
    "PRICES",
    "price_for",
    "parse_price",
    "load_price_table",
    "PromptShape",
    "CallCost",
    "CostReport",
    "price_calls",
    "price_replay",
    "SweepPoint",
    "sweep",
    "cost_at",
    "frontier",
    "lost_frontier",
    "CurveComparison",
    "compare_curves",
    "DEFAULT_PRICE",
    "call_fields",
    "summary_fields",
    "add_to_payload",
]

Caching = Literal["explicit", "automatic", "none"]
CACHING: tuple[str, ...] = ("explicit", "automatic", "none")

_FIELDS = (
    "input",
    "output",
    "cache_write",
    "cache_read",
    "caching",
    "min_cacheable",
    "cache_granularity",
    "window",
)


@frozen
class ModelPrice:
    """One model's prices (USD per million tokens), caching rules and context window.

    ``caching`` is ``"explicit"`` (Anthropic: the request marks cache breakpoints and a write
    costs a premium), ``"automatic"`` (OpenAI: prefixes are cached on their own, no write
    premium) or ``"none"``. ``min_cacheable`` is the shortest prompt prefix the provider
    caches; ``cache_granularity`` the step a cached prefix is rounded down to.
    """

    name: str
    input: float
    output: float
    cache_write: float
    cache_read: float
    caching: Caching = "explicit"
    min_cacheable: int = 1024
    cache_granularity: int = 1
    window: int = 200_000

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **{f: getattr(self, f) for f in _FIELDS}}


def _anthropic(name: str, input_: float, output: float, minimum: int) -> ModelPrice:
    # writes (5-minute cache) cost 1.25x the input price, reads 0.1x
    return ModelPrice(
        name, input_, output, input_ * 1.25, input_ * 0.1, "explicit", minimum, 1, 200_000
    )


def _openai(name: str, input_: float, output: float, read: float, window: int) -> ModelPrice:
    return ModelPrice(name, input_, output, input_, read, "automatic", 1024, 128, window)


PRICES: FrozenDict[str, ModelPrice] = FrozenDict(
    {
        p.name: p
        for p in (
            _anthropic("claude-opus-4-5", 5.0, 25.0, 4096),
            _anthropic("claude-opus-4-1", 15.0, 75.0, 1024),
            _anthropic("claude-opus-4", 15.0, 75.0, 1024),
            _anthropic("claude-sonnet-4-5", 3.0, 15.0, 1024),
            _anthropic("claude-sonnet-4", 3.0, 15.0, 1024),
            _anthropic("claude-3-7-sonnet", 3.0, 15.0, 1024),
            _anthropic("claude-haiku-4-5", 1.0, 5.0, 4096),
            _anthropic("claude-3-5-haiku", 0.8, 4.0, 2048),
            _openai("gpt-4o", 2.5, 10.0, 1.25, 128_000),
            _openai("gpt-4o-mini", 0.15, 0.6, 0.075, 128_000),
            _openai("gpt-4.1", 2.0, 8.0, 0.5, 1_047_576),
            _openai("gpt-4.1-mini", 0.4, 1.6, 0.1, 1_047_576),
            _openai("gpt-4.1-nano", 0.1, 0.4, 0.025, 1_047_576),
            _openai("gpt-5", 1.25, 10.0, 0.125, 400_000),
            _openai("gpt-5-mini", 0.25, 2.0, 0.025, 400_000),
            _openai("o3", 2.0, 8.0, 0.5, 200_000),
            _openai("o4-mini", 1.1, 4.4, 0.275, 200_000),
        )
    }
)
"""Built-in prices (list prices, USD per million tokens; check your provider's page)."""

DEFAULT_PRICE = "claude-sonnet-4-5"


def price_for(model: str, table: Mapping[str, ModelPrice] | None = None) -> ModelPrice:
    """The price of ``model`` in ``table`` (default :data:`PRICES`): the exact name, else the
    longest known name it starts with (``claude-sonnet-4-5-20250929`` → ``claude-sonnet-4-5``).
    An unknown model is a :class:`ConfigError` listing the known ones."""
    prices = PRICES if table is None else table
    if not isinstance(model, str) or not model:
        raise ConfigError("model", model, f"one of {sorted(prices)}", owner="price_for")
    name = model.strip().lower()
    if name in prices:
        return prices[name]
    for known in sorted(prices, key=len, reverse=True):
        if name.startswith(known):
            return prices[known]
    raise ConfigError("model", model, f"one of {sorted(prices)}", owner="price_for")


def _number(where: str, key: str, value: Any, *, positive: bool = False) -> float:
    check = _POSITIVE_NUMBER if positive else _PRICE
    return float(check.check(value, key, where))


def _integer(where: str, key: str, value: Any, minimum: int) -> int:
    return integer(minimum=minimum).check(value, key, where)


_POSITIVE_NUMBER = number(above=0, allowed="a finite number > 0")
_PRICE = number(minimum=0, allowed="a finite number >= 0 (USD per 1M tokens)")


def parse_price(name: str, values: Mapping[str, Any], *, where: str = "price") -> ModelPrice:
    """A :class:`ModelPrice` from plain values (a TOML table): ``input`` and ``output`` are
    required; ``cache_read`` defaults to ``input``, ``cache_write`` to 1.25x ``input``
    for explicit caching and to ``input`` otherwise. Unknown keys and bad values raise
    :class:`ConfigError` naming ``where.key``."""
    owner = f"{where}.{name}"
    if not isinstance(values, Mapping):
        raise ConfigError(name, values, "a table of prices", owner=where)
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(unknown[0], values[unknown[0]], f"one of the keys {_FIELDS}", owner=owner)
    for required in ("input", "output"):
        if required not in values:
            raise ConfigError(
                required, None, "a price in USD per 1M tokens (required)", owner=owner
            )
    input_ = _number(owner, "input", values["input"])
    output = _number(owner, "output", values["output"])
    caching = values.get("caching", "explicit")
    if caching not in CACHING:
        raise ConfigError("caching", caching, f"one of {CACHING}", owner=owner)
    write_default = input_ * 1.25 if caching == "explicit" else input_
    return ModelPrice(
        name=name,
        input=input_,
        output=output,
        cache_write=_number(owner, "cache_write", values.get("cache_write", write_default)),
        cache_read=_number(owner, "cache_read", values.get("cache_read", input_)),
        caching=caching,
        min_cacheable=_integer(owner, "min_cacheable", values.get("min_cacheable", 1024), 0),
        cache_granularity=_integer(
            owner, "cache_granularity", values.get("cache_granularity", 1), 1
        ),
        window=_integer(owner, "window", values.get("window", 200_000), 1),
    )


def load_price_table(path: str | os.PathLike[str]) -> dict[str, ModelPrice]:
    """Prices from a TOML file of ``[models.<name>]`` tables (keys as :func:`parse_price`).

    Errors name the file and the offending ``models.<name>.<key>``."""
    source = Path(path)
    where = f"{source}: models"
    try:
        document = tomllib.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            "path", str(source), f"a readable TOML file ({exc})", owner="prices"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("path", str(source), f"valid TOML ({exc})", owner="prices") from None
    unknown = sorted(set(document) - {"models"})
    if unknown or not isinstance(document.get("models"), dict) or not document["models"]:
        raise ConfigError(
            unknown[0] if unknown else "models",
            None,
            "one or more [models.<name>] tables and nothing else",
            owner=str(source),
        )
    return {
        name.lower(): parse_price(name.lower(), values, where=where)
        for name, values in document["models"].items()
    }


# ---------------------------------------------------------------------------------------
# pricing a sequence of prompts


@frozen
class PromptShape:
    """What pricing needs of one model call: the sent messages with their token counts,
    the tokens outside them (system prompt, tool schemas, overhead) and a key for that part,
    and the output tokens of the reply."""

    messages: tuple[Message, ...] = field(repr=False)
    message_tokens: tuple[int, ...] = field(repr=False)
    fixed_tokens: int
    output_tokens: int
    fixed_key: Any = field(default=None, repr=False)

    @property
    def prompt_tokens(self) -> int:
        return self.fixed_tokens + sum(self.message_tokens)


@frozen
class CallCost:
    """One call's prompt-cache accounting and cost (USD)."""

    index: int
    prompt_tokens: int
    output_tokens: int
    cache_read: int
    cache_write: int
    uncached: int
    shared_tokens: int
    broke: bool
    break_at: int | None
    cost: float

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "uncached": self.uncached,
            "shared_tokens": self.shared_tokens,
            "prefix_broke": self.broke,
            "break_at": self.break_at,
            "cost": self.cost,
        }


@frozen
class CostReport:
    """Every call's cost and the totals, at one :class:`ModelPrice`."""

    price: ModelPrice
    calls: tuple[CallCost, ...]

    @property
    def total(self) -> float:
        return math.fsum(c.cost for c in self.calls)

    @property
    def cache_read(self) -> int:
        return sum(c.cache_read for c in self.calls)

    @property
    def cache_write(self) -> int:
        return sum(c.cache_write for c in self.calls)

    @property
    def uncached(self) -> int:
        return sum(c.uncached for c in self.calls)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens for c in self.calls)

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def breaks(self) -> int:
        return sum(1 for c in self.calls if c.broke)

    @property
    def average_prompt_tokens(self) -> float:
        return self.prompt_tokens / len(self.calls) if self.calls else 0.0

    @property
    def cache_hit_rate(self) -> float:
        prompt = self.prompt_tokens
        return self.cache_read / prompt if prompt else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.price.name,
            "total_cost": self.total,
            "prompt_tokens": self.prompt_tokens,
            "average_prompt_tokens": self.average_prompt_tokens,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "uncached": self.uncached,
            "output_tokens": self.output_tokens,
            "cache_hit_rate": self.cache_hit_rate,
            "prefix_breaks": self.breaks,
            "break_at": [c.break_at for c in self.calls if c.broke],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "price": self.price.to_json(),
            "summary": self.summary(),
            "calls": [c.to_json() for c in self.calls],
        }


def _shared(previous: tuple[Message, ...], current: tuple[Message, ...]) -> int:
    """How many leading messages ``current`` shares with ``previous`` (identity first)."""
    limit = min(len(previous), len(current))
    index = 0
    while index < limit:
        a, b = previous[index], current[index]
        if a is not b and a != b:
            break
        index += 1
    return index


def price_calls(prompts: Iterable[PromptShape], price: ModelPrice) -> CostReport:
    """Price consecutive model calls under ``price`` with the prefix model of this module."""
    calls: list[CallCost] = []
    previous: PromptShape | None = None
    previous_cached = False
    per_token = 1e-6
    for index, prompt in enumerate(prompts, start=1):
        total = prompt.prompt_tokens
        shared_tokens = 0
        broke, break_at = False, None
        if previous is not None:
            if prompt.fixed_key != previous.fixed_key:
                broke, break_at = True, 0
            else:
                shared = _shared(previous.messages, prompt.messages)
                shared_tokens = prompt.fixed_tokens + sum(prompt.message_tokens[:shared])
                if shared < len(previous.messages):
                    broke, break_at = True, shared
        cacheable = price.caching != "none" and total >= price.min_cacheable
        read = 0
        if cacheable and previous_cached and shared_tokens >= price.min_cacheable:
            step = price.cache_granularity
            read = min(shared_tokens - shared_tokens % step, total)
        # explicit caching writes the new part at a premium; automatic caching stores it
        # for free, so it is billed as plain input
        write = total - read if cacheable and price.caching == "explicit" else 0
        uncached = total - read - write
        cost = per_token * (
            uncached * price.input
            + write * price.cache_write
            + read * price.cache_read
            + prompt.output_tokens * price.output
        )
        calls.append(
            CallCost(
                index,
                total,
                prompt.output_tokens,
                read,
                write,
                uncached,
                shared_tokens,
                broke,
                break_at,
                cost,
            )
        )
        previous, previous_cached = prompt, cacheable
    return CostReport(price, tuple(calls))


def price_replay(report: ReplayReport, price: ModelPrice | str = DEFAULT_PRICE) -> CostReport:
    """The cost of every call of a replay (see :func:`price_calls` for the model)."""
    chosen = price_for(price) if isinstance(price, str) else price
    return price_calls((row.shape for row in report.rows if row.shape is not None), chosen)


# ---------------------------------------------------------------------------------------
# sweeps


@frozen
class SweepPoint:
    """One setting of a sweep: the knob's value and what the replay cost at it.

    ``series`` names the other settings the point was replayed with when a sweep has more
    than one (``tinyctx replay --sweep`` replays a stack whose guard has a relief run with
    it and without it: ``"relief_run=20"``, ``"relief_run=0"``); None in a one-series sweep.
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


def call_fields(call: CallCost) -> dict[str, Any]:
    """The keys a priced call adds to a replay's per-call JSON (``tinyctx replay --json``)."""
    return {
        "cost_usd": call.cost,
        "cache_read_tokens": call.cache_read,
        "cache_write_tokens": call.cache_write,
        "uncached_tokens": call.uncached,
        "output_tokens": call.output_tokens,
        "prefix_broke": call.broke,
        "break_at": call.break_at,
    }


def summary_fields(report: CostReport) -> dict[str, Any]:
    """The keys a priced replay adds to its JSON summary."""
    return {
        "price_model": report.price.name,
        "total_cost_usd": report.total,
        "cache_read_tokens": report.cache_read,
        "cache_write_tokens": report.cache_write,
        "uncached_tokens": report.uncached,
        "output_tokens": report.output_tokens,
        "cache_hit_rate": report.cache_hit_rate,
        "prefix_breaks": report.breaks,
        "average_prompt_tokens": report.average_prompt_tokens,
    }


def add_to_payload(payload: dict[str, Any], report: CostReport) -> dict[str, Any]:
    """Put ``report`` into a replay's JSON ``payload`` (its calls and summary), in place."""
    for entry, call in zip(payload["calls"], report.calls, strict=True):
        entry.update(call_fields(call))
    payload["summary"].update(summary_fields(report))
    payload["price"] = report.price.to_json()
    return payload

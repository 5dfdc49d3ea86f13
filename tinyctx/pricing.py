"""What a sequence of prompts costs, with prompt-cache accounting.

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

if TYPE_CHECKING:
    from .messages import Message
    from .replay import ReplayReport

from .prices import DEFAULT_PRICE, ModelPrice, price_for

__all__ = [
    "CallCost",
    "CostReport",
    "PromptShape",
    "add_to_payload",
    "call_fields",
    "price_calls",
    "price_replay",
    "summary_fields",
]


@frozen
class PromptShape:
    """What pricing needs of one model call: the sent messages with their token counts,
    the tokens outside them (system prompt, tool schemas, overhead) and a key for that part,
    and the output tokens of the reply.

    Args:
        messages: The messages sent.
        message_tokens: Each message's token count.
        fixed_tokens: The tokens outside the messages (system prompt, tool schemas).
        output_tokens: The reply's output tokens.
        fixed_key: What the fixed part was made of; a change breaks the cached prefix.
    """

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
    """One call's prompt-cache accounting and cost (USD).

    Args:
        index: The call's number in the replay.
        prompt_tokens: The prompt's tokens.
        output_tokens: The reply's tokens.
        cache_read: Prompt tokens read from the cache.
        cache_write: Prompt tokens written to it.
        uncached: Prompt tokens neither read nor written.
        shared_tokens: The prefix shared with the previous call, in tokens.
        broke: Whether the previous prompt is not wholly a prefix of this one.
        break_at: The index of the first message that differs, or None.
        cost: The call's cost in USD.
    """

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

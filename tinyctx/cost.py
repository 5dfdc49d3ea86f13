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

The pieces: :mod:`tinyctx.prices` (model prices), :mod:`tinyctx.pricing` (pricing
prompts) and :mod:`tinyctx.sweeps` (sweeps), all re-exported here.

:func:`price_replay` prices a :class:`tinyctx.replay.ReplayReport`; :func:`sweep` replays a
stack over a range of one knob and returns the cost curve a user picks a setting from.
"""

from __future__ import annotations

from .prices import (
    CACHING,
    DEFAULT_PRICE,
    PRICES,
    Caching,
    ModelPrice,
    load_price_table,
    parse_price,
    price_for,
)
from .pricing import (
    CallCost,
    CostReport,
    PromptShape,
    add_to_payload,
    call_fields,
    price_calls,
    price_replay,
    summary_fields,
)
from .sweeps import (
    CurveComparison,
    SweepPoint,
    compare_curves,
    cost_at,
    frontier,
    lost_frontier,
    sweep,
)

__all__ = [
    "CACHING",
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

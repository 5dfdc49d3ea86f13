"""What a context policy costs: model prices, prompt-cache accounting and sweeps.

What a policy costs depends less on how many tokens it sends than on how often it breaks
the provider's cached prefix; :mod:`tinyctx.pricing` spells out the cache model.

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

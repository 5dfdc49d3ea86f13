"""Usage and cost trackers shared by a whole tree of nested calls.

One tracker per tree: every derived context holds the same object, so a sub-agent's
tokens roll up to the root without anyone forwarding them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import field, frozen

from .config import implements, number
from .model import Usage

__all__ = ["UsageTracker", "CostTracker", "Price"]


_NO_USAGE = Usage()
_NO_PRICES: dict[str, Any] = {}


class UsageTracker:
    """Sums :class:`Usage` per model name across every call of the tree."""

    __slots__ = ("_by_model", "_calls", "_total")

    def __init__(self) -> None:
        self._by_model: dict[str, Usage] = {}
        self._calls = 0
        self._total = _NO_USAGE  # frozen: shared until the first call adds to it

    def add(self, model: str | None, usage: Usage) -> None:
        key = model or "unknown"
        current = self._by_model.get(key)
        self._by_model[key] = usage if current is None else current + usage
        self._total = self._total + usage
        self._calls += 1

    @property
    def calls(self) -> int:
        return self._calls

    def total(self) -> Usage:
        """The sum over every model (kept up to date, so reading it allocates nothing)."""
        return self._total

    def by_model(self) -> dict[str, Usage]:
        return dict(self._by_model)

    def __repr__(self) -> str:
        return f"<UsageTracker calls={self._calls} total={self.total()!r}>"


_RATE = number(minimum=0, allowed="a finite number >= 0 (USD per million tokens)")


@frozen
class Price:
    """USD per million tokens. ``cached_input`` defaults to ``input`` when not given."""

    input: float = field(validator=_RATE)
    output: float = field(validator=_RATE)
    cached_input: float | None = None

    def cost(self, usage: Usage) -> float:
        cached = min(usage.cached_tokens, usage.input_tokens)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return (
            (usage.input_tokens - cached) * self.input
            + cached * cached_rate
            + usage.output_tokens * self.output
        ) / 1_000_000


_PRICE = implements(Price, allowed="a tinyctx.usage.Price")


class CostTracker:
    """Turns the tree's usage into money from a price table the application supplies.

    Models without a price are reported in :meth:`unpriced`, never silently costed at 0.
    """

    __slots__ = ("_prices", "_usage")

    def __init__(self, usage: UsageTracker, prices: Mapping[str, Price] | None = None) -> None:
        self._usage = usage
        self._prices: dict[str, Price] = _NO_PRICES  # read-only: shared while empty
        for model, price in (prices or {}).items():
            _PRICE.check(price, f"prices[{model!r}]", "CostTracker")
            if self._prices is _NO_PRICES:
                self._prices = {}
            self._prices[model] = price

    @property
    def prices(self) -> Mapping[str, Price]:
        return dict(self._prices)

    def _price_for(self, model: str) -> Price | None:
        price = self._prices.get(model)
        if price is not None:
            return price
        # longest matching prefix lets "gpt-4o" price "gpt-4o-2024-08-06"
        best: tuple[int, Price] | None = None
        for name, candidate in self._prices.items():
            if model.startswith(name) and (best is None or len(name) > best[0]):
                best = (len(name), candidate)
        return best[1] if best else None

    def by_model(self) -> dict[str, float]:
        costs: dict[str, float] = {}
        for model, usage in self._usage.by_model().items():
            price = self._price_for(model)
            if price is not None:
                costs[model] = price.cost(usage)
        return costs

    def total(self) -> float:
        return sum(self.by_model().values())

    def unpriced(self) -> tuple[str, ...]:
        return tuple(m for m in self._usage.by_model() if self._price_for(m) is None)

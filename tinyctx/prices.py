"""Model prices: the built-in table, a price by name, and price tables from TOML files."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from attrs import frozen

from .config import integer, number
from .errors import ConfigError
from .frozen import FrozenDict

if TYPE_CHECKING:
    pass


__all__ = [
    "CACHING",
    "DEFAULT_PRICE",
    "PRICES",
    "Caching",
    "ModelPrice",
    "load_price_table",
    "parse_price",
    "price_for",
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

    Args:
        name: The model's name.
        input: Uncached input tokens, USD per million.
        output: Output tokens, USD per million.
        cache_write: Input tokens written to the cache, USD per million.
        cache_read: Input tokens read from the cache, USD per million.
        caching: ``"explicit"``, ``"automatic"`` or ``"none"``.
        min_cacheable: The shortest prefix the provider caches, in tokens.
        cache_granularity: The step a cached prefix is rounded down to, in tokens.
        window: The model's context window, in tokens.
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

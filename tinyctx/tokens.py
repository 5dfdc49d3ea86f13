"""Token accounting: count messages, tool schemas and the system prompt.

:class:`TokenCounter` is the protocol every layer uses. Two counters are built in, both
memoized per message object (:class:`MemoCounter`), so re-checking a long, growing history
costs a lookup per old message and real work only for the new ones:

- :class:`HeuristicCounter`, the fast default: characters per token for ASCII, UTF-8 bytes
  per token for everything else (so CJK and emoji are not undercounted), plus a small
  per-message overhead. The constants were fitted against a real byte-level BPE tokenizer
  on real agent transcripts and CJK text (``benchmarks/bench_tokens_budget.py`` reports
  the error).
- :class:`TokenizersCounter`, exact for a given ``tokenizers`` vocabulary, encoding every
  uncached message of a history in one batch.
- :class:`ShapeCounter`, an estimate by letters, digits, symbols and scripts fitted to
  Claude's tokenizer: within a few percent on English prose, code and tool calls, where
  characters per token over-count prose (``bench_tokens_budget.py`` measures both).

Where the package was built with a C compiler, a cold count's per-message loop runs in C
(``tinyctx._token_speedups``: the same counts; ``TINYCTX_NO_EXTENSIONS=1`` turns it off).

:func:`default_counter` picks by the model's family (:func:`counter_family`): the shape
counter fitted to Claude's tokenizer for Claude, the one fitted to OpenAI's cl100k_base
for GPT models, the heuristic for the rest.

:class:`Calibration` turns the provider's reported ``input_tokens`` into better estimates,
and :func:`context_window` knows the windows of common model families.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from . import _token_counters, _token_family, _token_memo, _token_shapes
from ._token_counters import (
    HeuristicCounter,
    TokenizersCounter,
)
from ._token_family import COUNTER_FAMILIES, counter_family, default_counter
from ._token_memo import (
    REASONING_TOKENS,
    MemoCounter,
    _non_negative_int,
    arguments_text,
    message_payload,
    reasoning_tokens,
)
from ._token_shapes import SHAPE_FITS, ShapeCounter, ShapeFit
from .config import fraction, integer, number, text
from .frozen import FrozenDict
from .messages import Message
from .model import ModelRequest
from .reexport import publish
from .tools import ToolSpec

publish(__name__, _token_counters, _token_family, _token_memo, _token_shapes)

__all__ = [
    "TokenCounter",
    "MemoCounter",
    "HeuristicCounter",
    "TokenizersCounter",
    "ShapeCounter",
    "ShapeFit",
    "SHAPE_FITS",
    "default_counter",
    "counter_family",
    "COUNTER_FAMILIES",
    "message_payload",
    "arguments_text",
    "REASONING_TOKENS",
    "reasoning_tokens",
    "Calibration",
    "MODEL_WINDOWS",
    "context_window",
    "normalize_model_name",
    "window_table",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Estimates how many tokens a prompt costs."""

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Message) -> int: ...

    def count_messages(self, messages: Sequence[Message]) -> int: ...

    def count_tools(self, tools: Sequence[ToolSpec]) -> int: ...

    def count_request(self, request: ModelRequest) -> int: ...


_MAX_RATIO = number(minimum=1, allowed="a finite number >= 1")


class Calibration:
    """Learns how a provider's reported ``input_tokens`` relate to a counter's estimate.

    The model is linear: ``reported ≈ ratio * estimate + hidden``. After each response,
    :meth:`observe` records the raw estimate of the request that was sent and the
    ``input_tokens`` the provider reported for it. :meth:`estimate` then answers
    ``last_reported + ratio * (raw - last_estimate)``: the last reported number plus the
    estimate of what was added (or removed) since, scaled by the learned ratio.

    The ratio is learned from the *differences* between consecutive observations, so a
    constant the counter cannot see (a provider-side system prompt, tool formatting)
    cancels out and stays in the anchor instead of inflating the ratio. It is the ratio of
    the summed differences (big changes weigh more than small ones), starting from a prior
    of 1.0 worth ``prior_tokens`` raw tokens; each sample is clamped to ``[min_ratio,
    max_ratio]`` before it counts, and so is the result, so no odd observation can blow it
    up. Differences smaller than ``min_delta`` raw tokens are too noisy and only move the
    anchor; a pair whose reported and estimated changes disagree in sign (the hidden part
    changed) teaches nothing either.

    Args:
        min_ratio: The lowest ratio a sample or the result may take, in (0, 1].
        max_ratio: The highest, a finite number >= 1.
        prior_tokens: How many raw tokens the prior ratio of 1.0 weighs.
        min_delta: Differences smaller than this many raw tokens only move the anchor.
    """

    __slots__ = (
        "_anchor_estimate",
        "_anchor_messages",
        "_anchor_reported",
        "_sum_estimate",
        "_sum_reported",
        "max_ratio",
        "min_delta",
        "min_ratio",
        "observations",
        "prior_tokens",
        "ratio",
    )

    ratio: float
    observations: int
    _sum_estimate: float
    _sum_reported: float
    _anchor_estimate: int | None
    _anchor_reported: int | None
    _anchor_messages: tuple[Message, ...] | None

    def __init__(
        self,
        *,
        min_ratio: float = 0.5,
        max_ratio: float = 2.0,
        prior_tokens: int = 500,
        min_delta: int = 32,
    ) -> None:
        fraction().check(min_ratio, "min_ratio", "Calibration")
        number(minimum=1, allowed="a finite number >= 1").check(
            max_ratio, "max_ratio", "Calibration"
        )
        _non_negative_int("Calibration", "prior_tokens", prior_tokens)
        _non_negative_int("Calibration", "min_delta", min_delta)
        self.min_ratio = float(min_ratio)
        self.max_ratio = float(max_ratio)
        self.prior_tokens = prior_tokens
        self.min_delta = min_delta
        self.reset()

    @property
    def anchored(self) -> bool:
        return self._anchor_reported is not None

    @property
    def hidden_tokens(self) -> int | None:
        """What the provider counts that the counter does not see (``reported - ratio *
        estimate`` at the anchor), or None before the first observation."""
        if self._anchor_reported is None or self._anchor_estimate is None:
            return None
        return round(self._anchor_reported - self.ratio * self._anchor_estimate)

    def observe(
        self, estimate: int, reported: int, messages: Sequence[Message] | None = None
    ) -> None:
        """Record one (raw estimate, reported input tokens) pair; ignores ``reported <= 0``.
        ``messages``: the history the provider reported on (see :meth:`estimate`)."""
        if reported <= 0 or estimate < 0:
            return
        self._anchor_messages = None if messages is None else tuple(messages)
        previous_estimate, previous_reported = self._anchor_estimate, self._anchor_reported
        if previous_estimate is not None and previous_reported is not None:
            delta = estimate - previous_estimate
            grew = reported - previous_reported
            if abs(delta) >= max(1, self.min_delta) and grew * delta > 0:
                sample = min(self.max_ratio, max(self.min_ratio, grew / delta))
                self._sum_estimate += abs(delta)
                self._sum_reported += sample * abs(delta)
                ratio = self._sum_reported / self._sum_estimate
                self.ratio = min(self.max_ratio, max(self.min_ratio, ratio))
        self._anchor_estimate = estimate
        self._anchor_reported = reported
        self.observations += 1

    def estimate(self, raw: int, messages: Sequence[Message] | None = None) -> int:
        """The calibrated estimate of a request whose raw count is ``raw``.

        With ``messages`` (the request's history) and an anchor observed with its own, the
        reported number is used only while it is not stale: when ``messages`` extend the
        history it was reported on (the same messages, then new ones), the estimate is
        that report plus the ratio times what was added; once the history was rewritten
        (a summary, a cleared result, a reloaded thread), the report is of a history that
        no longer is, so the estimate is ``raw`` scaled by the anchor's reported/raw
        (within the ratio bounds), never the old number moved by a large difference."""
        anchor, reported = self._anchor_estimate, self._anchor_reported
        if reported is None or anchor is None:
            return raw
        held = self._anchor_messages
        if messages is not None and held is not None and not _extends(messages, held):
            if anchor <= 0:
                return raw
            scale = min(self.max_ratio, max(self.min_ratio, reported / anchor))
            return max(0, round(raw * scale))
        return max(0, round(reported + self.ratio * (raw - anchor)))

    def raw_for(self, tokens: int) -> int:
        """How many raw (counter) tokens ``tokens`` calibrated tokens correspond to."""
        return math.ceil(tokens / self.ratio)

    def to_json(self) -> dict[str, Any]:
        """What it learned, as plain JSON (the bounds are configuration, not state)."""
        return {
            "ratio": self.ratio,
            "observations": self.observations,
            "sum_estimate": self._sum_estimate,
            "sum_reported": self._sum_reported,
            "anchor_estimate": self._anchor_estimate,
            "anchor_reported": self._anchor_reported,
        }

    def load_json(self, data: Mapping[str, Any]) -> Calibration:
        """Continue from what :meth:`to_json` dumped (ratio clamped to this one's bounds);
        returns self. A malformed document raises ValueError naming the key."""

        def number(key: str, *, optional: bool = False) -> Any:
            value = data.get(key)
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Calibration state: {key} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Calibration state: {key} must be finite and >= 0")
            return value

        ratio = float(number("ratio"))
        observations = int(number("observations"))
        sums = float(number("sum_estimate")), float(number("sum_reported"))
        anchor_estimate = number("anchor_estimate", optional=True)
        anchor_reported = number("anchor_reported", optional=True)
        self.ratio = min(self.max_ratio, max(self.min_ratio, ratio))
        self.observations = observations
        self._sum_estimate, self._sum_reported = sums
        self._anchor_estimate = None if anchor_estimate is None else int(anchor_estimate)
        self._anchor_reported = None if anchor_reported is None else int(anchor_reported)
        self._anchor_messages = None  # not durable: a reloaded history is new objects
        return self

    def reset(self) -> None:
        """Forget every observation (ratio back to 1.0)."""
        self.ratio = 1.0
        self.observations = 0
        self._sum_estimate = float(self.prior_tokens)
        self._sum_reported = float(self.prior_tokens)
        self._anchor_estimate = None
        self._anchor_reported = None
        self._anchor_messages = None

    def __repr__(self) -> str:
        return (
            f"<Calibration ratio={self.ratio:.3f} hidden={self.hidden_tokens} "
            f"observations={self.observations}>"
        )


def _extends(messages: Sequence[Message], held: tuple[Message, ...]) -> bool:
    """Whether ``messages`` start with the messages of ``held`` (the same, or equal: a
    history equal to the one reported on costs what was reported)."""
    k = len(held)
    if len(messages) < k:
        return False
    if k == 0:
        return True
    if messages[k - 1] is not held[-1] and messages[k - 1] != held[-1]:
        return False
    prefix = messages[:k] if type(messages) is tuple else tuple(messages[:k])
    return prefix == held  # C-level, identity first: about a nanosecond a message


# ---------------------------------------------------------------------------------------
# model -> context window

MODEL_WINDOWS: FrozenDict[str, int] = FrozenDict(
    {
        # OpenAI
        "gpt-5": 400_000,
        "gpt-5-chat": 128_000,
        "gpt-4.1": 1_047_576,
        "gpt-4.5": 128_000,
        "gpt-4o": 128_000,
        "chatgpt-4o": 128_000,
        "gpt-4-turbo": 128_000,
        "gpt-4-1106": 128_000,
        "gpt-4-0125": 128_000,
        "gpt-4-32k": 32_768,
        "gpt-4": 8_192,
        "gpt-3.5-turbo": 16_385,
        "gpt-oss": 131_072,
        "o1": 200_000,
        "o1-mini": 128_000,
        "o1-preview": 128_000,
        "o3": 200_000,
        "o3-mini": 200_000,
        "o4-mini": 200_000,
        # Anthropic
        "claude": 200_000,
        "claude-2": 100_000,
        "claude-instant": 100_000,
        # Google
        "gemini": 1_048_576,
        "gemini-pro": 32_760,
        "gemini-1.0": 32_760,
        "gemini-1.5-pro": 2_097_152,
        "gemini-1.5-flash": 1_048_576,
        "gemma-2": 8_192,
        "gemma-3": 131_072,
        # Meta
        "llama-2": 4_096,
        "llama-3": 8_192,
        "llama3": 8_192,
        "llama-3.1": 131_072,
        "llama3.1": 131_072,
        "llama-3.2": 131_072,
        "llama3.2": 131_072,
        "llama-3.3": 131_072,
        "llama3.3": 131_072,
        "llama-4": 1_048_576,
        "llama-4-scout": 10_485_760,
        # Mistral
        "mistral": 32_768,
        "mistral-large": 131_072,
        "mistral-medium": 131_072,
        "mistral-small": 131_072,
        "mistral-nemo": 131_072,
        "open-mistral-nemo": 131_072,
        "open-mistral-7b": 32_768,
        "ministral": 131_072,
        "mixtral-8x7b": 32_768,
        "open-mixtral-8x7b": 32_768,
        "mixtral-8x22b": 65_536,
        "open-mixtral-8x22b": 65_536,
        "codestral": 262_144,
        "devstral": 131_072,
        "magistral": 40_960,
        "pixtral": 131_072,
        # Qwen
        "qwen": 32_768,
        "qwen-plus": 131_072,
        "qwen-turbo": 1_000_000,
        "qwen-max": 32_768,
        "qwen2": 32_768,
        "qwen2.5": 131_072,
        "qwen2.5-coder": 131_072,
        "qwen3": 131_072,
        "qwen3-coder": 262_144,
        "qwq": 131_072,
        # DeepSeek
        "deepseek": 131_072,
    }
)
"""Advertised context windows (tokens) by model-name prefix; the longest prefix wins."""

# "openai/gpt-4o", "models/gemini-2.0-flash", "us.anthropic.claude-3-5-sonnet-...:0",
# "meta-llama/Meta-Llama-3.1-8B-Instruct", "accounts/fireworks/models/qwen3-...": the family
# name starts after the last "/" and after a cloud vendor's dotted prefix.
_VENDOR = re.compile(
    r"^(?:(?:us|eu|apac|global)\.)?(?:anthropic|meta|mistral|amazon|cohere|ai21|google|openai)\."
    r"|^meta-(?=llama)"
)


def normalize_model_name(model: str) -> str:
    """Lower-case ``model`` and strip provider routing (``openai/``, ``us.anthropic.``...)."""
    name = model.strip().lower()
    name = name.rsplit("/", 1)[-1]
    return _VENDOR.sub("", name)


@functools.lru_cache(maxsize=1024)
def _default_window(name: str) -> int | None:
    return _longest_prefix(name, MODEL_WINDOWS)


def _longest_prefix(name: str, table: Mapping[str, int]) -> int | None:
    best_len, best = -1, None
    for prefix, window in table.items():
        if name.startswith(prefix) and len(prefix) > best_len:
            best_len, best = len(prefix), window
    return best


def context_window(model: str | None, table: Mapping[str, int] | None = None) -> int | None:
    """The context window of ``model`` by longest matching prefix, or None when unknown.

    ``table`` entries (same prefix rules, after normalization) are consulted first and win
    over :data:`MODEL_WINDOWS`.
    """
    if not model:
        return None
    name = normalize_model_name(model)
    if table:
        found = _longest_prefix(name, {normalize_model_name(k): v for k, v in table.items()})
        if found is not None:
            return found
    return _default_window(name)


_PREFIX = text(allowed="model-name prefixes (non-empty strings)")
_WINDOW = integer(minimum=1, allowed="an integer > 0 (tokens)")


def window_table(
    value: Mapping[str, int] | Iterable[tuple[str, int]] | None, *, owner: str = ""
) -> FrozenDict[str, int]:
    """A validated, normalized window table (model-name prefix -> tokens > 0)."""
    table = dict(value or {})
    for key, window in table.items():
        _PREFIX.check(key, "windows", owner)
        _WINDOW.check(window, f"windows[{key!r}]", owner)
    return FrozenDict({normalize_model_name(k): v for k, v in table.items()})

"""The counter for a model: by its family, a counter fitted to that family's tokenizer
where one is, else the characters-per-token heuristic; each shared, built once."""

from __future__ import annotations

import functools
import re
from typing import Final

from ._token_counters import HeuristicCounter
from ._token_memo import MemoCounter
from ._token_shapes import ShapeCounter

__all__ = ["COUNTER_FAMILIES", "counter_family", "default_counter"]

COUNTER_FAMILIES: Final = ("claude", "gpt", "default")
"""The families :func:`counter_family` names: ``"claude"`` (Anthropic's models: the
:class:`~tinyctx.tokens.ShapeCounter` fitted to Claude's tokenizer), ``"gpt"`` (OpenAI's:
the shape counter fitted to cl100k_base, ``fit="cl100k"``) and ``"default"`` (every other
model, and no model: :class:`~tinyctx.tokens.HeuristicCounter`)."""

# "claude-...", "anthropic:claude-...", "us.anthropic.claude-...", "anthropic/claude-...",
# "bedrock/anthropic.claude-..." (no real tokenizer of another family ships offline)
_CLAUDE: Final = re.compile(r"(?:^|[/:.])claude", re.IGNORECASE)
# "gpt-4o", "openai:gpt-5", "openai/o3-mini", "o1", "chatgpt-4o-latest", "gpt-oss-120b"
_GPT: Final = re.compile(r"(?:^|[/:.])(?:gpt-|chatgpt-|o[1-9](?:-|$))", re.IGNORECASE)

_SHARED: dict[str, MemoCounter] = {}


@functools.lru_cache(maxsize=256)
def counter_family(model: str | None) -> str:
    """The counter family of ``model`` (one of :data:`COUNTER_FAMILIES`)."""
    name = model.strip() if model else ""
    if _CLAUDE.search(name):
        return "claude"
    if _GPT.search(name):
        return "gpt"
    return "default"


def _build(family: str) -> MemoCounter:
    if family == "claude":
        return ShapeCounter()
    if family == "gpt":
        return ShapeCounter(fit="cl100k")
    return HeuristicCounter()


def default_counter(model: str | None = None) -> MemoCounter:
    """The shared counter layers use when none is configured, for ``model``'s family:
    a Claude model gets the :class:`~tinyctx.tokens.ShapeCounter`, an OpenAI model the
    shape counter fitted to cl100k_base, any other (or none) the
    :class:`~tinyctx.tokens.HeuristicCounter`. The same object for the same family."""
    family = counter_family(model)
    counter = _SHARED.get(family)
    if counter is None:
        counter = _SHARED[family] = _build(family)
    return counter

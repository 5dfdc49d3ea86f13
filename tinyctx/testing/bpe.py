"""A small byte-level BPE tokenizer trained on the spot, for tests of token counting.

Tests of a ``tokenizers``-backed counter need a real vocabulary but no files and no
network: :func:`train_bpe` trains one in a few milliseconds. Byte-level, so any text
(CJK, emoji, code) encodes without unknown tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tokenizers

__all__ = ["SAMPLE_CORPUS", "train_bpe"]

SAMPLE_CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog. " * 4,
    "An agent keeps what it knows in a context window; old tool results are cleared first. " * 3,
    "def count(messages):\n    total = 0\n    for message in messages:\n"
    "        total += len(message)\n    return total\n" * 3,
    '{"role": "tool", "tool_call_id": "call_1", "content": "ok"}\n' * 3,
    "Python の開発は、1990 年ごろから開始されています。" * 2,
    "파이썬은 배우기 쉽고 강력한 프로그래밍 언어입니다. " * 2,
    "Python 是一种易于学习又功能强大的编程语言。" * 2,
)


def train_bpe(
    corpus: Iterable[str] = SAMPLE_CORPUS, *, vocab_size: int = 400
) -> tokenizers.Tokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``corpus`` (offline, fast)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer)
    return tokenizer

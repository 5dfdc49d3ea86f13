"""The two built-in counters: the fitted heuristic (the default) and exact tokenizers counts."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from .config import Check, integer, number, optional
from .errors import ConfigError
from .messages import AssistantMessage, Message, ToolCall, ToolResult, UserMessage
from .parts import content_text

if TYPE_CHECKING:
    import tokenizers

from ._token_memo import (
    _FOUR_SPACES,
    MemoCounter,
    _json_chars,
    arguments_text,
    reasoning_tokens,
)

_HANGUL = "\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f"
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA = "\u3040-\u30ff"
# byte tables for bytes.translate(None, delete): what is NOT a lead byte of a non-ASCII
# character, of a character U+1100..U+11FF / U+3000..U+D7FF / U+F000..U+FFFF (where every
# counted CJK character lies), of an astral character
_NOT_LEADS = bytes(range(0xC0))
_NOT_CJK_LEADS = bytes(b for b in range(256) if b not in (0xE1, *range(0xE3, 0xEE), 0xEF))
_NOT_ASTRAL_LEADS = bytes(b for b in range(256) if not 0xF0 <= b <= 0xF4)
# the message types whose ``content`` is their text (a str, or parts to join)
_BUILT_IN = frozenset((UserMessage, AssistantMessage, ToolResult))
_CJK_CLASSES = (re.compile(f"[{_HAN}]"), re.compile(f"[{_KANA}]"), re.compile(f"[{_HANGUL}]"))
# the exact types tinyctx._token_speedups counts (in its order): any other is Python's
_C_KINDS: Final = (UserMessage, AssistantMessage, ToolResult)

_measure_c: Callable[..., tuple[list[int], list[int]]] | None = None
if not os.environ.get("TINYCTX_NO_EXTENSIONS"):  # set: the Python loops count everything
    try:
        from ._token_speedups import measure as _c_measure
    except ImportError:  # pragma: no cover - built without a C compiler
        pass
    else:
        _measure_c = _c_measure
C_LOOP: Final = _measure_c is not None
"""Whether cold counts run the C loop (``tinyctx._token_speedups``): False where it was
not built, or with ``TINYCTX_NO_EXTENSIONS=1`` (the same counts, slower)."""


DEFAULT_SAMPLE_ABOVE: Final = 4096
"""``HeuristicCounter(sample_above=...)``: texts longer than this many characters are
measured on a sample."""

_SAMPLE_WINDOWS: Final = 8
_SAMPLE_WIDTH: Final = 256
_SAMPLE_CHARS: Final = _SAMPLE_WINDOWS * _SAMPLE_WIDTH


def _sample(text: str, n: int) -> str:
    """``_SAMPLE_WINDOWS`` windows of ``_SAMPLE_WIDTH`` characters spread evenly over
    ``text`` (``n`` characters, more than ``_SAMPLE_CHARS``), the first at its start and the
    last at its end, joined."""
    span = n - _SAMPLE_WIDTH
    last = _SAMPLE_WINDOWS - 1
    return "".join(
        [
            text[start : start + _SAMPLE_WIDTH]
            for start in (span * i // last for i in range(_SAMPLE_WINDOWS))
        ]
    )


def split_message(
    counter: MemoCounter, message: Message, base: int, whole: bool
) -> tuple[str, int, type[Message] | None]:
    """A message whose content is not a plain string, or of a type not built in: its text,
    ``base`` plus its media's tokens when ``whole``, and its kind (ToolResult,
    AssistantMessage or None) by what its type extends."""
    kind: type[Message] | None = type(message)
    if kind in _BUILT_IN:
        content = message.content  # type: ignore[attr-defined]
        return content_text(content), base + counter.count_media(content) if whole else base, kind
    content = getattr(message, "content", "")
    tokens = base + counter.count_media(content) if whole and type(content) is not str else base
    kind = (
        ToolResult
        if isinstance(message, ToolResult)
        else AssistantMessage
        if isinstance(message, AssistantMessage)
        else None
    )
    return message.text, tokens, kind


def measure_in_c(
    counter: Any,
    messages: Sequence[Message],
    rates: tuple[float, ...],
    one_token: bytes | None,
    arguments: Callable[[ToolCall], int],
) -> list[int] | None:
    """Whole counts of ``messages`` by the C loop (``rates``: the heuristic's six or the
    shape counter's twelve, in ``_token_speedups.c``'s order; ``one_token``: the shape
    counter's one-token characters as a bitmap), the messages it is not sure of counted
    by ``counter``'s Python loop (``_measure``); None without the C module.
    ``arguments``: a call's arguments' tokens, for those the C loop leaves to Python."""
    if _measure_c is None:
        return None
    if type(messages) is not tuple:
        messages = tuple(messages)
    limit = counter.sample_above
    counts, doubt = _measure_c(
        messages,
        _C_KINDS,
        one_token is not None,
        rates,
        one_token,
        counter.message_overhead,
        counter.tool_call_overhead,
        sys.maxsize if limit is None else limit,
        arguments,
    )
    if doubt:
        measured = counter._measure([messages[i] for i in doubt], whole=True)
        for index, count in zip(doubt, measured, strict=True):
            counts[index] = count
    return counts


def measure_parts(count: Callable[[str], int], messages: Sequence[Message]) -> list[int]:
    """The payload counts of ``messages`` part by part (text, a result's call id, each
    call's id, name and arguments) with ``count``: how a subclass that counts text its
    own way is measured."""
    counts: list[int] = []
    for message in messages:
        tokens = count(message.text)
        if isinstance(message, ToolResult):
            tokens += count(message.tool_call_id)
        elif isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                tokens += count(call.id) + count(call.name) + count(arguments_text(call))
        counts.append(tokens)
    return counts


_POSITIVE_RATE: Final[Check[float]] = number(above=0, allowed="a finite number > 0")
_NONNEGATIVE_RATE: Final[Check[float]] = number(minimum=0, allowed="a finite number >= 0")
_SAMPLE_ABOVE: Final[Check[int | None]] = optional(
    integer(minimum=_SAMPLE_CHARS),
    allowed=f"None or an integer number of characters >= {_SAMPLE_CHARS}",
)


def check_counter_settings(
    owner: str,
    *,
    positive: Mapping[str, object],
    nonnegative: Mapping[str, object],
    sample_above: object,
) -> None:
    """A heuristic counter's rates (finite numbers, > 0 or >= 0) and ``sample_above``,
    checked once for every counter: a ConfigError naming ``owner`` and the field."""
    for name, value in positive.items():
        _POSITIVE_RATE.check(value, name, owner)
    for name, value in nonnegative.items():
        _NONNEGATIVE_RATE.check(value, name, owner)
    _SAMPLE_ABOVE.check(sample_above, "sample_above", owner)


class HeuristicCounter(MemoCounter):
    """Fast estimate: ASCII at ``chars_per_token``, CJK per character, the rest by UTF-8 bytes.

    ASCII text costs ``(chars - 2 * four_space_runs) / chars_per_token`` (indentation
    merges into few tokens). A Han character costs ``han_tokens`` (1.35), a kana
    ``kana_tokens`` (0.8) and a Hangul syllable or jamo ``hangul_tokens`` (1.75); any other
    non-ASCII text costs its UTF-8 bytes divided by ``nonascii_bytes_per_token``, plus
    ``astral_extra`` per character outside the BMP (emoji). Defaults were fitted on real
    transcripts (code and prose) and CJK text against a byte-level BPE vocabulary; they err
    on the side of overcounting. A text longer than ``sample_above`` characters (4096;
    None: never) is measured on 8 evenly spaced windows of 256 characters and scaled to its
    length: on the real transcripts that moves a count by at most 0.3%, and the sample is
    fixed, so a text always counts the same. ASCII strings take a fast path: two C-level
    passes and no allocation, inlined for whole messages, so a cold count of a long history
    costs about what LangChain's ``count_tokens_approximately`` does, which takes the
    strings' lengths and reads none of their text (``benchmarks/bench_tokens_budget.py``
    compares them). Other ``options`` (overheads, ``max_memo``) are :class:`MemoCounter`'s.

    Args:
        chars_per_token: ASCII characters per token.
        nonascii_bytes_per_token: UTF-8 bytes per token of non-ASCII, non-CJK text.
        astral_extra: Tokens added per character outside the BMP (emoji).
        han_tokens: Tokens per Han character.
        kana_tokens: Tokens per kana.
        hangul_tokens: Tokens per Hangul syllable or jamo.
        sample_above: Texts longer than this many characters are measured on a fixed
            sample; None: never.
        options: :class:`MemoCounter`'s settings.
    """

    def __init__(
        self,
        *,
        chars_per_token: float = 3.1,
        nonascii_bytes_per_token: float = 2.3,
        astral_extra: float = 0.5,
        han_tokens: float = 1.35,
        kana_tokens: float = 0.8,
        hangul_tokens: float = 1.75,
        sample_above: int | None = DEFAULT_SAMPLE_ABOVE,
        **options: Any,
    ) -> None:
        check_counter_settings(
            "HeuristicCounter",
            positive={
                "chars_per_token": chars_per_token,
                "nonascii_bytes_per_token": nonascii_bytes_per_token,
            },
            nonnegative={
                "astral_extra": astral_extra,
                "han_tokens": han_tokens,
                "kana_tokens": kana_tokens,
                "hangul_tokens": hangul_tokens,
            },
            sample_above=sample_above,
        )
        super().__init__(**options)
        self.sample_above = sample_above
        self.chars_per_token = float(chars_per_token)
        self.nonascii_bytes_per_token = float(nonascii_bytes_per_token)
        self.astral_extra = float(astral_extra)
        self.han_tokens = float(han_tokens)
        self.kana_tokens = float(kana_tokens)
        self.hangul_tokens = float(hangul_tokens)

    def _message_counts(self, messages: Sequence[Message]) -> list[int]:
        if type(self).count_text is not HeuristicCounter.count_text:
            return super()._message_counts(messages)
        rates = (
            self.chars_per_token,
            self.nonascii_bytes_per_token,
            self.astral_extra,
            self.han_tokens,
            self.kana_tokens,
            self.hangul_tokens,
        )
        counts = measure_in_c(self, messages, rates, None, self._arguments_tokens)
        return self._measure(messages, whole=True) if counts is None else counts

    def _arguments_tokens(self, call: ToolCall) -> int:
        """A call's arguments: JSON (its ASCII size remembered on the mapping) or the raw
        invalid text."""
        part = call.invalid_arguments
        if part is None:
            chars = call.arguments._json_chars
            if chars is None:
                chars = _json_chars(call.arguments)
            # JSON text is never empty: chars >= 2
            return (
                math.ceil(chars / self.chars_per_token)
                if chars >= 0
                else self.count_text(arguments_text(call))
            )
        if part.isascii():
            return math.ceil((len(part) - 2 * part.count(_FOUR_SPACES)) / self.chars_per_token)
        return self.count_text(part)

    def _measure(self, messages: Sequence[Message], *, whole: bool = False) -> list[int]:
        # the payload's parts counted one by one (no joined copy of a large tool result),
        # with count_text's ASCII path inlined: this loop is a cold count's whole cost;
        # ``whole`` adds the overheads and media in the same pass (what _message_counts adds)
        if type(self).count_text is not HeuristicCounter.count_text:
            return self._measure_parts(messages)  # a subclass counts text its own way
        count = self.count_text
        per = self.chars_per_token
        ceil = math.ceil
        four = _FOUR_SPACES
        base = self.message_overhead if whole else 0
        per_call = self.tool_call_overhead if whole else 0
        exact_to = self.sample_above if self.sample_above is not None else math.inf
        arguments = self._arguments_tokens
        counts: list[int] = []
        append = counts.append
        # an ASCII string costs ceil((len - 2 * four-space runs) / per): 0 for "", and at
        # least 1 for any other (each run leaves 2 of its 4 characters)
        for message in messages:
            kind: type[Message] | None = type(message)
            if kind in _BUILT_IN and type(message.content) is str:  # type: ignore[attr-defined]
                text, tokens = message.content, base  # type: ignore[attr-defined]
            else:
                text, tokens, kind = split_message(self, message, base, whole)
            tokens += (
                ceil((len(text) - 2 * text.count(four)) / per)
                if text.isascii() and len(text) <= exact_to
                else count(text)
            )
            if kind is ToolResult:
                part = message.tool_call_id  # type: ignore[attr-defined]  # never empty
                if part.isascii():
                    tokens += ceil((len(part) - 2 * part.count(four)) / per)
                else:
                    tokens += count(part)
            elif kind is AssistantMessage:
                calls = message.tool_calls  # type: ignore[attr-defined]
                if calls:
                    tokens += per_call * len(calls)
                if message.metadata:
                    tokens += reasoning_tokens(message)
                for call in calls:
                    # id and name: short, never empty; the JSON arguments
                    part, name = call.id, call.name
                    if part.isascii() and name.isascii() and four not in part and four not in name:
                        tokens += ceil(len(part) / per) + ceil(len(name) / per)
                    else:
                        tokens += count(part) + count(name)
                    tokens += arguments(call)
            append(tokens)
        return counts

    def _measure_parts(self, messages: Sequence[Message]) -> list[int]:
        return measure_parts(self.count_text, messages)

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        n = len(text)
        limit = self.sample_above
        if limit is not None and n > limit:
            # a long text is measured on evenly spaced windows and scaled: what the
            # formula reads of it (indentation, the share of non-ASCII and CJK text) is
            # much the same along a long tool output, and reading all of it cost most of
            # a cold count
            sample = _sample(text, n)
            return max(1, math.ceil(self._estimate(sample) * n / len(sample)))
        return max(1, math.ceil(self._estimate(text)))

    def _estimate(self, text: str) -> float:
        """The formula's tokens for all of ``text``, not rounded."""
        n = len(text)
        if text.isascii():
            return (n - 2 * text.count(_FOUR_SPACES)) / self.chars_per_token
        # one UTF-8 encoding tells everything: each non-ASCII character has exactly one lead
        # byte (>= 0xC0), an astral one a 4-byte lead (0xF0-0xF4), and every CJK character
        # counted below a lead in _CJK_LEADS; the class scans run only when one is there
        data = text.encode("utf-8", "surrogatepass")
        leads = data.translate(None, _NOT_LEADS)
        ascii_chars = n - len(leads)
        # four ASCII spaces are the same four bytes in UTF-8, found faster in the bytes
        estimate = (ascii_chars - 2 * data.count(b"    ")) / self.chars_per_token
        bytes_left = len(data) - ascii_chars
        if leads.translate(None, _NOT_CJK_LEADS):
            han, kana, hangul = (len(pattern.findall(text)) for pattern in _CJK_CLASSES)
            bytes_left -= 3 * (han + kana + hangul)  # every one of them is 3 bytes in UTF-8
            estimate += (
                han * self.han_tokens + kana * self.kana_tokens + hangul * self.hangul_tokens
            )
        estimate += bytes_left / self.nonascii_bytes_per_token
        estimate += len(leads.translate(None, _NOT_ASTRAL_LEADS)) * self.astral_extra
        return estimate


class TokenizersCounter(MemoCounter):
    """Exact counts for one ``tokenizers`` vocabulary (plus the same per-message overhead).

    Every uncached message of a history is encoded in one ``encode_batch`` call. Build it
    from a :class:`tokenizers.Tokenizer`, a ``tokenizer.json`` file (:meth:`from_file`) or
    the Hugging Face hub (:meth:`from_pretrained`, needs the network). Padding and
    truncation configured on the tokenizer are switched off on a private copy, so a count
    is never capped or padded. ``options`` (overheads, ``max_memo``) are
    :class:`MemoCounter`'s.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        **options: Any,
    ) -> None:
        import tokenizers

        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise ConfigError(
                "tokenizer", tokenizer, "a tokenizers.Tokenizer", owner="TokenizersCounter"
            )
        if tokenizer.truncation is not None or tokenizer.padding is not None:
            tokenizer = tokenizers.Tokenizer.from_str(tokenizer.to_str())
            tokenizer.no_truncation()
            tokenizer.no_padding()
        super().__init__(**options)
        self.tokenizer = tokenizer

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> TokenizersCounter:
        """Load a ``tokenizer.json`` file (offline)."""
        import tokenizers

        return cls(tokenizers.Tokenizer.from_file(os.fspath(path)), **options)

    @classmethod
    def from_pretrained(
        cls,
        identifier: str,
        *,
        revision: str = "main",
        token: str | None = None,
        **options: Any,
    ) -> TokenizersCounter:
        """Load the tokenizer of a Hugging Face hub model (needs the network)."""
        return cls(_load_pretrained(identifier, revision=revision, token=token), **options)

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def count_texts(self, texts: Sequence[str]) -> list[int]:
        counts = [0] * len(texts)
        todo = [i for i, t in enumerate(texts) if t]
        if todo:
            encodings = self.tokenizer.encode_batch(
                [texts[i] for i in todo], add_special_tokens=False
            )
            for i, encoding in zip(todo, encodings, strict=True):
                counts[i] = len(encoding)
        return counts


def _load_pretrained(identifier: str, *, revision: str, token: str | None) -> tokenizers.Tokenizer:
    """The hub download behind :meth:`TokenizersCounter.from_pretrained` (tests replace it)."""
    import tokenizers

    return tokenizers.Tokenizer.from_pretrained(identifier, revision=revision, token=token)

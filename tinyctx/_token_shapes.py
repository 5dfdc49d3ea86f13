"""The shape counter: an estimate by letters, digits, symbols and scripts, fitted to a
real tokenizer (what :func:`~tinyctx.tokens.default_counter` gives the Claude family)."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs

from ._token_counters import (
    _BUILT_IN,
    _CJK_CLASSES,
    _NOT_ASTRAL_LEADS,
    _NOT_CJK_LEADS,
    _NOT_LEADS,
    DEFAULT_SAMPLE_ABOVE,
    _sample,
    check_counter_settings,
    measure_in_c,
    measure_parts,
    split_message,
)
from ._token_memo import (
    MemoCounter,
    _arguments_json,
    arguments_text,
    flat_orjson,
    reasoning_tokens,
)
from ._token_shapes_data import (
    CL100K_ONE_TOKEN_HAN,
    CL100K_ONE_TOKEN_HANGUL,
    ONE_TOKEN_HAN,
    ONE_TOKEN_HANGUL,
)
from .config import one_of
from .frozen import FrozenDict
from .messages import AssistantMessage, Message, ToolCall, ToolResult

__all__ = ["SHAPE_FITS", "ShapeCounter", "ShapeFit", "ascii_shape", "unpack_shape"]

# bytes.translate(None, delete) tables over ASCII text: deleting them leaves its symbols
# (what is not a letter, a digit, a space, a newline) or its digits
_NOT_SYMBOLS: Final = bytes(b for b in range(256) if b >= 0x80 or chr(b).isalnum() or b in b" \n")
_NOT_DIGITS: Final = bytes(b for b in range(256) if not 0x30 <= b <= 0x39)
_FIELD: Final = 32
_MASK: Final = (1 << _FIELD) - 1


def ascii_shape(data: bytes, spaces: int = 0) -> int:
    """What the heuristic reads of ASCII text ``data`` (plus ``spaces`` spaces not in it),
    packed in one int: its length, digits, symbols, newlines and spaces, 32 bits each
    (:func:`unpack_shape` reads them)."""
    digits = len(data.translate(None, _NOT_DIGITS))
    symbols = len(data.translate(None, _NOT_SYMBOLS))
    return (
        (len(data) + spaces)
        | digits << _FIELD
        | symbols << (2 * _FIELD)
        | data.count(b"\n") << (3 * _FIELD)
        | (data.count(b" ") + spaces) << (4 * _FIELD)
    )


def unpack_shape(shape: int) -> tuple[int, int, int, int, int]:
    """``(length, digits, symbols, newlines, spaces)`` of a shape :func:`ascii_shape`
    packed."""
    return (
        shape & _MASK,
        shape >> _FIELD & _MASK,
        shape >> (2 * _FIELD) & _MASK,
        shape >> (3 * _FIELD) & _MASK,
        shape >> (4 * _FIELD),
    )


def json_shape(arguments: FrozenDict[str, Any]) -> int:
    """The :func:`ascii_shape` of ``arguments``' JSON text, or -1 when it is not ASCII
    (the message memo remembers the count, so it is measured once per message)."""
    data = arguments._data
    shape: int | None = None
    if not data:
        shape = ascii_shape(b"{}")
    else:
        text = flat_orjson(data)  # what the stdlib writes, less a space per ',' and ':'
        if text is not None:
            shape = ascii_shape(text, 2 * len(data) - 1) if text.isascii() else -1
    if shape is None:  # nested values, floats: measure the encoded text
        encoded = _arguments_json(arguments)
        shape = ascii_shape(encoded.encode()) if encoded.isascii() else -1
    return shape


_RATE_NAMES: Final = (
    "letter_tokens",
    "digit_tokens",
    "symbol_tokens",
    "space_tokens",
    "nonascii_byte_tokens",
    "common_cjk_tokens",
    "han_tokens",
    "kana_tokens",
    "hangul_tokens",
    "astral_extra",
    "text_tokens",
)


@attrs.frozen
class ShapeFit:
    """The rates fitted to one vocabulary (in :data:`_RATE_NAMES`' order) and the Han and
    Hangul characters it holds as one token."""

    rates: tuple[float, ...]
    one_token_han: str
    one_token_hangul: str


SHAPE_FITS: Final[FrozenDict[str, ShapeFit]] = FrozenDict(
    {
        "claude-legacy": ShapeFit(
            (0.285, 0.906, 0.634, 0.0, 0.344, 0.738, 2.643, 0.91, 2.643, 1.6, 0.118),
            ONE_TOKEN_HAN,
            ONE_TOKEN_HANGUL,
        ),
        "cl100k": ShapeFit(
            (0.251, 0.972, 0.485, 0.048, 0.509, 0.471, 2.963, 0.757, 2.763, 0.67, 2.106),
            CL100K_ONE_TOKEN_HAN,
            CL100K_ONE_TOKEN_HANGUL,
        ),
    }
)
"""The shape counter's fits, by vocabulary: ``"claude-legacy"`` (Claude's tokenizer, what
the Claude family gets) and ``"cl100k"`` (OpenAI's cl100k_base, what the GPT family
gets). Each was fitted by weighted least squares (each text's relative error counts
alike, no rate below zero) against its real vocabulary on three of the six real
transcripts (marot cc-subagent, mini-swe-agent astroid, OpenHands) and the CJK samples'
lines of even index; ``bench_tokens_budget.py`` reports the error on the others, and
``benchmarks/fit_token_shapes.py`` repeats the fit. The CJK rates were fitted on those
lines with the others held at their values: one rate for the Han and Hangul characters
the vocabulary holds as one token (``_token_shapes_data``), one for kana, and one each
for the other Han and Hangul characters (their UTF-8 bytes split into two or three
tokens; claude-legacy's share one). ``astral_extra`` is set so an emoji costs what that
vocabulary spends on one (3 tokens in claude-legacy, 2.7 in cl100k; no transcript has
enough of them to fit it). ``space_tokens`` fits to 0 for claude-legacy (a space merges
into the next word) and to 0.048 for cl100k."""

_FIT = one_of(tuple(SHAPE_FITS), allowed=f"one of {tuple(SHAPE_FITS)}")


@functools.cache
def one_token_bits(fit: ShapeFit) -> bytes:
    """A bit per BMP code point, set for the characters ``fit``'s vocabulary holds as one
    token (what the C counting loop reads)."""
    bits = bytearray(0x10000 // 8)
    for char in fit.one_token_han + fit.one_token_hangul:
        code = ord(char)
        bits[code >> 3] |= 1 << (code & 7)
    return bytes(bits)


class ShapeCounter(MemoCounter):
    """An estimate by what a byte-level BPE vocabulary makes of each kind of character.

    ``fit`` names the vocabulary its defaults were fitted to (:data:`SHAPE_FITS`):
    ``"claude-legacy"`` (Claude's tokenizer, the default: what :func:`default_counter`
    gives the Claude family) or ``"cl100k"`` (OpenAI's cl100k_base: the GPT family's).
    Either counts English prose, code and tool calls within a few percent of its
    vocabulary, where :class:`HeuristicCounter` (characters per token) is 15-20% off per
    text.

    ASCII letters cost ``letter_tokens`` each (0.285: a word and the space before it are
    one token), digits ``digit_tokens`` (0.906: ids and numbers split), other ASCII
    symbols ``symbol_tokens`` (0.634: punctuation and operators rarely merge), newlines
    nothing and spaces ``space_tokens`` (0: they merge into the next token); a Han
    character or Hangul syllable
    the vocabulary holds as one token (the common ones) costs ``common_cjk_tokens``, any
    other Han character ``han_tokens`` and Hangul syllable or jamo ``hangul_tokens`` (their
    bytes split in two or three), a kana ``kana_tokens``; any other non-ASCII text
    ``nonascii_byte_tokens`` per UTF-8 byte, plus ``astral_extra`` per character outside
    the BMP (emoji); and each text ``text_tokens``. No text counts less than one token
    per ``max_chars_per_token`` (6) characters, so whitespace runs and blank lines are not
    undercounted much. The defaults (the numbers above are claude-legacy's) were fitted
    against a real tokenizer on real transcripts and CJK texts (see :data:`SHAPE_FITS`).

    A text longer than ``sample_above`` characters (4096; None: never) is measured on 8
    evenly spaced windows of 256 characters and scaled to its length: on the real
    transcripts that moves a count by at most 1%, and the sample is fixed, so a text
    always counts the same. ASCII strings take a fast path of C-level passes (two
    ``bytes.translate``, two counts), inlined for whole messages, so a cold count of a
    long history costs about what LangChain's ``count_tokens_approximately`` does
    (``benchmarks/bench_tokens_budget.py`` compares them). Other ``options`` (overheads,
    ``max_memo``) are :class:`MemoCounter`'s.

    Args:
        fit: The vocabulary the defaults (rates and one-token characters) come from.
        letter_tokens: Tokens per ASCII letter.
        digit_tokens: Tokens per ASCII digit.
        symbol_tokens: Tokens per other ASCII character but a space or a newline.
        space_tokens: Tokens per ASCII space.
        nonascii_byte_tokens: Tokens per UTF-8 byte of non-ASCII, non-CJK text.
        common_cjk_tokens: Tokens per Han character or Hangul syllable that the vocabulary
            holds as one token.
        han_tokens: Tokens per other Han character.
        kana_tokens: Tokens per kana.
        hangul_tokens: Tokens per other Hangul syllable or jamo.
        astral_extra: Tokens added per character outside the BMP (emoji).
        text_tokens: Tokens added per text.
        max_chars_per_token: The floor: at least one token per this many characters.
        sample_above: Texts longer than this many characters are measured on a fixed
            sample; None: never.
        options: :class:`MemoCounter`'s settings.
    """

    letter_tokens: float
    digit_tokens: float
    symbol_tokens: float
    space_tokens: float
    nonascii_byte_tokens: float
    common_cjk_tokens: float
    han_tokens: float
    kana_tokens: float
    hangul_tokens: float
    astral_extra: float
    text_tokens: float

    def __init__(
        self,
        *,
        fit: str = "claude-legacy",
        max_chars_per_token: float = 6.0,
        sample_above: int | None = DEFAULT_SAMPLE_ABOVE,
        **options: Any,
    ) -> None:
        fitted = SHAPE_FITS[_FIT.check(fit, "fit", "ShapeCounter")]
        rates = {
            name: options.pop(name, default)
            for name, default in zip(_RATE_NAMES, fitted.rates, strict=True)
        }
        check_counter_settings(
            "ShapeCounter",
            positive={"max_chars_per_token": max_chars_per_token},
            nonnegative=rates,
            sample_above=sample_above,
        )
        super().__init__(**options)
        self._names: dict[str, int] = {}  # tool name -> its count
        self.sample_above = sample_above
        self.max_chars_per_token = float(max_chars_per_token)
        self.fit = fit
        for name, value in rates.items():
            setattr(self, name, float(value))
        self._one_token_han = re.compile(f"[{fitted.one_token_han}]")
        self._one_token_hangul = re.compile(f"[{fitted.one_token_hangul}]")
        self._one_token_bits = one_token_bits(fitted)

    def _message_counts(self, messages: Sequence[Message]) -> list[int]:
        if type(self).count_text is not ShapeCounter.count_text:
            return super()._message_counts(messages)
        rates = (
            self.letter_tokens,
            self.digit_tokens,
            self.symbol_tokens,
            self.space_tokens,
            self.text_tokens,
            self.max_chars_per_token,
            self.nonascii_byte_tokens,
            self.common_cjk_tokens,
            self.han_tokens,
            self.kana_tokens,
            self.hangul_tokens,
            self.astral_extra,
        )
        counts = measure_in_c(self, messages, rates, self._one_token_bits, self._arguments_tokens)
        return self._measure(messages, whole=True) if counts is None else counts

    def _arguments_tokens(self, call: ToolCall) -> int:
        """A call's arguments: their JSON text's shape without the encoder, or the raw
        invalid text."""
        part = call.invalid_arguments
        if part is not None:
            return self.count_text(part)
        shape = json_shape(call.arguments)
        return self._shape_tokens(shape) if shape >= 0 else self.count_text(arguments_text(call))

    def _shape_tokens(self, shape: int) -> int:
        """The count of ASCII text of a packed :func:`ascii_shape` (never 0 for a
        non-empty text)."""
        n, digits, symbols, newlines, spaces = unpack_shape(shape)
        if not n:
            return 0
        estimate = (
            self.letter_tokens * (n - digits - symbols - newlines - spaces)
            + self.digit_tokens * digits
            + self.symbol_tokens * symbols
            + self.space_tokens * spaces
            + self.text_tokens
        )
        return max(1, math.ceil(max(estimate, n / self.max_chars_per_token)))

    def _short_counter(self) -> Callable[[str], int]:
        """count_text for an id or a tool name: its ASCII formula without the dispatch."""
        count, ceil = self.count_text, math.ceil
        letter, digit, symbol = self.letter_tokens, self.digit_tokens, self.symbol_tokens
        space, per_text, chars_per = self.space_tokens, self.text_tokens, self.max_chars_per_token
        not_digits, not_symbols = _NOT_DIGITS, _NOT_SYMBOLS

        def short(part: str) -> int:
            if not part.isascii():
                return count(part)
            data = part.encode()
            digits = len(data.translate(None, not_digits))
            symbols = len(data.translate(None, not_symbols))
            spaces = data.count(b" ")
            letters = len(part) - digits - symbols - spaces - data.count(b"\n")
            estimate = (
                letter * letters + digit * digits + symbol * symbols + space * spaces + per_text
            )
            return ceil(max(estimate, len(part) / chars_per)) if part else 0

        return short

    def _measure(self, messages: Sequence[Message], *, whole: bool = False) -> list[int]:
        # the payload's parts counted one by one (no joined copy of a large tool result),
        # with count_text's ASCII path inlined: this loop is a cold count's whole cost;
        # ``whole`` adds the overheads and media in the same pass (what _message_counts adds)
        if type(self).count_text is not ShapeCounter.count_text:
            return self._measure_parts(messages)  # a subclass counts text its own way
        count = self.count_text
        ceil = math.ceil
        letter, digit, symbol = self.letter_tokens, self.digit_tokens, self.symbol_tokens
        space, per_text, chars_per = self.space_tokens, self.text_tokens, self.max_chars_per_token
        not_digits, not_symbols = _NOT_DIGITS, _NOT_SYMBOLS
        arguments = self._arguments_tokens
        base = self.message_overhead if whole else 0
        per_call = self.tool_call_overhead if whole else 0
        exact_to = self.sample_above if self.sample_above is not None else math.inf
        names = self._names
        short = self._short_counter()
        counts: list[int] = []
        append = counts.append
        for message in messages:
            kind: type[Message] | None = type(message)
            if kind in _BUILT_IN and type(message.content) is str:  # type: ignore[attr-defined]
                text, tokens = message.content, base  # type: ignore[attr-defined]
            else:
                text, tokens, kind = split_message(self, message, base, whole)
            n = len(text)
            if n and n <= exact_to and text.isascii():
                # the formula of _shape_tokens, inlined (two translates, two counts)
                data = text.encode()
                digits = len(data.translate(None, not_digits))
                symbols = len(data.translate(None, not_symbols))
                spaces = text.count(" ")
                letters = n - digits - symbols - spaces - text.count("\n")
                estimate = (
                    letter * letters + digit * digits + symbol * symbols + space * spaces + per_text
                )
                tokens += ceil(max(estimate, n / chars_per))
            elif n:
                tokens += count(text)
            if kind is ToolResult:
                tokens += short(message.tool_call_id)  # type: ignore[attr-defined]
            elif kind is AssistantMessage:
                calls = message.tool_calls  # type: ignore[attr-defined]
                if calls:
                    tokens += per_call * len(calls)
                if message.metadata:
                    tokens += reasoning_tokens(message)
                for call in calls:
                    name = names.get(call.name)  # a few names, called again and again
                    if name is None:
                        name = short(call.name)
                        if len(names) < 1024:
                            names[call.name] = name
                    tokens += short(call.id) + name + arguments(call)
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
            # formula reads of it (the share of letters, digits, symbols, non-ASCII and
            # CJK text) is much the same along a long tool output, and reading all of
            # it cost most of a cold count
            sample = _sample(text, n)
            estimate = self._estimate(sample) * n / len(sample)
        else:
            estimate = self._estimate(text)
        return max(1, math.ceil(max(estimate, n / self.max_chars_per_token)))

    def _estimate(self, text: str) -> float:
        """The formula's tokens for all of ``text``, not rounded (without the floor)."""
        if text.isascii():
            data = text.encode()
            n = len(data)
            non_ascii = 0.0
        else:
            # one UTF-8 encoding tells everything: each non-ASCII character has exactly
            # one lead byte (>= 0xC0), an astral one a 4-byte lead (0xF0-0xF4), and every
            # CJK character counted below a lead in _NOT_CJK_LEADS' complement; the class
            # scans run only when one is there
            data = text.encode("utf-8", "surrogatepass")
            leads = data.translate(None, _NOT_LEADS)
            n = len(text) - len(leads)  # the ASCII characters
            bytes_left = len(data) - n
            non_ascii = 0.0
            if leads.translate(None, _NOT_CJK_LEADS):
                han, kana, hangul = (len(pattern.findall(text)) for pattern in _CJK_CLASSES)
                bytes_left -= 3 * (han + kana + hangul)  # each is 3 bytes in UTF-8
                # the common Han and Hangul characters are one token each, the others
                # split into two or three: telling them apart is most of the accuracy
                common_han = len(self._one_token_han.findall(text)) if han else 0
                common_hangul = len(self._one_token_hangul.findall(text)) if hangul else 0
                non_ascii = (
                    (common_han + common_hangul) * self.common_cjk_tokens
                    + (han - common_han) * self.han_tokens
                    + kana * self.kana_tokens
                    + (hangul - common_hangul) * self.hangul_tokens
                )
            non_ascii += bytes_left * self.nonascii_byte_tokens
            non_ascii += len(leads.translate(None, _NOT_ASTRAL_LEADS)) * self.astral_extra
        # _NOT_DIGITS and _NOT_SYMBOLS delete every non-ASCII byte too
        digits = len(data.translate(None, _NOT_DIGITS))
        symbols = len(data.translate(None, _NOT_SYMBOLS))
        spaces = data.count(b" ")
        letters = n - digits - symbols - spaces - data.count(b"\n")
        return (
            self.letter_tokens * letters
            + self.digit_tokens * digits
            + self.symbol_tokens * symbols
            + self.space_tokens * spaces
            + non_ascii
            + self.text_tokens
        )

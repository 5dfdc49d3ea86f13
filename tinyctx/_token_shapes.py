"""The shape counter: an estimate by letters, digits, symbols and scripts, fitted to a
real tokenizer (what :func:`~tinyctx.tokens.default_counter` gives the Claude family)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from ._token_counters import (
    _BUILT_IN,
    _CJK_CLASSES,
    _NOT_ASTRAL_LEADS,
    _NOT_CJK_LEADS,
    _NOT_LEADS,
    DEFAULT_SAMPLE_ABOVE,
    _sample,
    check_counter_settings,
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
from ._token_shapes_data import ONE_TOKEN_HAN, ONE_TOKEN_HANGUL
from .frozen import FrozenDict
from .messages import AssistantMessage, Message, ToolResult

__all__ = ["ShapeCounter", "ascii_shape", "unpack_shape"]

# bytes.translate(None, delete) tables over ASCII text: deleting them leaves its symbols
# (what is not a letter, a digit, a space, a newline) or its digits
_NOT_SYMBOLS: Final = bytes(b for b in range(256) if b >= 0x80 or chr(b).isalnum() or b in b" \n")
_NOT_DIGITS: Final = bytes(b for b in range(256) if not 0x30 <= b <= 0x39)
_ONE_TOKEN_HAN: Final = re.compile(f"[{ONE_TOKEN_HAN}]")
_ONE_TOKEN_HANGUL: Final = re.compile(f"[{ONE_TOKEN_HANGUL}]")
_FIELD: Final = 32
_MASK: Final = (1 << _FIELD) - 1


def ascii_shape(data: bytes, spaces: int = 0) -> int:
    """What the heuristic reads of ASCII text ``data`` (plus ``spaces`` spaces not in it),
    packed in one int: its length, digits, symbols and blanks (spaces and newlines), 32
    bits each (:func:`unpack_shape` reads them)."""
    digits = len(data.translate(None, _NOT_DIGITS))
    symbols = len(data.translate(None, _NOT_SYMBOLS))
    blanks = data.count(b" ") + data.count(b"\n") + spaces
    return (
        (len(data) + spaces) | digits << _FIELD | symbols << (2 * _FIELD) | blanks << (3 * _FIELD)
    )


def unpack_shape(shape: int) -> tuple[int, int, int, int]:
    """``(length, digits, symbols, blanks)`` of a shape :func:`ascii_shape` packed."""
    return (
        shape & _MASK,
        shape >> _FIELD & _MASK,
        shape >> (2 * _FIELD) & _MASK,
        shape >> (3 * _FIELD),
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


_RATES: Final = (
    ("letter_tokens", 0.285),
    ("digit_tokens", 0.906),
    ("symbol_tokens", 0.634),
    ("nonascii_byte_tokens", 0.344),
    ("common_cjk_tokens", 0.738),
    ("han_tokens", 2.643),
    ("kana_tokens", 0.91),
    ("hangul_tokens", 2.643),
    ("astral_extra", 1.6),
    ("text_tokens", 0.118),
)
"""The heuristic's rates and their defaults, fitted by weighted least squares (each text's
relative error counts alike, no rate below zero) against the claude-legacy BPE vocabulary
on three of the six real transcripts (marot cc-subagent, mini-swe-agent astroid,
OpenHands) and the CJK samples' lines of even index (``bench_tokens_budget.py`` reports
the error on the others). The CJK rates were fitted on those lines with the others held
at their values: one rate for the Han and Hangul characters the vocabulary holds as one
token (``_token_shapes_data``), one for kana, and one, shared by Han and Hangul, for the
rest (their UTF-8 bytes split into two or three tokens). ``astral_extra`` is set so an
emoji costs the 3 tokens that vocabulary spends on one (no transcript has enough of them
to fit it)."""


class ShapeCounter(MemoCounter):
    """An estimate by what a byte-level BPE vocabulary makes of each kind of character.

    Fitted against Claude's tokenizer, it is what :func:`default_counter` gives the Claude
    family; it counts English prose, code and tool calls within a few percent of that
    vocabulary where :class:`HeuristicCounter` (characters per token) over-counts prose.

    ASCII letters cost ``letter_tokens`` each (0.285: a word and the space before it are
    one token), digits ``digit_tokens`` (0.906: ids and numbers split), other ASCII
    symbols ``symbol_tokens`` (0.634: punctuation and operators rarely merge), spaces and
    newlines nothing (they merge into the next token); a Han character or Hangul syllable
    the vocabulary holds as one token (the common ones) costs ``common_cjk_tokens``, any
    other Han character ``han_tokens`` and Hangul syllable or jamo ``hangul_tokens`` (their
    bytes split in two or three), a kana ``kana_tokens``; any other non-ASCII text
    ``nonascii_byte_tokens`` per UTF-8 byte, plus ``astral_extra`` per character outside
    the BMP (emoji); and each text ``text_tokens``. No text counts less than one token
    per ``max_chars_per_token`` (6) characters, so whitespace runs and blank lines are not
    undercounted much. The defaults were fitted against a real tokenizer on real
    transcripts and CJK texts (see ``_RATES``).

    A text longer than ``sample_above`` characters (4096; None: never) is measured on 8
    evenly spaced windows of 256 characters and scaled to its length: on the real
    transcripts that moves a count by at most 1%, and the sample is fixed, so a text
    always counts the same. ASCII strings take a fast path of C-level passes (two
    ``bytes.translate``, two counts), inlined for whole messages, so a cold count of a
    long history costs about what LangChain's ``count_tokens_approximately`` does
    (``benchmarks/bench_tokens_budget.py`` compares them). Other ``options`` (overheads,
    ``max_memo``) are :class:`MemoCounter`'s.

    Args:
        letter_tokens: Tokens per ASCII letter.
        digit_tokens: Tokens per ASCII digit.
        symbol_tokens: Tokens per other ASCII character but a space or a newline.
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
        max_chars_per_token: float = 6.0,
        sample_above: int | None = DEFAULT_SAMPLE_ABOVE,
        **options: Any,
    ) -> None:
        rates = {name: options.pop(name, default) for name, default in _RATES}
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
        for name, value in rates.items():
            setattr(self, name, float(value))

    def _message_counts(self, messages: Sequence[Message]) -> list[int]:
        if type(self).count_text is not ShapeCounter.count_text:
            return super()._message_counts(messages)
        return self._measure(messages, whole=True)

    def _shape_tokens(self, shape: int) -> int:
        """The count of ASCII text of a packed :func:`ascii_shape` (never 0 for a
        non-empty text)."""
        n, digits, symbols, blanks = unpack_shape(shape)
        if not n:
            return 0
        estimate = (
            self.letter_tokens * (n - digits - symbols - blanks)
            + self.digit_tokens * digits
            + self.symbol_tokens * symbols
            + self.text_tokens
        )
        return max(1, math.ceil(max(estimate, n / self.max_chars_per_token)))

    def _short_counter(self) -> Callable[[str], int]:
        """count_text for an id or a tool name: its ASCII formula without the dispatch."""
        count, ceil = self.count_text, math.ceil
        letter, digit, symbol = self.letter_tokens, self.digit_tokens, self.symbol_tokens
        per_text, chars_per = self.text_tokens, self.max_chars_per_token
        not_digits, not_symbols = _NOT_DIGITS, _NOT_SYMBOLS

        def short(part: str) -> int:
            if not part.isascii():
                return count(part)
            data = part.encode()
            digits = len(data.translate(None, not_digits))
            symbols = len(data.translate(None, not_symbols))
            letters = len(part) - digits - symbols - data.count(b" ") - data.count(b"\n")
            estimate = letter * letters + digit * digits + symbol * symbols + per_text
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
        per_text, chars_per = self.text_tokens, self.max_chars_per_token
        not_digits, not_symbols = _NOT_DIGITS, _NOT_SYMBOLS
        shape_tokens = self._shape_tokens
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
                letters = n - digits - symbols - text.count(" ") - text.count("\n")
                estimate = letter * letters + digit * digits + symbol * symbols + per_text
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
                    tokens += short(call.id) + name
                    part = call.invalid_arguments
                    if part is None:  # JSON arguments: their shape, without the encoder
                        shape = json_shape(call.arguments)
                        tokens += shape_tokens(shape) if shape >= 0 else count(arguments_text(call))
                    else:
                        tokens += count(part)
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
                common_han = len(_ONE_TOKEN_HAN.findall(text)) if han else 0
                common_hangul = len(_ONE_TOKEN_HANGUL.findall(text)) if hangul else 0
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
        letters = n - digits - symbols - data.count(b" ") - data.count(b"\n")
        return (
            self.letter_tokens * letters
            + self.digit_tokens * digits
            + self.symbol_tokens * symbols
            + non_ascii
            + self.text_tokens
        )

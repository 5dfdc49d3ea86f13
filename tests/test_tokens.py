"""Token accounting: heuristic and tokenizers-backed counters, memoization, calibration,
the model -> context-window table."""

from __future__ import annotations

import gc
import math
import re
import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinyctx._token_counters as token_counters
import tinyctx.tokens as tokens_module
from tinyctx import (
    AssistantMessage,
    ConfigError,
    ImagePart,
    Message,
    ModelRequest,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.testing import strategies
from tinyctx.testing.bpe import train_bpe
from tinyctx.testing.images import image_part
from tinyctx.testing.transcripts import load_openai_jsonl, messages_from_openai
from tinyctx.tokens import (
    MODEL_WINDOWS,
    Calibration,
    HeuristicCounter,
    TokenCounter,
    TokenizersCounter,
    context_window,
    default_counter,
    message_payload,
    normalize_model_name,
    window_table,
)
from tinyctx.tools import ToolSpec


class SpyCounter(HeuristicCounter):
    """Records every string it really measures (memo misses)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.measured: list[str] = []

    def count_text(self, text: str) -> int:
        self.measured.append(text)
        return super().count_text(text)


class TestHeuristicCounter:
    """Characters per token for ASCII, UTF-8 bytes for the rest; every part of a request."""

    def test_ascii_text_costs_chars_per_token(self) -> None:
        counter = HeuristicCounter(chars_per_token=4.0)
        assert isinstance(counter, TokenCounter)
        assert counter.count_text("") == 0
        assert counter.count_text("a") == 1
        assert counter.count_text("abcd" * 100) == 100
        # indentation merges into few tokens: a four-space run costs two characters
        assert counter.count_text("    " * 10) == 5

    def test_cjk_and_emoji_are_not_undercounted(self) -> None:
        counter = HeuristicCounter()
        chinese = "编程语言易于学习功能强大" * 10
        japanese = "日本語の文章です" * 10
        korean = "프로그래밍언어입니다" * 10
        emoji = "😀🎉👍" * 10
        # a real byte-level BPE spends about 1.2-1.4 tokens per Han character, 0.8 per kana,
        # 1.75 per Hangul syllable and 2-3 per emoji; ASCII-style counting would give 0.3
        assert counter.count_text(chinese) >= 1.3 * len(chinese)
        assert counter.count_text(japanese) >= 1.1 * len(japanese)
        assert counter.count_text(korean) >= 1.7 * len(korean)
        assert counter.count_text(emoji) >= 2.0 * len(emoji)
        assert counter.count_text("naïve café") < counter.count_text("日本語の文章です。")

    def test_counts_every_part_of_a_request(self) -> None:
        counter = HeuristicCounter()
        bare = ModelRequest(messages=(UserMessage("hello"),))
        full = bare.evolve(
            system_prompt="You are helpful. " * 20,
            tools=(ToolSpec("search", "Search the web", {"type": "object"}),),
        )
        assert counter.count_request(full) > counter.count_request(bare) > 0
        with_call = AssistantMessage("", (ToolCall("c1", "search", {"q": "x" * 400}),))
        assert counter.count_message(with_call) > counter.count_message(AssistantMessage("")) + 100
        assert counter.count_message(ToolResult("c1", "r" * 40)) >= 10

    def test_payload_names_calls_arguments_and_result_ids(self) -> None:
        call = ToolCall("call_7", "search", {"q": "tinyctx"})
        assert message_payload(AssistantMessage("let me look", (call,))) == (
            'let me look\ncall_7 search {"q": "tinyctx"}'
        )
        broken = ToolCall("call_8", "run", invalid_arguments="{not json")
        assert message_payload(AssistantMessage("", (broken,))) == "call_8 run {not json"
        assert message_payload(ToolResult("call_7", "found")) == "call_7\nfound"
        assert message_payload(UserMessage("hi")) == "hi"

    @pytest.mark.parametrize(
        ("option", "value"),
        [
            ("chars_per_token", 0),
            ("chars_per_token", float("nan")),
            ("nonascii_bytes_per_token", -1.0),
            ("astral_extra", -0.5),
            ("hangul_tokens", True),
            ("kana_tokens", -0.1),
            ("message_overhead", -1),
            ("max_memo", 1),
        ],
    )
    def test_bad_options_name_the_field(self, option: str, value: object) -> None:
        with pytest.raises(ConfigError, match=option) as info:
            HeuristicCounter(**{option: value})
        assert info.value.field == option

    def test_default_counter_is_shared(self) -> None:
        assert default_counter() is default_counter()

    @given(st.text(max_size=200), st.text(max_size=200))
    def test_text_counts_are_positive_and_roughly_additive(self, a: str, b: str) -> None:
        counter = HeuristicCounter()
        together = counter.count_text(a + b)
        assert (together > 0) == bool(a + b)
        # at most one token lost to rounding per piece, and joining never costs more
        # than both pieces plus the rounding
        assert together <= counter.count_text(a) + counter.count_text(b) + 1
        assert together >= counter.count_text(a) + counter.count_text(b) - 3


class TestColdCountingFastPath:
    """The inlined cold path counts exactly what counting each part with count_text does."""

    @given(history=strategies.histories(), extra=st.text(max_size=60))
    def test_inlined_measure_equals_per_part_counting(
        self, history: tuple[Message, ...], extra: str
    ) -> None:
        """Every message (ASCII, CJK, emoji, tool calls) gets the same count either way."""
        messages = (*history, UserMessage(extra + "    x"), ToolResult("c9", "日本語 " + extra))
        fast = HeuristicCounter()._measure(messages)
        assert fast == HeuristicCounter()._measure_parts(messages)
        assert fast == SpyCounter()._measure(messages)  # a subclass takes the general path

    @given(history=strategies.histories(), extra=st.text(max_size=60))
    def test_fused_whole_counts_equal_the_general_path(
        self, history: tuple[Message, ...], extra: str
    ) -> None:
        """Overheads and media added in the cold pass give the totals the general path does."""
        messages = (
            *history,
            UserMessage([TextPart("x" + extra), image_part(640, 480, "image/png")]),
            ToolResult("c9", [TextPart("日本語 " + extra), image_part(64, 48, "image/png")]),
            AssistantMessage(extra, (ToolCall("c1", "f", invalid_arguments="{oops " + extra),)),
        )
        fast, general = HeuristicCounter(), SpyCounter()
        assert [fast.count_message(m) for m in messages] == [
            general.count_message(m) for m in messages
        ]
        assert HeuristicCounter().count_messages(messages) == SpyCounter().count_messages(messages)

    @given(call=strategies.tool_calls(), value=st.text(max_size=80))
    def test_remembered_argument_size_counts_like_the_json_text(
        self, call: ToolCall, value: str
    ) -> None:
        """A call's arguments count what their JSON text counts, the first time and later."""
        calls = (call, ToolCall("c2", "write", {"text": value, "pad": "    " + value}))
        for tool_call in calls:
            message = AssistantMessage("", (tool_call,))
            expected = SpyCounter().count_message(message)
            assert HeuristicCounter().count_message(message) == expected  # encodes
            assert HeuristicCounter().count_message(message) == expected  # remembered size
            assert (
                tokens_module.arguments_text(tool_call) == message_payload(message).split(" ", 2)[2]
            )


def reference_count_text(counter: HeuristicCounter, text: str) -> int:
    """HeuristicCounter's formula written out character by character (the same float
    operations in the same order, so the result is bit for bit what the counter gives);
    a text longer than ``sample_above`` is measured on its sample and scaled."""
    if not text:
        return 0
    limit = counter.sample_above
    if limit is not None and len(text) > limit:
        sample = reference_sample(text)
        return max(1, math.ceil(reference_estimate(counter, sample) * len(text) / len(sample)))
    return max(1, math.ceil(reference_estimate(counter, text)))


def reference_sample(text: str) -> str:
    """8 windows of 256 characters, evenly spaced, the first at the start and the last
    at the end of ``text``."""
    starts = [(len(text) - 256) * i // 7 for i in range(8)]
    return "".join(text[start : start + 256] for start in starts)


def reference_estimate(counter: HeuristicCounter, text: str) -> float:
    """The formula over every character of ``text``, not rounded."""
    four = sum(len(run) // 4 for run in re.findall(" +", text))
    ascii_chars = sum(1 for ch in text if ord(ch) < 0x80)
    if ascii_chars == len(text):
        return (ascii_chars - 2 * four) / counter.chars_per_token
    han = kana = hangul = astral = 0
    bytes_left = 0
    for ch in text:
        code = ord(ch)
        if code < 0x80:
            continue
        size = len(ch.encode("utf-8", "surrogatepass"))
        astral += size == 4
        if 0x3400 <= code <= 0x4DBF or 0x4E00 <= code <= 0x9FFF or 0xF900 <= code <= 0xFAFF:
            han += 1
        elif 0x3040 <= code <= 0x30FF:
            kana += 1
        elif 0xAC00 <= code <= 0xD7A3 or 0x1100 <= code <= 0x11FF or 0x3130 <= code <= 0x318F:
            hangul += 1
        else:
            bytes_left += size
    estimate = (ascii_chars - 2 * four) / counter.chars_per_token
    if han or kana or hangul:
        estimate += (
            han * counter.han_tokens + kana * counter.kana_tokens + hangul * counter.hangul_tokens
        )
    estimate += bytes_left / counter.nonascii_bytes_per_token
    estimate += astral * counter.astral_extra
    return estimate


_MIXED_TEXT = st.lists(
    st.sampled_from(
        [" ", "    ", "  ", "a", "\n", "é", "─", "日", "ア", "한", "ᄀ", "ㅏ", "豈", "😀", "\ud800"]
    )
    | st.characters(),
    max_size=40,
).map("".join)


class TestReferenceFormula:
    """The fast counter gives exactly what the formula, written out per character, gives."""

    @given(text=_MIXED_TEXT | st.text(max_size=80))
    def test_count_text_equals_the_per_character_formula(self, text: str) -> None:
        """ASCII, Latin, box drawing, Han, kana, Hangul, emoji, lone surrogates: same count."""
        for counter in (HeuristicCounter(), HeuristicCounter(chars_per_token=1.0)):
            assert counter.count_text(text) == reference_count_text(counter, text)

    @given(history=strategies.histories(), extra=_MIXED_TEXT)
    def test_message_counts_equal_the_formula_over_their_parts(
        self, history: tuple[Message, ...], extra: str
    ) -> None:
        """A history's count is the overheads plus the formula over each part of each message."""
        messages = (*history, UserMessage(extra or "x"), ToolResult("c9", extra + "    "))
        counter = HeuristicCounter()

        def expected(message: Message) -> int:
            tokens = counter.message_overhead + reference_count_text(counter, message.text)
            if isinstance(message, ToolResult):
                tokens += reference_count_text(counter, message.tool_call_id)
            if isinstance(message, AssistantMessage):
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


_ESCAPE_HEAVY = st.lists(
    st.sampled_from(
        [" ", "    ", '"', "\\", "\n", "\t", "\r", "\b", "\f", "\x00", "\x1f", "\x7f", "/"]
        + ["a", "é", "日", "\u2028"]
    ),
    max_size=12,
).map("".join)
_FLAT_VALUES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _ESCAPE_HEAVY
    | st.text(max_size=12)
)


_LONG_PIECES = st.lists(
    st.sampled_from(["def f(x):\n", "    return x\n", "        ", "日本語", "한국", "😀", "é─"])
    | st.sampled_from(["word ", "\n"])
    | st.text(max_size=8),
    min_size=1,
    max_size=12,
).map(lambda pieces: "".join(pieces) or "x")


class TestSampledLongTexts:
    """A long text is measured on evenly spaced windows and scaled; a short one in full."""

    @settings(max_examples=50, deadline=None)
    @given(piece=_LONG_PIECES, length=st.integers(min_value=2049, max_value=20_000))
    def test_a_long_text_counts_its_sample_scaled(self, piece: str, length: int) -> None:
        """Past ``sample_above``: the formula over 8 windows of 256 characters, scaled to
        the whole length; at most ``sample_above`` (or with None): every character."""
        text = (piece * (length // len(piece) + 1))[:length]
        for counter in (HeuristicCounter(), HeuristicCounter(sample_above=2048)):
            assert counter.count_text(text) == reference_count_text(counter, text)
        exact = HeuristicCounter(sample_above=None)
        assert exact.count_text(text) == max(1, math.ceil(reference_estimate(exact, text)))
        if length <= 4096:  # the default measures it in full
            assert HeuristicCounter().count_text(text) == exact.count_text(text)

    def test_messages_with_long_texts_count_alike_on_every_path(self) -> None:
        """The inlined cold path samples the same texts count_text does."""
        code = "def handler(event):\n    if event:\n        return 1\n" * 200
        messages = (
            UserMessage(code),
            ToolResult("c1", "résumé ─ " * 900),
            AssistantMessage("日本語のテキスト" * 700),
            UserMessage(code[:4096]),
        )
        counter = HeuristicCounter()
        assert counter._measure(messages) == counter._measure_parts(messages)
        id_tokens = reference_count_text(counter, "c1")  # a tool result's call id counts too
        assert counter._measure(messages) == [
            reference_count_text(counter, m.text) + (id_tokens if m is messages[1] else 0)
            for m in messages
        ]

    def test_sampling_keeps_the_count_on_real_transcripts(self, shared_data: Path) -> None:
        """On every real transcript the sampled count is within 0.5 % of reading every
        character."""
        sampled, exact = HeuristicCounter(), HeuristicCounter(sample_above=None)
        for path in sorted((shared_data / "transcripts" / "openai").glob("*.jsonl")):
            messages = load_openai_jsonl(path)
            full = exact.count_messages(messages)
            assert abs(sampled.count_messages(messages) - full) <= 0.005 * full, path.name

    def test_sample_above_must_leave_room_for_the_sample(self) -> None:
        for bad in (0, 2047, -1, True, 4096.0, "4096"):
            with pytest.raises(ConfigError, match=r"HeuristicCounter\.sample_above.*>= 2048"):
                HeuristicCounter(sample_above=bad)  # type: ignore[arg-type]
        assert HeuristicCounter(sample_above=None).sample_above is None


class TestArgumentSize:
    """Tool-call arguments count exactly what their JSON text counts, escapes included."""

    @given(
        arguments=st.dictionaries(
            _ESCAPE_HEAVY | st.text(min_size=1, max_size=6),
            _FLAT_VALUES | st.lists(_FLAT_VALUES, max_size=2),
            max_size=4,
        )
    )
    def test_argument_tokens_equal_counting_the_json_text(self, arguments: dict[str, Any]) -> None:
        """Quotes, backslashes, control characters, indentation, numbers: same count."""
        call = ToolCall("c1", "run", arguments)
        message = AssistantMessage("", (call,))
        counter = HeuristicCounter(chars_per_token=1.0)  # every character shows
        expected = (
            counter.message_overhead
            + counter.tool_call_overhead
            + counter.count_text(call.id)
            + counter.count_text(call.name)
            + counter.count_text(tokens_module.arguments_text(call))
        )
        assert counter.count_message(message) == expected
        assert SpyCounter(chars_per_token=1.0).count_message(message) == expected  # general path
        assert HeuristicCounter(chars_per_token=1.0).count_message(message) == expected  # kept

    def test_escaped_characters_count_as_json_writes_them(self) -> None:
        """A newline is two characters of JSON, a NUL six, a quote two: so is their count."""
        counter = HeuristicCounter(chars_per_token=1.0, tool_call_overhead=0, message_overhead=0)
        base = counter.count_message(AssistantMessage("", (ToolCall("c", "f", {"k": ""}),)))
        for value, extra in (("\n", 2), ("\x00", 6), ('"', 2), ("\\", 2), ("é", None)):
            call = ToolCall("c", "f", {"k": value})
            tokens = counter.count_message(AssistantMessage("", (call,)))
            if extra is None:  # not ASCII: counted by its UTF-8 bytes, like any such text
                assert tokens == base - counter.count_text('{"k": ""}') + counter.count_text(
                    tokens_module.arguments_text(call)
                )
            else:
                assert tokens == base + extra


class TestMemoization:
    """Re-checking a growing history measures only the new messages."""

    def test_growing_history_measures_only_new_messages(self) -> None:
        counter = SpyCounter()
        history: tuple[Message, ...] = tuple(UserMessage(f"message {i}") for i in range(500))
        first = counter.count_messages(history)
        assert len(counter.measured) == 500
        counter.measured.clear()
        assert counter.count_messages(history) == first
        assert counter.measured == []
        grown = (*history, AssistantMessage("an answer"))
        assert counter.count_messages(grown) == first + counter.count_message(grown[-1])
        assert counter.measured == [grown[-1].text]

    def test_prefix_total_is_right_when_a_middle_message_changed(self) -> None:
        counter = HeuristicCounter()
        history = (UserMessage("a"), UserMessage("b" * 400), UserMessage("c"))
        counter.count_messages(history)
        edited = (history[0], UserMessage("short"), history[2], UserMessage("d"))
        assert counter.count_messages(edited) == sum(counter.count_message(m) for m in edited)

    def test_equal_but_distinct_messages_count_the_same(self) -> None:
        counter = HeuristicCounter()
        history = tuple(UserMessage(f"m{i}" * 20) for i in range(10))
        total = counter.count_messages(history)
        copies = tuple(UserMessage(m.content) for m in history)
        assert counter.count_messages(copies) == total
        assert counter.count_messages(list(history)) == total

    def test_memo_is_bounded_and_stays_correct_after_eviction(self) -> None:
        counter = HeuristicCounter(max_memo=8)
        history = tuple(UserMessage("x" * (i + 1) * 4) for i in range(20))
        fresh = HeuristicCounter()
        expected = sum(fresh.count_message(m) for m in history)
        assert counter.count_messages(history) == expected
        assert counter.memo_size <= 8
        assert counter.count_messages(history[:5]) == sum(
            fresh.count_message(m) for m in history[:5]
        )
        counter.clear()
        assert counter.memo_size == 0

    def test_a_collected_message_is_forgotten(self) -> None:
        counter = HeuristicCounter()
        kept = UserMessage("kept")
        counter.count_message(kept)
        counter.count_message(UserMessage("dropped at once"))
        gc.collect()
        assert counter.memo_size == 1
        assert counter.count_message(kept) == counter.count_message(UserMessage("kept"))

    def test_a_counted_history_is_not_kept_alive(self) -> None:
        """Finished sessions' histories are collectable: the memo holds only weak refs."""
        counter = HeuristicCounter()
        refs = []
        for session in range(5):
            history = tuple(UserMessage(f"s{session} m{i} " * 50) for i in range(20))
            total = counter.count_messages(history)
            assert counter.count_messages((*history, UserMessage("more"))) > total
            refs += [weakref.ref(m) for m in history]
            del history
        live = (UserMessage("the next session"),)
        counter.count_messages(live)  # only the history counted last is held strongly
        gc.collect()
        assert [r for r in refs if r() is not None] == []
        assert counter.memo_size == 1

    def test_the_prefix_fast_path_survives_and_stays_right(self) -> None:
        """A grown history still costs only its new messages, with weak prefix entries."""
        counter = SpyCounter()
        history = tuple(UserMessage(f"message {i}") for i in range(50))
        first = counter.count_messages(history)
        counter.measured.clear()
        grown = (*history, UserMessage("new"))
        assert counter.count_messages(grown) == first + counter.count_message(grown[-1])
        assert counter.measured == ["new"]
        # the same first message, a different middle: counted right, not from the prefix
        other = (history[0], UserMessage("x" * 400), *history[2:])
        assert counter.count_messages(other) == sum(counter.count_message(m) for m in other)

    def test_tools_and_system_prompt_are_memoized(self) -> None:
        counter = SpyCounter()
        tools = (ToolSpec("search", "Search", {"type": "object"}),)
        request = ModelRequest(
            messages=(UserMessage("hi"),), tools=tools, system_prompt="Be brief."
        )
        first = counter.count_request(request)
        counter.measured.clear()
        assert counter.count_request(request) == first
        assert counter.measured == []

    @given(strategies.histories(max_turns=10), st.integers(0, 40))
    def test_any_growth_sequence_counts_like_a_fresh_sum(
        self, history: tuple[Message, ...], split: int
    ) -> None:
        counter = HeuristicCounter()
        split = min(split, len(history))
        counter.count_messages(history[:split])
        expected = sum(HeuristicCounter().count_message(m) for m in history)
        assert counter.count_messages(history) == expected
        assert counter.count_messages(history) == expected

    def test_a_cold_count_adds_nothing_to_the_messages(self) -> None:
        """Counting a history once keeps only the history: no weak reference per message."""
        counter = HeuristicCounter()
        history = tuple(UserMessage(f"message {i}") for i in range(100))
        counter.count_messages(history)
        assert [weakref.getweakrefcount(m) for m in history] == [0] * 100
        assert counter.memo_size == 100  # their counts are remembered with the history

    def test_a_message_of_the_last_history_is_a_lookup(self) -> None:
        """count_message on a message of the history counted last measures nothing again."""
        counter = SpyCounter()
        history = tuple(UserMessage(f"message {i}") for i in range(50))
        counter.count_messages(history)
        grown = (*history, ToolResult("c1", "a result"))
        counter.count_messages(grown)
        counter.measured.clear()
        fresh = HeuristicCounter()
        assert [counter.count_message(m) for m in grown] == [fresh.count_message(m) for m in grown]
        assert counter.measured == []
        assert counter.memo_size == 51

    def test_a_released_history_is_not_kept_alive_and_its_counts_go(self) -> None:
        """Counting another history lets the last one go; its counts leave with it."""
        counter = HeuristicCounter()
        history = tuple(UserMessage(f"old {i}") for i in range(30))
        refs = [weakref.ref(m) for m in history]
        counter.count_messages(history)
        del history
        counter.count_messages((UserMessage("new"),))
        gc.collect()
        assert [r for r in refs if r() is not None] == []
        assert counter.memo_size == 1

    def test_two_sessions_sharing_a_counter_count_only_their_new_messages(self) -> None:
        """Histories that grow in turn on one counter each cost only what was added."""
        counter = SpyCounter()
        a = tuple(UserMessage(f"a{i}") for i in range(20))
        b = tuple(UserMessage(f"b{i}") for i in range(20))
        counter.count_messages(a)
        counter.count_messages(b)
        for turn in range(3):
            counter.measured.clear()
            a = (*a, UserMessage(f"a more {turn}"))
            b = (*b, UserMessage(f"b more {turn}"))
            fresh = HeuristicCounter()
            assert counter.count_messages(a) == fresh.count_messages(a)
            assert counter.count_messages(b) == fresh.count_messages(b)
            assert counter.measured == [f"a more {turn}", f"b more {turn}"]

    @given(
        sessions=st.lists(strategies.histories(max_turns=4), min_size=1, max_size=3),
        steps=st.lists(
            st.tuples(
                st.sampled_from(["grow", "count", "one", "edit", "clear"]),
                st.integers(0, 2),
                st.integers(0, 30),
            ),
            max_size=25,
        ),
    )
    def test_any_interleaving_counts_like_a_fresh_counter(
        self, sessions: list[tuple[Message, ...]], steps: list[tuple[str, int, int]]
    ) -> None:
        """Sessions growing, edited, counted whole or one message, in any order, on one
        counter (a small memo, cleared now and then): every answer is a fresh count, and at
        most max_memo counts are remembered."""
        counter = HeuristicCounter(max_memo=16)
        shown = [history[:1] for history in sessions]
        for action, which, at in steps:
            which %= len(sessions)
            full, history = sessions[which], shown[which]
            if action == "grow":
                history = shown[which] = full[: len(history) + 1 + at % 3]
            elif action == "edit" and history:
                at %= len(history)
                edited = UserMessage(f"edited {at}")
                history = shown[which] = (*history[:at], edited, *history[at + 1 :])
            elif action == "clear":
                counter.clear()
            if action == "one" and history:
                message = history[at % len(history)]
                assert counter.count_message(message) == HeuristicCounter().count_message(message)
            else:
                assert counter.count_messages(history) == HeuristicCounter().count_messages(history)
            assert counter.memo_size <= 16


class _RecordingTokenizer:
    """Delegates to a real tokenizer and records the batches it encodes."""

    def __init__(self, tokenizer: Any) -> None:
        self.inner = tokenizer
        self.batches: list[list[str]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> Any:
        self.batches.append(list(texts))
        return self.inner.encode_batch(texts, add_special_tokens=add_special_tokens)


@pytest.fixture(scope="module")
def bpe() -> Any:
    return train_bpe()


class TestTokenizersCounter:
    """Exact counts from a tokenizers vocabulary, uncached messages encoded in one batch."""

    def test_counts_match_the_tokenizer(self, bpe: Any) -> None:
        counter = TokenizersCounter(bpe)
        assert isinstance(counter, TokenCounter)
        text = "The quick brown fox 日本語 😀"
        assert counter.count_text(text) == len(bpe.encode(text, add_special_tokens=False).ids)
        call = AssistantMessage("ok", (ToolCall("call_1", "search", {"q": "fox"}),))
        expected = (
            len(bpe.encode(message_payload(call), add_special_tokens=False).ids)
            + counter.message_overhead
            + counter.tool_call_overhead
        )
        assert counter.count_message(call) == expected

    def test_uncached_messages_are_encoded_in_one_batch(self, bpe: Any) -> None:
        counter = TokenizersCounter(bpe)
        recorder = _RecordingTokenizer(bpe)
        counter.tokenizer = recorder
        history = tuple(UserMessage(f"the fox number {i}") for i in range(50))
        total = counter.count_messages(history)
        assert len(recorder.batches) == 1 and len(recorder.batches[0]) == 50
        assert counter.count_messages(history) == total
        grown = (*history, UserMessage("one more"), UserMessage("and another"))
        counter.count_messages(grown)
        assert recorder.batches[1] == ["one more", "and another"]

    def test_from_file_loads_a_tokenizer_json(self, bpe: Any, tmp_path: Path) -> None:
        path = tmp_path / "tokenizer.json"
        bpe.save(str(path))
        counter = TokenizersCounter.from_file(path)
        assert counter.count_text("quick brown fox") == TokenizersCounter(bpe).count_text(
            "quick brown fox"
        )

    def test_from_pretrained_goes_through_the_hub_loader(
        self, bpe: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        asked: list[tuple[str, str, str | None]] = []

        def fake_hub(identifier: str, *, revision: str, token: str | None) -> Any:
            asked.append((identifier, revision, token))
            return bpe

        monkeypatch.setattr(token_counters, "_load_pretrained", fake_hub)
        counter = TokenizersCounter.from_pretrained("org/model", revision="v1", message_overhead=2)
        assert asked == [("org/model", "v1", None)]
        assert counter.message_overhead == 2
        assert counter.count_text("fox") > 0

    def test_truncation_and_padding_never_cap_a_count(self, bpe: Any) -> None:
        capped = train_bpe()
        capped.enable_truncation(max_length=3)
        capped.enable_padding(length=64)
        counter = TokenizersCounter(capped)
        long_text = "the quick brown fox jumps over the lazy dog " * 5
        assert counter.count_text(long_text) == TokenizersCounter(bpe).count_text(long_text)
        assert counter.count_texts([long_text, "fox"])[0] > 3
        assert capped.truncation is not None, "the caller's tokenizer is left as it was"

    def test_rejects_what_is_not_a_tokenizer(self) -> None:
        with pytest.raises(ConfigError, match="tokenizer"):
            TokenizersCounter("gpt2")  # type: ignore[arg-type]


class TestCalibration:
    """Reported usage anchors the estimate; the ratio comes from differences, bounded."""

    def test_unanchored_estimate_is_the_raw_count(self) -> None:
        calibration = Calibration()
        assert calibration.estimate(1234) == 1234
        assert calibration.hidden_tokens is None and not calibration.anchored

    def test_estimate_is_last_reported_plus_what_was_added(self) -> None:
        calibration = Calibration()
        calibration.observe(1000, 1500)
        assert calibration.estimate(1000) == 1500
        assert calibration.estimate(1200) == 1700
        assert calibration.hidden_tokens == 500

    def test_hidden_system_prompt_does_not_inflate_the_ratio(self) -> None:
        calibration = Calibration()
        hidden, true_ratio = 3000, 1.1
        for raw in range(200, 20_000, 700):
            calibration.observe(raw, round(hidden + true_ratio * raw))
        # the first pair alone would say 3220 / 200 = 16x; the differences say 1.1
        assert calibration.ratio == pytest.approx(true_ratio, rel=0.01)
        assert calibration.estimate(25_000) == pytest.approx(hidden + true_ratio * 25_000, rel=0.01)

    def test_the_prior_keeps_one_early_sample_from_dominating(self) -> None:
        calibration = Calibration(prior_tokens=500)
        calibration.observe(100, 100)
        calibration.observe(200, 300)  # one small sample of 2x
        assert 1.0 < calibration.ratio < 1.2
        eager = Calibration(prior_tokens=0)
        eager.observe(100, 100)
        eager.observe(200, 300)
        assert eager.ratio == 2.0

    def test_ratio_is_bounded(self) -> None:
        calibration = Calibration(max_ratio=1.5, prior_tokens=0)
        calibration.observe(100, 100)
        calibration.observe(200, 5000)  # a wild sample: 49x
        assert calibration.ratio == 1.5
        calibration.observe(300, 5001)  # and one that would be ~0
        assert calibration.min_ratio <= calibration.ratio <= calibration.max_ratio

    def test_small_differences_and_missing_usage_are_ignored(self) -> None:
        calibration = Calibration(min_delta=32)
        calibration.observe(1000, 1200)
        calibration.observe(1010, 1300)  # 10 raw tokens apart: too noisy for a ratio
        assert calibration.ratio == 1.0
        assert calibration.estimate(1010) == 1300
        calibration.observe(2000, 0)  # a provider that reports nothing
        assert calibration.estimate(1010) == 1300
        calibration.reset()
        assert calibration.estimate(7) == 7

    @pytest.mark.parametrize(
        ("option", "value"),
        [("min_ratio", 0), ("max_ratio", 0.5), ("prior_tokens", -1), ("min_delta", -1)],
    )
    def test_bad_options_name_the_field(self, option: str, value: object) -> None:
        with pytest.raises(ConfigError) as info:
            Calibration(**{option: value})
        assert info.value.field == option

    def test_converges_to_the_real_tokenizer_with_a_hidden_prompt(self, bpe: Any) -> None:
        truth = TokenizersCounter(bpe, message_overhead=4)
        estimate = HeuristicCounter()
        hidden = 700
        calibration = Calibration()
        history: list[Message] = [SystemMessage("You are a careful assistant.")]
        errors: list[float] = []
        for turn in range(30):
            history.append(
                UserMessage(f"Question {turn}: how does the fox jump? " * (turn % 4 + 1))
            )
            history.append(AssistantMessage("def jump(fox):\n    return fox.height * 2\n" * 3))
            raw = estimate.count_messages(history)
            real = truth.count_messages(history) + hidden
            errors.append(abs(calibration.estimate(raw) - real) / real)
            calibration.observe(raw, real)
        assert errors[0] > 0.2, "uncalibrated, the hidden prompt is invisible"
        assert max(errors[5:]) < 0.03


class TestContextWindowTable:
    """Common model families by longest prefix; provider routing stripped; user tables win."""

    @pytest.mark.parametrize(
        ("model", "window"),
        [
            ("gpt-4o", 128_000),
            ("gpt-4o-mini-2024-07-18", 128_000),
            ("gpt-4.1-mini", 1_047_576),
            ("gpt-5-nano", 400_000),
            ("gpt-4", 8_192),
            ("o1-mini", 128_000),
            ("o3-2025-04-16", 200_000),
            ("o4-mini", 200_000),
            ("claude-sonnet-4-5", 200_000),
            ("anthropic/claude-3-5-haiku-latest", 200_000),
            ("us.anthropic.claude-3-5-sonnet-20240620-v1:0", 200_000),
            ("models/gemini-1.5-pro-002", 2_097_152),
            ("gemini-2.5-flash", 1_048_576),
            ("meta-llama/Meta-Llama-3.1-8B-Instruct", 131_072),
            ("llama3.3:70b", 131_072),
            ("mistral-large-latest", 131_072),
            ("open-mixtral-8x22b", 65_536),
            ("Qwen/Qwen2.5-72B-Instruct", 131_072),
            ("qwen3-coder-480b", 262_144),
            ("deepseek-chat", 131_072),
        ],
    )
    def test_known_families(self, model: str, window: int) -> None:
        assert context_window(model) == window

    def test_unknown_models_have_no_window(self) -> None:
        assert context_window(None) is None
        assert context_window("") is None
        assert context_window("my-finetune") is None

    def test_a_user_table_wins_and_is_validated(self) -> None:
        table = window_table({"My-Finetune": 16_000, "gpt-4o": 64_000})
        assert context_window("my-finetune-v2", table) == 16_000
        assert context_window("openai/gpt-4o", table) == 64_000
        assert context_window("claude-3-opus", table) == 200_000
        with pytest.raises(ConfigError, match="windows"):
            window_table({"x": 0})

    def test_normalization(self) -> None:
        assert normalize_model_name("OpenAI/GPT-4o") == "gpt-4o"
        assert normalize_model_name("eu.anthropic.claude-3") == "claude-3"
        assert all(key == normalize_model_name(key) for key in MODEL_WINDOWS)


class TestAccuracyOnRealData:
    """The heuristic against a real production tokenizer on real transcripts and CJK."""

    def test_heuristic_is_close_on_transcripts_and_never_far_under_on_cjk(
        self, shared_data: Path
    ) -> None:
        real = TokenizersCounter.from_file(
            shared_data / "tokenizers" / "claude-legacy" / "tokenizer.json"
        )
        heuristic = HeuristicCounter()
        for path in sorted((shared_data / "transcripts" / "openai").glob("*.jsonl")):
            messages = load_openai_jsonl(path)
            truth = real.count_messages(messages)
            error = (heuristic.count_messages(messages) - truth) / truth
            assert -0.05 < error < 0.25, f"{path.name}: {error:+.1%}"
        cjk = [
            UserMessage(p.read_text()) for p in (shared_data / "text" / "cjk").glob("*-utf8.txt")
        ]
        assert heuristic.count_messages(cjk) >= 0.98 * real.count_messages(cjk)

    def test_cjk_calibrated_error_is_within_3_percent(self, shared_data: Path) -> None:
        """A zh/ja/ko conversation, calibrated by reported usage, is counted within 3 %."""
        real = TokenizersCounter.from_file(
            shared_data / "tokenizers" / "claude-legacy" / "tokenizer.json"
        )
        texts = [p.read_text() for p in sorted((shared_data / "text" / "cjk").glob("*-utf8.txt"))]
        conversation: list[Message] = []
        for i, text in enumerate(texts):
            conversation += [UserMessage(text), AssistantMessage(texts[(i + 1) % len(texts)])]
        heuristic, calibration, errors = HeuristicCounter(), Calibration(), []
        hidden = 1_200  # a system prompt the counter never sees, as in the benchmark
        for index in range(1, len(conversation), 2):  # the request before each reply
            request = tuple(conversation[:index])
            truth = real.count_messages(request) + hidden
            raw = heuristic.count_messages(request)
            if calibration.observations >= 2:
                errors.append(abs(calibration.estimate(raw) - truth) / truth)
            calibration.observe(raw, truth)
        assert errors and sum(errors) / len(errors) <= 0.03


class TestTranscriptLoader:
    """OpenAI chat messages load as tinyctx messages, pairing and odd arguments kept."""

    def test_roles_calls_and_invalid_arguments(self) -> None:
        records = [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "run", "arguments": '{"x": 1}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "run", "arguments": "[1]"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"},
        ]
        messages = messages_from_openai(records)
        assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "tool"]
        calls = messages[2].tool_calls  # type: ignore[attr-defined]
        assert calls[0].arguments == {"x": 1} and calls[0].invalid_arguments is None
        assert calls[1].invalid_arguments == "[1]"
        with pytest.raises(ValueError, match="unknown role 'robot'.*allowed: system"):
            messages_from_openai([{"role": "robot", "content": ""}])
        with pytest.raises(ValueError, match="message 1: content part 0 has no 'text'"):
            messages_from_openai([records[0], {"role": "user", "content": [{"type": "text"}]}])

    def test_content_parts_load_as_parts(self) -> None:
        """A multimodal transcript (text and image parts) loads; its images count as images."""
        url = "https://example.com/screen.png"
        (message,) = messages_from_openai(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is on the screen?"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                }
            ]
        )
        assert message.text == "what is on the screen?"
        (image,) = (p for p in message.content if isinstance(p, ImagePart))  # type: ignore[union-attr]
        assert image.url == url
        counter = HeuristicCounter()
        assert counter.count_message(message) > counter.count_message(UserMessage(message.text))

    def test_loads_a_jsonl_file(self, tmp_path: Path) -> None:
        path = tmp_path / "t.jsonl"
        path.write_text(
            '{"role": "user", "content": "hi"}\n\n{"role": "assistant", "content": "yo"}\n'
        )
        assert load_openai_jsonl(path) == (UserMessage("hi"), AssistantMessage("yo"))

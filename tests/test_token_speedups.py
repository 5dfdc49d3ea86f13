"""The C counting loop (tinyctx._token_speedups) gives every message the count the Python
loop gives, and leaves to Python what it is not sure of."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from tinyctx.codec import decode_messages, encode_messages
from tinyctx.testing.strategies import histories
from tinyctx.testing.transcripts import load_openai_jsonl
from tinyctx.tokens import HeuristicCounter, MemoCounter, ShapeCounter

speedups = pytest.importorskip("tinyctx._token_speedups")


def _counters() -> list[MemoCounter]:
    return [
        HeuristicCounter(),
        HeuristicCounter(sample_above=None, chars_per_token=2.7, tool_call_overhead=0),
        ShapeCounter(),
        ShapeCounter(fit="cl100k"),
        ShapeCounter(sample_above=None, message_overhead=0, space_tokens=0.3),
    ]


def _python_counts(counter: MemoCounter, messages: tuple[Message, ...]) -> list[int]:
    """What the Python loop alone counts (the fallback without the C module)."""
    return counter._measure(messages, whole=True)  # type: ignore[call-arg]


_TEXT = st.text(alphabet=st.sampled_from(list("ab Z9(\n\t    é日😀")), max_size=30) | st.text(
    max_size=12
)


class TestSameCountsAsPython:
    """Each message's whole count is the Python loop's, for every counter."""

    @given(history=histories())
    def test_every_generated_history(self, history: tuple[Message, ...]) -> None:
        for counter in _counters():
            assert counter._message_counts(history) == _python_counts(counter, history)

    @given(
        text=_TEXT,
        call_id=_TEXT.filter(bool),
        name=_TEXT.filter(bool),
        arguments=st.dictionaries(st.text(max_size=4), _TEXT | st.integers(), max_size=3),
        invalid=st.none() | _TEXT,
    )
    def test_any_text_id_name_and_arguments(
        self, text: str, call_id: str, name: str, arguments: dict[str, Any], invalid: str | None
    ) -> None:
        call = ToolCall(call_id, name, arguments, invalid_arguments=invalid)
        messages = (
            UserMessage(text or "x"),
            AssistantMessage(text, (call, ToolCall(call_id + "2", name, {}))),
            ToolResult(call_id, text),
            SystemMessage(text or "s"),
        )
        for counter in _counters():
            assert counter._message_counts(messages) == _python_counts(counter, messages)

    def test_long_texts_at_and_past_the_sample_threshold(self) -> None:
        piece = "def f(x):\n    return x  # 12\n"
        messages = tuple(UserMessage((piece * 200)[:length]) for length in (4095, 4096, 4097, 5000))
        for counter in _counters():
            assert counter._message_counts(messages) == _python_counts(counter, messages)

    def test_the_real_transcripts(self, shared_data: Path) -> None:
        history: tuple[Message, ...] = ()
        for path in sorted((shared_data / "transcripts" / "openai").glob("*.jsonl")):
            history += tuple(load_openai_jsonl(path))
        for counter in _counters():
            assert counter._message_counts(history) == _python_counts(counter, history)


class TestWhatIsLeftToPython:
    """The C loop answers only for plain ASCII messages of the built-in types."""

    def test_doubtful_messages_are_listed_and_plain_ones_counted(self) -> None:
        reasoning = AssistantMessage("ok", metadata={"tinyctx": {"reasoning_tokens": 7}})
        messages = decode_messages(
            encode_messages(
                (
                    UserMessage("plain text"),
                    UserMessage("日本語"),
                    reasoning,
                    SystemMessage("a system message"),
                    ToolResult("c1", "x" * 5000),
                    ToolResult("c2", "done"),
                )
            )
        )
        counter = HeuristicCounter()
        counts, doubt = speedups.measure(
            messages,
            (UserMessage, AssistantMessage, ToolResult),
            False,
            (counter.chars_per_token,),
            counter.message_overhead,
            counter.tool_call_overhead,
            4096,
            counter._arguments_tokens,
        )
        assert doubt == [1, 2, 3, 4]
        assert [counts[i] for i in (0, 5)] == [
            counter.count_message(messages[0]),
            counter.count_message(messages[5]),
        ]

    def test_a_failing_arguments_count_raises(self) -> None:
        def broken(call: ToolCall) -> int:
            raise RuntimeError("boom")

        messages = (AssistantMessage("", (ToolCall("c1", "run", {"a": 1}),)),)
        with pytest.raises(RuntimeError, match="boom"):
            speedups.measure(
                messages,
                (UserMessage, AssistantMessage, ToolResult),
                False,
                (3.1,),
                4,
                4,
                10,
                broken,
            )

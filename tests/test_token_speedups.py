"""The C counting loop (tinyctx._token_speedups) gives every message the count the Python
loop gives, and leaves to Python what it is not sure of."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyctx import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from tinyctx._token_counters import C_LOOP
from tinyctx.codec import decode_messages, encode_messages
from tinyctx.frozen import SET_JSON_CHARS
from tinyctx.testing.strategies import histories
from tinyctx.testing.transcripts import load_openai_jsonl
from tinyctx.tokens import HeuristicCounter, MemoCounter, ShapeCounter

speedups: Any
try:
    from tinyctx import _token_speedups as speedups
except ImportError:  # not built: the tests skip, unless CI requires it
    speedups = None

pytestmark = pytest.mark.skipif(
    not C_LOOP and os.environ.get("TINYCTX_REQUIRE_EXTENSIONS") != "1",
    reason="tinyctx._token_speedups was not built here (no C compiler at install)",
)


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


_TEXT = st.text(
    alphabet=st.sampled_from([*"ab Z9(\n\t    é─日的發アㅏ한이뷁😀", "\ud800"]), max_size=30
) | st.text(max_size=12)
_JSON_TEXT = st.text(alphabet=st.sampled_from(list('a Z9"\\/\n\t\r\b\f\x00\x1f\x7f{:,é')))
_VALUE = (
    _JSON_TEXT
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.lists(st.integers() | _JSON_TEXT, max_size=2)
    | st.dictionaries(_JSON_TEXT, st.none() | _JSON_TEXT | st.lists(st.booleans()), max_size=2)
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

    @settings(max_examples=40, deadline=None)
    @given(
        piece=st.sampled_from(["def f(x):\n    return x\n", "a  b      c 1", "word 12, ", "  "]),
        length=st.integers(min_value=4090, max_value=12_000),
    )
    def test_a_long_text_counts_its_sample(self, piece: str, length: int) -> None:
        """Past the threshold both measure the same windows (four-space runs go on
        across the joins of the sample)."""
        text = (piece * (length // len(piece) + 1))[:length]
        messages = (UserMessage(text), ToolResult("c1", text[1:]))
        for counter in _counters():
            assert counter._message_counts(messages) == _python_counts(counter, messages)

    @given(
        runs=st.lists(
            st.tuples(st.integers(0, 200), st.sampled_from(["x", "\n", "7", "é", ""])),
            max_size=30,
        )
    )
    def test_runs_of_spaces_of_any_length_anywhere(self, runs: list[tuple[int, str]]) -> None:
        """Four-space runs and kinds of characters are counted alike whether a run sits
        inside a 64-byte block of the C loop, across blocks or in the tail."""
        text = "".join(" " * n + c for n, c in runs)
        messages = (UserMessage(text or "x"), ToolResult("c1", text[3:]))
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


class TestArgumentsMeasuredInC:
    """A call's flat JSON arguments count what the encoder's text counts."""

    @given(arguments=st.dictionaries(_JSON_TEXT, _VALUE, max_size=4))
    def test_any_flat_or_odd_arguments(self, arguments: dict[str, Any]) -> None:
        message = AssistantMessage("", (ToolCall("c1", "run", arguments),))
        for counter in _counters():
            fresh = decode_messages(encode_messages((message,)))  # no size remembered yet
            assert counter._message_counts(fresh) == _python_counts(counter, (message,))

    def test_a_remembered_size_is_read_not_measured_again(self) -> None:
        """The heuristic reads the size a count remembered on the mapping (as the
        Python loop does), so both agree after it, and the size is what counts."""
        counter = HeuristicCounter(message_overhead=0, tool_call_overhead=0)
        message = AssistantMessage("", (ToolCall("c1", "run", {"path": "a" * 40}),))
        python = _python_counts(counter, (message,))  # remembers the size
        assert counter._message_counts((message,)) == python
        SET_JSON_CHARS(message.tool_calls[0].arguments, 310)
        assert counter._message_counts((message,)) == [1 + 1 + 100]  # id, name, 310 / 3.1


_KINDS = (UserMessage, AssistantMessage, ToolResult)
_HEURISTIC_RATES = (3.1, 2.3, 0.5, 1.35, 0.8, 1.75)


class TestWhatIsLeftToPython:
    """The C loop answers for the built-in message types with plain string content and
    no metadata; every other message is left to the Python loop, by index."""

    def test_doubtful_messages_are_listed_and_plain_ones_counted(self) -> None:
        reasoning = AssistantMessage("ok", metadata={"tinyctx": {"reasoning_tokens": 7}})
        messages = decode_messages(
            encode_messages(
                (
                    UserMessage("plain text"),
                    UserMessage("日本語 한국어 😀"),
                    reasoning,
                    SystemMessage("a system message"),
                    ToolResult("c1", "x   " * 1500),
                    ToolResult("c2", "done"),
                )
            )
        )
        counter = HeuristicCounter()
        counts, doubt = speedups.measure(
            messages, _KINDS, False, _HEURISTIC_RATES, None, 4, 4, 4096, counter._arguments_tokens
        )
        assert doubt == [2, 3]  # reasoning tokens, not a built-in kind
        for i in (0, 1, 4, 5):  # ASCII, CJK and emoji, long (its sample), short
            assert counts[i] == counter.count_message(messages[i])

    def test_a_failing_arguments_count_raises(self) -> None:
        def broken(call: ToolCall) -> int:
            raise RuntimeError("boom")

        # a float: its repr is Python's to write, so the callable is asked
        messages = (AssistantMessage("", (ToolCall("c1", "run", {"a": 1.5}),)),)
        with pytest.raises(RuntimeError, match="boom"):
            speedups.measure(messages, _KINDS, False, _HEURISTIC_RATES, None, 4, 4, 4096, broken)

    @pytest.mark.parametrize(
        ("shape", "rates", "one_token", "exact_to", "error"),
        [
            (False, (3.1,), None, 4096, TypeError),
            (True, _HEURISTIC_RATES, b"", 4096, TypeError),
            (True, (0.3,) * 12, b"x", 4096, TypeError),
            (False, _HEURISTIC_RATES, None, 100, ValueError),
        ],
    )
    def test_bad_settings_are_refused(
        self, shape: bool, rates: tuple[float, ...], one_token: Any, exact_to: int, error: type
    ) -> None:
        with pytest.raises(error):
            speedups.measure((), _KINDS, shape, rates, one_token, 4, 4, exact_to, len)


class TestTheSwitch:
    """Cold counts run the C loop where it was built, and the Python loops alone with
    TINYCTX_NO_EXTENSIONS=1, to the same counts."""

    def test_loaded(self) -> None:
        """CI requires it (TINYCTX_REQUIRE_EXTENSIONS=1)."""
        assert C_LOOP

    def test_turned_off_by_the_environment(self) -> None:
        script = (
            "from tinyctx import UserMessage, ToolResult\n"
            "from tinyctx._token_counters import C_LOOP\n"
            "from tinyctx.tokens import HeuristicCounter, ShapeCounter\n"
            "history = (UserMessage('hi there 日本'), ToolResult('c1', 'def f():  ' * 500))\n"
            "counts = [c().count_messages(history) for c in (HeuristicCounter, ShapeCounter)]\n"
            "print(C_LOOP, counts)\n"
        )
        runs = []
        for switch in ("1", ""):
            env = {**os.environ, "TINYCTX_NO_EXTENSIONS": switch}
            out = subprocess.run(
                [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
            )
            assert out.returncode == 0, out.stderr
            runs.append(out.stdout.split(" ", 1))
        assert [flag for flag, _ in runs] == ["False", "True"]
        assert runs[0][1] == runs[1][1]

"""Tool-result budget: one result capped at a byte budget, on a character boundary."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    Message,
    RunConfig,
    RunContext,
    Session,
    TextPart,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.messages import check_pairing
from tinyctx.middleware import ToolResultBudget
from tinyctx.middleware.policy import PressurePolicy
from tinyctx.middleware.tool_result_budget import (
    ToolResultTruncated,
    TruncationStats,
    _budgeted,
    budget_history,
    budget_tool_result,
)
from tinyctx.parts import media_parts
from tinyctx.testing import FakeTool, ScriptedModel, call, capture_events, reply, run_tool_layer
from tinyctx.testing.images import image_part
from tinyctx.testing.strategies import histories
from tinyctx.tokens import HeuristicCounter

# text that is mostly multi-byte: 2-, 3- and 4-byte characters next to ASCII
CHARS = st.sampled_from(list("aZ \né€中文한😀🎉"))
MIXED = st.text(alphabet=CHARS, max_size=300)
SHORT_MIXED = st.text(alphabet=CHARS, max_size=100)


def size(text: str) -> int:
    return len(text.encode("utf-8"))  # strict: raises on anything that is not valid UTF-8


def dropped_in_marker(text: str) -> int:
    match = re.search(r"truncated: (\d+) of \d+ bytes dropped|\[\+(\d+)B cut\]", text)
    assert match is not None, text
    return int(match.group(1) or match.group(2))


class TestBudgetFunction:
    """A result over budget is cut on a character boundary and never exceeds the budget."""

    def test_under_and_exactly_at_budget_are_untouched(self) -> None:
        text = "héllo"  # 6 bytes
        for budget in (6, 7, 1000):
            out, stats = budget_tool_result(text, budget)
            assert out is text
            assert stats == TruncationStats(6, 6, False, 6)
            assert stats.dropped_bytes == 0

    def test_over_budget_keeps_a_prefix_and_says_what_was_dropped_and_how_to_see_it(
        self,
    ) -> None:
        text = "line\n" * 1000  # 5000 bytes
        out, stats = budget_tool_result(text, 1024)
        assert size(out) <= 1024
        assert stats.truncated
        assert stats.final_bytes == size(out)
        assert out.startswith(text[: stats.kept_bytes])
        assert stats.dropped_bytes == 5000 - stats.kept_bytes > 0
        assert f"truncated: {stats.dropped_bytes} of 5000 bytes dropped" in out
        assert "to see the rest" in out

    def test_custom_and_empty_hint(self) -> None:
        out, _ = budget_tool_result("x" * 500, 200, hint="use read_file with offset=N")
        assert out.endswith("use read_file with offset=N]")
        out, stats = budget_tool_result("x" * 500, 200, hint="")
        assert out.endswith(f"[truncated: {stats.dropped_bytes} of 500 bytes dropped]")

    def test_zero_disables(self) -> None:
        text = "x" * 100_000
        out, stats = budget_tool_result(text, 0)
        assert out is text
        assert not stats.truncated

    def test_cut_never_splits_a_multibyte_character(self) -> None:
        for text in ("é" * 300, "中" * 300, "😀" * 300, "a😀é中" * 100):
            for budget in range(60, 140):
                out, stats = budget_tool_result(text, budget, hint="")
                assert size(out) <= budget
                assert text.startswith(out[: out.index("\n[truncated")])
                assert size(out[: out.index("\n[truncated")]) == stats.kept_bytes

    def test_tiny_budgets_shorten_then_cut_the_marker_never_the_guarantee(self) -> None:
        text = "abcdefghij" * 50
        seen = set()
        for budget in range(1, 200):
            out, stats = budget_tool_result(text, budget)
            assert size(out) <= budget, (budget, out)
            assert stats.final_bytes == size(out)
            assert stats.truncated
            seen.add("full" if "bytes dropped" in out else "short" if "B cut]" in out else "cut")
        assert seen == {"full", "short", "cut"}
        assert budget_tool_result(text, 1)[0] == "["
        assert budget_tool_result(text, 5)[0] == "[cut]"

    def test_the_marker_counts_exactly_the_bytes_left_out(self) -> None:
        for budget in (12, 20, 100, 150, 400):
            out, stats = budget_tool_result("€uro " * 100, budget)
            assert dropped_in_marker(out) == stats.dropped_bytes == 700 - stats.kept_bytes

    def test_lone_surrogates_come_out_as_valid_utf8(self) -> None:
        out, stats = budget_tool_result("ok \ud800 ok", 100)
        assert out == "ok \ufffd ok" and size(out) == stats.final_bytes == 9
        out, _ = budget_tool_result("\udcff" * 100, 50)
        assert size(out) <= 50

    @pytest.mark.parametrize("bad", [-1, 1.5, "16k", True, None])
    def test_bad_budget_is_a_config_error_naming_the_field(self, bad: Any) -> None:
        with pytest.raises(ConfigError, match="budget_bytes"):
            budget_tool_result("x", bad)
        with pytest.raises(ConfigError, match="ToolResultBudget.budget_bytes"):
            ToolResultBudget(bad)

    def test_bad_hint_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match="hint"):
            ToolResultBudget(100, hint=None)  # type: ignore[arg-type]

    @given(text=st.text(max_size=400) | MIXED, budget=st.integers(0, 500))
    def test_any_text_any_budget_is_valid_utf8_within_budget(self, text: str, budget: int) -> None:
        out, stats = budget_tool_result(text, budget)
        if budget == 0 or size(text) <= budget:
            assert out == text and not stats.truncated
            return
        assert size(out) <= budget
        assert stats.truncated and stats.final_bytes == size(out)
        kept = text.encode("utf-8")[: stats.kept_bytes].decode("utf-8")  # a char boundary
        assert out.startswith(kept)
        assert stats.original_bytes == size(text)


class TestAsciiHeadCut:
    """An ASCII result keeps the longest prefix that fits beside its marker, byte for byte."""

    @given(
        text=st.text(alphabet=st.characters(max_codepoint=127), min_size=1, max_size=600),
        budget=st.integers(1, 500),
        hint=st.sampled_from(["", "ask for the rest", "voir la suite é"]),
    )
    def test_the_prefix_is_as_long_as_the_marker_lets_it_be(
        self, text: str, budget: int, hint: str
    ) -> None:
        out, stats = budget_tool_result(text, budget, hint=hint)
        if len(text) <= budget:
            assert out == text and not stats.truncated
            return
        total = len(text)
        how = f"; {hint}" if hint else ""
        # each marker sized for the most digits a dropped count can have; the first that fits
        room = [size(m) for m in (f"\n[truncated: {total} of {total} bytes dropped{how}]",)]
        room += [size(f"[+{total}B cut]"), size("[cut]")]
        fitting = [r for r in room if r <= budget]
        assert out[: stats.kept_bytes] == text[: stats.kept_bytes]
        assert size(out) <= budget and stats.final_bytes == size(out)
        assert stats.kept_bytes == (budget - fitting[0] if fitting else 0)


class TestMiddleCut:
    """keep="middle": the start and the end of a result survive, the marker in between."""

    def test_keeps_the_head_and_the_tail(self) -> None:
        """The first and last lines stay; the marker says the middle went."""
        text = "".join(f"line {i}\n" for i in range(1000))
        out, stats = budget_tool_result(text, 1024, keep="middle")
        assert size(out) <= 1024 and stats.final_bytes == size(out)
        assert out.startswith("line 0\n") and out.endswith("line 999\n")
        assert f"{stats.dropped_bytes} of {size(text)} bytes dropped from the middle" in out

    @given(text=st.text(min_size=1, max_size=400), budget=st.integers(1, 300))
    def test_never_over_budget_and_valid_utf8(self, text: str, budget: int) -> None:
        """Whatever the text and budget, the cut fits, is valid UTF-8, and is the original's
        start and end around the marker."""
        out, stats = budget_tool_result(text, budget, keep="middle")
        if not stats.truncated:
            assert out == text and size(text) <= budget
            return
        assert stats.final_bytes == size(out) <= budget  # size() refuses invalid UTF-8
        assert stats.kept_bytes <= size(text)
        data, kept = text.encode("utf-8"), out.encode("utf-8")
        head = stats.kept_bytes // 2
        assert kept.startswith(data[: max(0, head - 3)])  # up to a character's bytes back

    def test_the_layer_and_a_bad_keep(self) -> None:
        """ToolResultBudget(keep="middle") cuts the middle; another value names the field."""
        layer = ToolResultBudget(64, keep="middle", hint="")
        assert layer.keep == "middle"
        with pytest.raises(ConfigError, match="keep"):
            ToolResultBudget(64, keep="tail")
        with pytest.raises(ConfigError, match="keep"):
            budget_tool_result("x" * 100, 10, keep="end")


class TestRoom:
    """room=: a result over the byte cap enters whole while the window can afford it."""

    async def test_whole_while_there_is_room_cut_once_the_window_fills(self) -> None:
        """The same result is kept whole in a short conversation, cut in a full one."""
        big = "word " * 2000  # 10,000 bytes, about 2,500 tokens
        layer = ToolResultBudget(1024, window_fraction=0.5, room=0.5, hint="")
        for history, whole in ((("short",), True), (("filler " * 3000,), False)):
            tool = FakeTool("read", returns=big)
            model = ScriptedModel([reply("", call("read")), "done"])
            agent = Agent(model=model, tools=[tool.tool], middleware=[layer])
            config = RunConfig(max_tokens=12_000, reserved_output_tokens=0)
            async with Session(agent, config=config) as session:
                await session.run(history[0])
                results = [m for m in session.conversation_messages if isinstance(m, ToolResult)]
            assert (results[0].text == big) is whole

    @pytest.mark.parametrize("value", [0, 1.5, True, "0.5"])
    def test_room_must_be_a_fraction(self, value: Any) -> None:
        """A room outside (0, 1] is refused, naming the field."""
        with pytest.raises(ConfigError, match="room"):
            ToolResultBudget(room=value)
        with pytest.raises(ConfigError, match="room_fraction"):
            ToolResultBudget(room_fraction=value)


class TestRoomFraction:
    """room_fraction=: while there is room a result may take that share of the window whole."""

    async def _kept(self, layer: ToolResultBudget, history: str, result: str) -> str:
        tool = FakeTool("read", returns=result)
        model = ScriptedModel([reply("", call("read")), "done"])
        agent = Agent(model=model, tools=[tool.tool], middleware=[layer])
        config = RunConfig(max_tokens=12_000, reserved_output_tokens=0)
        async with Session(agent, config=config) as session:
            await session.run(history)
            results = [m for m in session.conversation_messages if isinstance(m, ToolResult)]
        return results[0].text

    async def test_over_the_pressure_share_whole_while_there_is_room(self) -> None:
        """A result over window_fraction but within room_fraction enters whole in a short
        conversation; in a full one it is cut to the window_fraction share."""
        big = "word " * 3000  # 15,000 bytes, about 4,800 tokens: over 10% of 12K, under 50%
        layer = ToolResultBudget(64_000, window_fraction=0.1, room=1.0, room_fraction=0.5, hint="")
        assert await self._kept(layer, "short", big) == big
        cut = await self._kept(layer, "filler " * 3000, big)
        assert cut != big and HeuristicCounter().count_text(cut) <= 0.1 * 12_000 + 50

    async def test_over_the_cap_it_must_leave_room_for_another_like_it(self) -> None:
        """A result over window_fraction enters whole only while the conversation with it
        twice stays under room: the same result is cut where once would still fit."""
        big = "word " * 3000  # about 4,800 tokens
        layer = ToolResultBudget(64_000, window_fraction=0.1, room=0.8, room_fraction=0.5, hint="")
        # 1,000 + 4,800 fits under 9,600 once, but not twice
        assert await self._kept(layer, "filler " * 450, big) != big

    async def test_without_it_the_whole_share_is_window_fraction(self) -> None:
        """Unset, a result over window_fraction is cut even with room (the old behaviour)."""
        big = "word " * 3000
        layer = ToolResultBudget(64_000, window_fraction=0.1, room=0.8, hint="")
        assert await self._kept(layer, "short", big) != big


class TestToolResultBudgetLayer:
    """On the tool onion: results are budgeted before they enter history, with an event."""

    async def test_a_big_result_is_cut_marked_and_reported(self) -> None:
        call_ = ToolCall("c1", "read_file", {"path": "big.log"})

        async def big(c: ToolCall, ctx: RunContext[Any]) -> ToolResult:
            return ToolResult.for_call(c, "0123456789" * 1000, metadata={"source": "disk"})

        with capture_events() as events:
            result = await run_tool_layer(ToolResultBudget(2048), call_, next=big)
        assert size(result.content) <= 2048
        assert (result.tool_call_id, result.name) == ("c1", "read_file")
        assert result.metadata["source"] == "disk"
        info = result.metadata["tinyctx"]["truncated"]
        assert info == {"original_bytes": 10000, "final_bytes": size(result.content)} | {
            "budget_bytes": 2048
        }
        (event,) = [e for e in events if isinstance(e, ToolResultTruncated)]
        assert event.kind == "compaction.tool_result_budget"
        assert (event.tool, event.tool_call_id, event.original_bytes) == ("read_file", "c1", 10000)
        assert event.final_bytes == size(result.content) and event.budget_bytes == 2048

    async def test_error_results_are_budgeted_too(self) -> None:
        async def failing(c: ToolCall, ctx: RunContext[Any]) -> ToolResult:
            return ToolResult.for_call(c, "Traceback:\n" + "frame\n" * 5000, is_error=True)

        result = await run_tool_layer(ToolResultBudget(500), call("run"), next=failing)
        assert result.is_error
        assert size(result.content) <= 500

    async def test_exactly_at_budget_is_untouched_and_silent(self) -> None:
        original = ToolResult("c1", "x" * 100, "t")

        async def exact(c: ToolCall, ctx: RunContext[Any]) -> ToolResult:
            return original

        with capture_events() as events:
            result = await run_tool_layer(ToolResultBudget(100), call("t", id="c1"), next=exact)
        assert result is original
        assert not [e for e in events if isinstance(e, ToolResultTruncated)]

    async def test_disabled_does_no_work_at_all(self) -> None:
        class Untouchable(str):
            def isascii(self) -> bool:
                raise AssertionError("a disabled budget measured the result")

            def encode(self, *args: Any, **kwargs: Any) -> bytes:
                raise AssertionError("a disabled budget measured the result")

        original = ToolResult("c1", Untouchable("x" * 100_000), "t")

        async def huge(c: ToolCall, ctx: RunContext[Any]) -> ToolResult:
            return original

        layer = ToolResultBudget(0)
        assert await run_tool_layer(layer, call("t", id="c1"), next=huge) is original
        messages = (AssistantMessage("", (ToolCall("c1", "t"),)), original)
        relief = await layer.relieve(messages, RunContext.new(), HeuristicCounter(), need=10)
        assert relief.messages is messages and relief.freed_tokens == 0

    async def test_in_an_agent_the_history_and_the_model_see_the_budgeted_result(self) -> None:
        tool = FakeTool("dump", returns="é" * 10_000)
        model = ScriptedModel([reply("", call("dump")), "done"])
        agent = Agent(model=model, tools=[tool.tool], middleware=[ToolResultBudget(1000)])
        async with Session(agent) as session:
            await session.run("dump it")
        result = session.conversation_messages[2]
        assert isinstance(result, ToolResult)
        assert size(result.content) <= 1000
        assert model.requests[1].messages[-1] is result
        check_pairing(session.conversation_messages, allow_pending=False)


class TestToolResultBudgetPolicy:
    """As a pressure policy it budgets every result already in a history."""

    def test_is_a_pressure_policy(self) -> None:
        assert isinstance(ToolResultBudget(), PressurePolicy)

    async def test_relieve_budgets_old_results_and_keeps_pairing(self) -> None:
        history = (
            UserMessage("go"),
            AssistantMessage("", (ToolCall("a", "t"), ToolCall("b", "t"))),
            ToolResult("a", "x" * 5000, "t"),
            ToolResult("b", "short", "t"),
            AssistantMessage("done"),
        )
        counter = HeuristicCounter()
        with capture_events() as events:
            relief = await ToolResultBudget(300).relieve(
                history, RunContext.new(), counter, need=100
            )
        check_pairing(relief.messages, allow_pending=False)
        assert relief.messages[3] is history[3] and relief.messages[0] is history[0]
        assert size(relief.messages[2].text) <= 300
        assert relief.freed_tokens == counter.count_messages(history) - counter.count_messages(
            relief.messages
        )
        assert relief.detail["results_truncated"] == 1
        assert [e.where for e in events if isinstance(e, ToolResultTruncated)] == ["history"]

    def test_budget_history_returns_the_same_tuple_when_nothing_changes(self) -> None:
        history = (UserMessage("hi"), AssistantMessage("", (ToolCall("a", "t"),)))
        history += (ToolResult("a", "ok", "t"),)
        new, stats = budget_history(history, 100)
        assert new is history and stats.results_truncated == 0

    def test_a_cut_that_would_cost_tokens_is_skipped(self) -> None:
        from tinyctx.tokens import MemoCounter

        class MarkerHeavy(MemoCounter):
            """ASCII costs two tokens a character, CJK one: an ASCII marker is expensive."""

            def count_text(self, text: str) -> int:
                return sum(2 if ord(c) < 128 else 1 for c in text)

        # 40 CJK characters are 120 bytes; cut to 100 bytes, the ASCII marker costs more
        # tokens than the characters it replaces
        history = (AssistantMessage("", (ToolCall("a", "t"),)), ToolResult("a", "中" * 40, "t"))
        new, stats = budget_history(history, 100, counter=MarkerHeavy())
        assert new is history and stats.freed_tokens == 0
        new, _ = budget_history(history, 100)  # without a counter: bytes are all that count
        assert size(new[1].text) <= 100

    @given(history=histories(text=SHORT_MIXED), budget=st.integers(1, 200))
    def test_pairing_and_budget_hold_for_any_history(self, history: Any, budget: int) -> None:
        new, stats = budget_history(history, budget, counter=HeuristicCounter())
        check_pairing(new)
        assert [type(m) for m in new] == [type(m) for m in history]
        for before, after in zip(history, new, strict=True):
            if after is not before:
                assert isinstance(after, ToolResult) and size(after.text) <= budget
                assert after.tool_call_id == before.tool_call_id  # type: ignore[attr-defined]
                # images and documents pass whole and in order: no byte cut of base64
                assert media_parts(after.content) == media_parts(before.content)  # type: ignore[attr-defined]
        assert stats.freed_tokens >= 0


class TestBudgetWithParts:
    """Images and documents are whole units: only a result's text is budgeted."""

    def test_images_kept_whole_text_cut(self) -> None:
        """A result with a screenshot and a long text keeps the image and cuts the text."""
        image = image_part(1280, 800, "image/jpeg", label="screenshot")
        result = ToolResult("c1", [TextPart("x" * 5000), image, TextPart("tail")], "shot")
        new, stats = _budgeted(result, 1000, "")
        assert stats.truncated and size(new.text) <= 1000
        assert media_parts(new.content) == (image,) and new.content[1] is image
        assert stats.original_bytes == size(result.text)

    def test_small_text_with_large_image_untouched(self) -> None:
        """A big image alone never triggers a cut: its base64 is not text."""
        result = ToolResult("c1", [TextPart("ok"), image_part(2560, 1600, "image/webp")])
        new, stats = _budgeted(result, 100, "")
        assert new is result and not stats.truncated


class TestShrinkToolResults:
    """The last-resort policy cuts every result, the newest too, just enough to fit."""

    def _history(self, sizes: list[int]) -> tuple[Message, ...]:
        calls = tuple(ToolCall(f"c{i}", "read") for i in range(len(sizes)))
        return (
            UserMessage("read them all"),
            AssistantMessage("", calls),
            *(ToolResult(f"c{i}", "x" * size, "read") for i, size in enumerate(sizes)),
        )

    async def test_frees_what_is_needed_with_the_largest_budget(self) -> None:
        from tinyctx import RunContext
        from tinyctx.middleware import ShrinkToolResults

        counter = HeuristicCounter()
        history = self._history([20_000, 20_000, 300])
        policy = ShrinkToolResults(floor_bytes=512)
        relief = await policy.relieve(history, RunContext.new(), counter, need=3_000)
        assert relief.freed_tokens >= 3_000
        budget = relief.detail["budget_bytes"]
        assert 512 <= budget < 20_000
        assert len(relief.messages) == len(history)
        check_pairing(relief.messages, allow_pending=False)
        # the largest such budget: one byte more would not free enough
        tighter = await policy.relieve(
            history, RunContext.new(), counter, need=relief.freed_tokens + 50
        )
        assert tighter.detail["budget_bytes"] <= budget
        assert relief.messages[-1] is history[-1]  # small results stay as they were

    async def test_never_below_the_floor_and_nothing_to_do_is_a_no_op(self) -> None:
        from tinyctx import RunContext
        from tinyctx.middleware import ShrinkToolResults

        counter = HeuristicCounter()
        history = self._history([5_000])
        relief = await ShrinkToolResults(floor_bytes=1_000).relieve(
            history, RunContext.new(), counter, need=10**9
        )
        assert size(relief.messages[-1].text) <= 1_000
        assert relief.detail["budget_bytes"] == 1_000
        unchanged = await ShrinkToolResults().relieve(history, RunContext.new(), counter, need=0)
        assert unchanged.messages is history and unchanged.freed_tokens == 0

    async def test_keep_recent_leaves_the_newest_turns_whole(self) -> None:
        """keep_recent=1 cuts only the results before the newest tool-call turn; with fewer
        turns than it keeps, it does nothing; a bad value names the field."""
        from tinyctx.middleware import ShrinkToolResults

        counter = HeuristicCounter()
        older = self._history([20_000, 20_000])
        newest = (AssistantMessage("", (ToolCall("n", "read"),)), ToolResult("n", "y" * 20_000))
        history = older + newest
        policy = ShrinkToolResults(floor_bytes=512, keep_recent=1)
        relief = await policy.relieve(history, RunContext.new(), counter, need=3_000)
        assert relief.freed_tokens >= 3_000
        assert relief.messages[-2:] == newest and relief.messages[-1] is newest[-1]
        assert all(size(m.text) < 20_000 for m in relief.messages[2:4])
        check_pairing(relief.messages, allow_pending=False)
        alone = await policy.relieve(older, RunContext.new(), counter, need=3_000)
        assert alone.messages is older and alone.freed_tokens == 0
        with pytest.raises(ConfigError, match="keep_recent"):
            ShrinkToolResults(keep_recent=-1)

    async def test_a_second_relief_leaves_the_results_cut_before_alone(self) -> None:
        """Once results were cut, the next relief cuts only the newer ones when they free
        enough (the prefix up to the last cut stays as it was, cached); else all of them."""
        from tinyctx.middleware import ShrinkToolResults

        counter = HeuristicCounter()
        policy = ShrinkToolResults(floor_bytes=512)
        first = await policy.relieve(
            self._history([20_000, 20_000]), RunContext.new(), counter, need=3_000
        )
        later = (
            UserMessage("and these"),
            AssistantMessage("", (ToolCall("d0", "read"), ToolCall("d1", "read"))),
            ToolResult("d0", "z" * 20_000, "read"),
            ToolResult("d1", "z" * 20_000, "read"),
        )
        history = first.messages + later
        most = (await policy.relieve(later, RunContext.new(), counter, need=10**9)).freed_tokens
        with capture_events(ToolResultTruncated) as events:
            second = await policy.relieve(history, RunContext.new(), counter, need=most - 100)
        assert second.freed_tokens >= most - 100
        assert all(a is b for a, b in zip(second.messages, first.messages, strict=False))
        assert all(size(m.text) < 20_000 for m in second.messages[-2:])
        assert sorted(e.tool_call_id for e in events) == ["d0", "d1"]
        deeper = await policy.relieve(history, RunContext.new(), counter, need=most + 100)
        assert deeper.freed_tokens >= most + 100
        assert size(deeper.messages[2].text) < size(first.messages[2].text)
        check_pairing(deeper.messages, allow_pending=False)

    @given(history=histories(text=SHORT_MIXED), need=st.integers(0, 400))
    async def test_pairing_and_tokens_for_any_history(self, history: Any, need: int) -> None:
        from tinyctx import RunContext
        from tinyctx.middleware import ShrinkToolResults

        counter = HeuristicCounter()
        relief = await ShrinkToolResults(floor_bytes=8).relieve(
            history, RunContext.new(), counter, need=need
        )
        check_pairing(relief.messages)
        assert [type(m) for m in relief.messages] == [type(m) for m in history]
        assert counter.count_messages(relief.messages) <= counter.count_messages(history)

    @given(history=histories(text=SHORT_MIXED), need=st.integers(1, 400))
    async def test_the_search_cuts_as_budget_history_does_at_the_budget_it_chose(
        self, history: Any, need: int
    ) -> None:
        """The search's history is exactly budget_history's at the budget it reports."""
        from tinyctx import RunContext
        from tinyctx.middleware import ShrinkToolResults

        counter = HeuristicCounter()
        relief = await ShrinkToolResults(floor_bytes=8).relieve(
            history, RunContext.new(), counter, need=need
        )
        if not relief.detail:
            return
        budget = relief.detail["budget_bytes"]
        again, stats = budget_history(history, budget, counter=counter)
        assert again == relief.messages and stats.freed_tokens == relief.freed_tokens

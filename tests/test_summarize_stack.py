"""Stacked summaries (``Summarize(keep_summaries=N)``): earlier summaries stay verbatim in
front, each relief summarizes only what follows them, and the stack is bounded."""

from __future__ import annotations

from collections.abc import Sequence
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
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.conversation import Conversation
from tinyctx.messages import check_pairing, safe_boundaries
from tinyctx.middleware import ExtractiveSummarizer, Summarize
from tinyctx.middleware.budget import policy_role
from tinyctx.middleware.stacks import DEFAULT_KEEP_SUMMARIES, default_stack, seed_order_stack
from tinyctx.middleware.summarize import is_summary, summarize_history, summary_split
from tinyctx.testing import FakeTool, ScriptedModel, assert_pairing_intact, call, reply
from tinyctx.testing.strategies import histories
from tinyctx.tokens import default_counter

# a property needs no second backend: the trio run proves it, other tests cover asyncio
TRIO_ONLY = pytest.mark.parametrize("anyio_backend", ["trio"])


class Numbered:
    """A summarizer whose every summary is distinct (``gist 1``, ``gist 2``, ...)."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[tuple[Message, ...]] = []

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
        self.calls += 1
        self.seen.append(tuple(messages))
        return f"gist {self.calls}"


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
        self.calls += 1
        raise RuntimeError("provider down")


def summary(text: str) -> UserMessage:
    return UserMessage(
        f"[auto-compacted] Summary of 3 earlier messages:\n{text}",
        metadata={"tinyctx": {"summary": {"messages": 3, "summarizer": "Numbered"}}},
    )


def turns(count: int, start: int = 0, size: int = 30) -> list[Message]:
    out: list[Message] = []
    for i in range(start, start + count):
        tool_call = ToolCall(f"c{i}", "search", {"q": i})
        out += [
            UserMessage(f"question {i} " * size),
            AssistantMessage("", (tool_call,)),
            ToolResult(tool_call.id, f"result {i} " * size, "search"),
        ]
    return out


def front(messages: Sequence[Message]) -> tuple[int, int]:
    """``(lead, end)``: the leading system messages, and a task kept in front of a
    summary, end at ``lead``; the summaries that follow them at ``end``."""
    lead = 0
    while lead < len(messages) and isinstance(messages[lead], SystemMessage):
        lead += 1
    if (
        lead + 1 < len(messages)
        and isinstance(messages[lead], UserMessage)
        and not is_summary(messages[lead])
        and is_summary(messages[lead + 1])
    ):
        lead += 1  # the task
    end = lead
    while end < len(messages) and is_summary(messages[end]):
        end += 1
    return lead, end


class TestSplit:
    """Where a stacking summary starts: after at most keep_summaries earlier summaries."""

    def test_the_stack_stays_in_front_up_to_the_bound(self) -> None:
        """Up to keep_summaries leading summaries are left out of what is summarized."""
        history = (SystemMessage("s"), summary("a"), summary("b"), *turns(4))
        assert summary_split(history, keep_recent=3) == (1, 12)
        assert summary_split(history, keep_recent=3, keep_summaries=2) == (3, 12)
        assert summary_split(history, keep_recent=3, keep_summaries=5) == (3, 12)

    def test_past_the_bound_the_stack_is_folded(self) -> None:
        """More leading summaries than keep_summaries are all summarized again."""
        history = (SystemMessage("s"), summary("a"), summary("b"), *turns(4))
        assert summary_split(history, keep_recent=3, keep_summaries=1) == (1, 12)

    def test_a_fold_takes_the_whole_stack(self) -> None:
        """Folding summarizes every summary of the stack, even into the kept tail."""
        history = (summary("a"), summary("b"), summary("c"), *turns(1))
        assert summary_split(history, keep_recent=5, keep_summaries=2) == (0, 3)
        assert summary_split(history, keep_recent=5, keep_summaries=3) is None

    def test_the_stack_follows_a_kept_task(self) -> None:
        """With keep_task the stack starts after the task."""
        history = (SystemMessage("s"), UserMessage("task"), summary("a"), *turns(3))
        assert summary_split(history, keep_recent=3, keep_task=True, keep_summaries=1) == (3, 9)

    def test_a_summary_behind_other_messages_is_no_stack(self) -> None:
        """Only the summaries right at the front stack; without keep_task a task before
        them is summarized, and the summary with it."""
        history = (UserMessage("task"), summary("a"), *turns(3))
        assert summary_split(history, keep_recent=3, keep_summaries=3) == (0, 8)

    def test_bad_keep_summaries(self) -> None:
        """A negative or non-integer bound is refused, naming the field."""
        for value in (-1, True, 1.5, "2"):
            with pytest.raises(ConfigError, match="keep_summaries"):
                summary_split(tuple(turns(3)), keep_recent=1, keep_summaries=value)


class TestSummarizeHistory:
    """The new summary goes right after the stack; the stack is left as it was."""

    async def test_a_new_summary_lands_after_the_stack(self) -> None:
        """Two stacked summaries stay verbatim; the third covers only what followed them."""
        stack = (SystemMessage("s"), summary("a"), summary("b"))
        history = (*stack, *turns(4))
        summarizer = Numbered()
        new, stats = await summarize_history(
            history, summarizer, RunContext.new(), keep_recent=3, keep_summaries=2
        )
        assert new[:3] == stack and is_summary(new[3]) and "gist 1" in new[3].text
        assert not any(is_summary(m) for m in summarizer.seen[0])
        assert stats.lead == 3 and new[4:] == history[stats.split :]

    async def test_folding_rolls_every_earlier_summary_into_one(self) -> None:
        """Past the bound, one summary replaces the stack and the head after it."""
        history = (SystemMessage("s"), summary("alpha"), summary("beta"), *turns(4))
        new, _ = await summarize_history(
            history, ExtractiveSummarizer(), RunContext.new(), keep_recent=3, keep_summaries=1
        )
        assert [is_summary(m) for m in new[:3]] == [False, True, False]
        assert "alpha" in new[1].text and "beta" in new[1].text


class TestExtractiveFold:
    """Folding a stack leaves room for the new part in an extractive summary."""

    def test_earlier_summaries_share_one_allowance(self) -> None:
        """Many earlier summaries together take about as much room as one, and each of
        them, the goals and the tool calls all appear within the budget."""
        summarizer = ExtractiveSummarizer()  # 1000 tokens
        earlier = [summary(f"part{i} " + "detail " * 200) for i in range(4)]
        text = summarizer.extract([*earlier, *turns(2)])
        assert default_counter().count_text(text) <= 1000
        assert all(f"part{i}" in text for i in range(4))
        assert "User goals" in text and "search(" in text
        one = summarizer.extract([earlier[0], *turns(2)])
        section = text.split("User goals")[0]
        assert len(section) <= len(one.split("User goals")[0]) + 4 * 16


class TestStackProperties:
    """Across repeated reliefs on generated conversations the stack holds its promises."""

    @TRIO_ONLY
    @given(
        history=histories(min_turns=6, max_turns=40, media=0.0),
        keep=st.integers(0, 3),
        keep_task=st.booleans(),
        rounds=st.integers(3, 10),
        share=st.floats(0.05, 0.7),
        data=st.data(),
    )
    async def test_reliefs_keep_pairing_the_stack_and_its_bound(
        self,
        history: tuple[Message, ...],
        keep: int,
        keep_task: bool,
        rounds: int,
        share: float,
        data: st.DataObject,
    ) -> None:
        """Each relief keeps every call with its result, leaves the earlier summaries in
        front unchanged (or folds them all into one when there are more than
        keep_summaries, or they would fill half of what the relief keeps), and never
        leaves more than keep_summaries + 1 summaries in front."""
        counter = default_counter()
        layer = Summarize(
            ExtractiveSummarizer(max_tokens=24),
            keep_task=keep_task,
            keep_summaries=keep,
            counter=counter,
        )
        safe = [i for i, ok in enumerate(safe_boundaries(history)) if ok and i > 0]
        cuts = sorted(
            set(data.draw(st.lists(st.sampled_from(safe), min_size=rounds, max_size=rounds)))
        )
        current: tuple[Message, ...] = ()
        start = 0
        for end in cuts:
            current = (*current, *history[start:end])
            start = end
            need = max(1, int(counter.count_messages(current) * share))
            ctx = RunContext.new(conversation=Conversation(current))
            relief = await layer.relieve(current, ctx, counter, need=need)
            new = relief.messages
            assert_pairing_intact(new, current)
            check_pairing(new)
            lead, end_before = front(current)
            lead_after, end_after = front(new)
            assert end_after - lead_after <= keep + 1
            if relief.detail.get("applied"):
                stacked = current[lead:end_before]
                stays = (
                    len(stacked) <= keep
                    and counter.count_messages(stacked) * 2
                    <= counter.count_messages(current) - need
                )
                if stacked and stays:
                    assert new[:end_before] == current[:end_before]
                    assert is_summary(new[end_before])
                elif stacked:
                    assert end_after - lead_after == 1
            else:
                assert new is current
            current = new

    @TRIO_ONLY
    @given(
        history=histories(min_turns=2, max_turns=16, media=0.0),
        stacked=st.integers(0, 4),
        keep=st.integers(0, 3),
        need=st.integers(1, 5000),
    )
    async def test_a_failed_summary_changes_nothing(
        self, history: tuple[Message, ...], stacked: int, keep: int, need: int
    ) -> None:
        """A failing summarizer leaves any history, stack included, exactly as it was."""
        lead = 1 if history and isinstance(history[0], SystemMessage) else 0
        current = (
            *history[:lead],
            *(summary(f"s{i}") for i in range(stacked)),
            *history[lead:],
        )
        ctx = RunContext.new(conversation=Conversation(current))
        snapshot = ctx.conversation.messages
        summarizer = Failing()
        layer = Summarize(summarizer, keep_summaries=keep)
        relief = await layer.relieve(current, ctx, default_counter(), need=need)
        assert relief.messages is current
        assert relief.detail["failed"] is (summarizer.calls == 1)
        assert ctx.conversation.messages is snapshot


class TestTheTaskStays:
    """A task kept in front of a summary stays there on later reliefs."""

    async def test_a_task_kept_once_is_kept_while_the_history_shrinks(self) -> None:
        """Once in front of a summary, the task is not summarized for being over an eighth
        of a shorter history: the cached prefix up to it and the stack after it survive."""
        counter = default_counter()
        task = UserMessage("the task " * 60)
        history = (SystemMessage("s"), task, summary("a"), *turns(3, size=10))
        assert counter.count_message(task) * 8 > counter.count_messages(history)
        layer = Summarize(Numbered(), keep_task=True, keep_summaries=2, counter=counter)
        ctx = RunContext.new(conversation=Conversation(history))
        relief = await layer.relieve(history, ctx, counter, need=50)
        assert relief.messages[:3] == history[:3] and is_summary(relief.messages[3])


class TestAsALayer:
    """On its own trigger, the layer stacks too, and persists each summary once."""

    async def test_a_session_stacks_then_folds(self) -> None:
        """Over a long run the summaries pile up in front in order, up to the bound, and
        the conversation never holds more than keep_summaries + 1 of them."""
        summarizer = Numbered()
        tool = FakeTool("search", returns="result " * 60)
        script = [reply(f"step {i}", call("search", q=i)) for i in range(20)] + ["done"]
        model = ScriptedModel(script)
        layer = Summarize(summarizer, trigger_tokens=600, keep_recent=4, keep_summaries=2)
        agent = Agent(model=model, tools=[tool.tool], middleware=[layer])
        seen: list[list[str]] = []
        async with Session(agent) as session:
            result = await session.run("research this")
        assert result.final_text == "done"
        for request in model.requests:
            check_pairing(request.messages, allow_pending=False)
            _, end = front(request.messages)
            seen.append([m.text.rsplit("\n", 1)[-1] for m in request.messages[:end]])
            assert end <= 3
        assert ["gist 1", "gist 2", "gist 3"] in seen  # stacked, in order
        assert summarizer.calls >= 4 and ["gist 4"] in seen  # then folded into one
        assert any(is_summary(m) for m in summarizer.seen[3])  # the fold saw the stack

    @pytest.mark.parametrize("value", [-1, True, 2.0, "3", None])
    def test_bad_keep_summaries(self, value: Any) -> None:
        """Summarize refuses a bound that is not an integer >= 0, naming the field."""
        with pytest.raises(ConfigError, match="Summarize.keep_summaries"):
            Summarize(Numbered(), keep_summaries=value)


class TestDefaultStack:
    """default_stack and seed_order_stack summarize with a bounded stack."""

    def test_the_named_stacks_stack_summaries(self) -> None:
        """Their summary policy keeps the task and DEFAULT_KEEP_SUMMARIES summaries."""
        for factory in (default_stack, seed_order_stack):
            guard = factory()[-1]
            (policy,) = [p for p in guard.policies if policy_role(p) == "summarize"]
            assert isinstance(policy, Summarize)
            assert policy.keep_task and policy.keep_summaries == DEFAULT_KEEP_SUMMARIES
            (folding,) = [
                p for p in factory(keep_summaries=0)[-1].policies if policy_role(p) == "summarize"
            ]
            assert isinstance(folding, Summarize) and folding.keep_summaries == 0
        with pytest.raises(ConfigError, match="Summarize.keep_summaries"):
            default_stack(keep_summaries=-1)

    async def test_a_long_run_stacks_its_summaries(self) -> None:
        """Relieving a long run in a small window, default_stack with the summarize-first
        order (its default trims first) leaves several summaries in front, the earlier ones
        unchanged from one request to the next."""
        tool = FakeTool("search", returns="result line\n" * 150)
        script = [reply(f"step {i}", call("search", q=i)) for i in range(60)] + ["done"]
        model = ScriptedModel(script)
        stack = default_stack(order="default")
        agent = Agent(model=model, tools=[tool.tool], middleware=stack)
        config = RunConfig(max_tokens=8_000, reserved_output_tokens=1_000, max_model_calls=100)
        async with Session(agent, config=config) as session:
            await session.run("research this " * 5)
        fronts = []
        for request in model.requests:
            check_pairing(request.messages, allow_pending=False)
            lead, end = front(request.messages)
            fronts.append(request.messages[lead:end])
        assert max(len(f) for f in fronts) >= 2
        assert max(len(f) for f in fronts) <= DEFAULT_KEEP_SUMMARIES + 1
        for before, after in zip(fronts, fronts[1:], strict=False):
            if len(after) > len(before):
                assert after[: len(before)] == before  # stacked: the earlier ones unchanged

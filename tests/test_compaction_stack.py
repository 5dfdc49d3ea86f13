"""The three compaction layers together: any order, any history, pairing always intact."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import Agent, Layer, Message, ModelRequest, RunContext, Session, ToolResult
from tinyctx.chain import compose
from tinyctx.conversation import Conversation
from tinyctx.messages import check_pairing
from tinyctx.middleware import ExtractiveSummarizer, Microcompact, Summarize, ToolResultBudget
from tinyctx.middleware.microcompact import microcompact_history
from tinyctx.middleware.policy import PressurePolicy
from tinyctx.middleware.summarize import is_summary, summarize_history
from tinyctx.middleware.tool_result_budget import budget_history
from tinyctx.testing import FakeTool, ScriptedModel, assert_pairing_intact, call, reply
from tinyctx.testing.strategies import histories
from tinyctx.tokens import HeuristicCounter

TRIO_ONLY = pytest.mark.parametrize("anyio_backend", ["trio"])

operations = st.lists(
    st.one_of(
        st.tuples(st.just("budget"), st.integers(1, 120)),
        st.tuples(st.just("microcompact"), st.integers(0, 4)),
        st.tuples(st.just("summarize"), st.integers(0, 8)),
    ),
    min_size=1,
    max_size=5,
)


def size(text: str) -> int:
    return len(text.encode("utf-8"))


class TestFunctionsInAnyOrder:
    """Each pure function, and any sequence of them, keeps every call paired."""

    @TRIO_ONLY
    @given(history=histories(), ops=operations)
    async def test_any_sequence_of_the_three_functions_keeps_pairing(
        self, history: Any, ops: list[tuple[str, int]]
    ) -> None:
        ctx = RunContext.new()
        counter = HeuristicCounter()
        current = history
        for name, value in ops:
            before = current
            if name == "budget":
                current, _ = budget_history(current, value, counter=counter)
            elif name == "microcompact":
                current, _ = microcompact_history(current, keep_recent=value, counter=counter)
            else:
                current, _ = await summarize_history(
                    current, ExtractiveSummarizer(120), ctx, keep_recent=value, counter=counter
                )
            assert_pairing_intact(current, before)
            check_pairing(current, allow_pending=False)

    @TRIO_ONLY
    @given(history=histories(), order=st.permutations([0, 1, 2]), need=st.integers(0, 500))
    async def test_as_guard_policies_in_any_order(
        self, history: Any, order: list[int], need: int
    ) -> None:
        policies: list[PressurePolicy] = [
            ToolResultBudget(64),
            Microcompact(keep_recent=1),
            Summarize(ExtractiveSummarizer(100), trigger_tokens=1, keep_recent=3),
        ]
        ctx = RunContext.new(conversation=Conversation(history))
        counter = HeuristicCounter()
        current = history
        for index in order:
            policy = policies[index]
            assert isinstance(policy, PressurePolicy)
            relief = await policy.relieve(current, ctx, counter, need=need)
            assert_pairing_intact(relief.messages, current)
            freed = counter.count_messages(current) - counter.count_messages(relief.messages)
            assert relief.freed_tokens == freed >= 0
            if not relief.changed:
                assert relief.messages is current
            current = relief.messages
        assert ctx.conversation.messages == history  # policies leave committing to the guard


def stack(order: list[int], budget: int, keep: int, summary_keep: int) -> list[Layer]:
    layers: list[Layer] = [
        ToolResultBudget(budget),
        Microcompact(keep_recent=keep),
        Summarize(ExtractiveSummarizer(150), trigger_tokens=60, keep_recent=summary_keep),
    ]
    return [layers[i] for i in order]


class TestLayersInAnyOrder:
    """The layers composed in any order, on any history, send and keep valid histories."""

    @TRIO_ONLY
    @given(
        history=histories(),
        order=st.permutations([0, 1, 2]),
        keep=st.integers(0, 3),
        summary_keep=st.integers(0, 6),
    )
    async def test_model_onion_of_the_three_in_any_order(
        self, history: Any, order: list[int], keep: int, summary_keep: int
    ) -> None:
        ctx = RunContext.new(conversation=Conversation(history))
        model = ScriptedModel(["ok"], repeat_last=True)
        onion = compose(stack(order, 100, keep, summary_keep), model)
        await onion(ModelRequest(messages=ctx.conversation.messages), ctx)
        (sent,) = model.requests
        check_pairing(sent.messages, allow_pending=False)
        check_pairing(ctx.conversation.messages, allow_pending=False)
        # everything persisted maps back: the conversation is what the model was sent
        assert sent.messages == ctx.conversation.messages

    @given(
        plan=st.lists(st.integers(1, 3), min_size=1, max_size=7),
        outputs=st.lists(st.text(max_size=300), min_size=1, max_size=5),
        order=st.permutations([0, 1, 2]),
        budget=st.sampled_from([0, 40, 200]),
        keep=st.integers(0, 3),
        summary_keep=st.integers(0, 6),
    )
    async def test_a_session_with_the_three_in_any_order(
        self,
        plan: list[int],
        outputs: list[str],
        order: list[int],
        budget: int,
        keep: int,
        summary_keep: int,
    ) -> None:
        produced = iter(outputs * 30)
        tool = FakeTool("t", returns=lambda arguments: next(produced))
        script: list[Any] = [reply("", *(call("t", n=i) for i in range(n))) for n in plan]
        model = ScriptedModel([*script, "done"])
        agent = Agent(
            model=model, tools=[tool.tool], middleware=stack(order, budget, keep, summary_keep)
        )
        async with Session(agent) as session:
            result = await session.run("go")
        assert result.final_text == "done"
        for request in model.requests:
            check_pairing(request.messages, allow_pending=False)
        final = session.conversation_messages
        check_pairing(final, allow_pending=False)
        if budget:
            for message in final:
                if isinstance(message, ToolResult):
                    assert size(message.content) <= budget


class TestTheStackOnARun:
    """A realistic run with the three layers: results capped, old ones cleared, summarized."""

    async def test_budget_then_microcompact_then_summary(self) -> None:
        tool = FakeTool("read_file", returns="line of a long file\n" * 500)
        # ids of their own: call()'s default ids grow with every call made in the process
        # before, and this history sits near where a summary starts to pay (the first
        # test of a process got ids a digit shorter, and every summary was refused)
        script = [
            reply(f"reading part {i}", call("read_file", id=f"read_{i:02d}", part=i))
            for i in range(12)
        ]
        model = ScriptedModel([*script, "All parts read."])
        layers: list[Layer] = [
            ToolResultBudget(2048),
            Microcompact(keep_recent=3),
            Summarize(ExtractiveSummarizer(400), trigger_tokens=1500, keep_recent=6),
        ]
        agent = Agent(model=model, tools=[tool.tool], middleware=layers)
        async with Session(agent) as session:
            run = await session.run("read every part of the file")
        final: tuple[Message, ...] = session.conversation_messages
        check_pairing(final, allow_pending=False)
        assert is_summary(final[0])
        assert "read every part of the file" in final[0].text
        results = [m for m in final if isinstance(m, ToolResult)]
        assert all(size(r.content) <= 2048 for r in results)
        kinds = {event.kind for event in run.events}
        assert {
            "compaction.tool_result_budget",
            "compaction.microcompact",
            "compaction.summary",
        } <= kinds
        counter = HeuristicCounter()
        uncompacted = 12 * counter.count_text("line of a long file\n" * 500)
        for request in model.requests:
            check_pairing(request.messages, allow_pending=False)
            assert counter.count_request(request) < min(4000, uncompacted // 5)


class TestDefaultStackRelief:
    """default_stack's relief shrinks older results to excerpts before clearing them whole."""

    def test_the_shrink_comes_before_microcompaction_and_can_be_left_out(self) -> None:
        """The guard's policies hold ShrinkToolResults(keep_recent=1) right before
        Microcompact; shrink_first=False leaves it out; the budget keeps room for whole
        results (room 0.8, up to 30% of the window)."""
        from tinyctx.middleware import BudgetGuard, ShrinkToolResults
        from tinyctx.middleware.stacks import default_stack

        budget, guard = default_stack()
        assert isinstance(budget, ToolResultBudget) and isinstance(guard, BudgetGuard)
        assert (budget.room, budget.room_fraction, budget.window_fraction) == (0.8, 0.3, 0.1)
        kinds = [type(p) for p in guard.policies]
        at = kinds.index(Microcompact)
        shrink = guard.policies[at - 1]
        assert isinstance(shrink, ShrinkToolResults) and shrink.keep_recent == 1
        assert isinstance(guard.policies[-1], ShrinkToolResults)  # the last resort stays
        assert guard.policies[-1].keep_recent == 0
        _, plain = default_stack(shrink_first=False)
        assert isinstance(plain, BudgetGuard)
        assert [type(p) for p in plain.policies].count(ShrinkToolResults) == 1

    @pytest.mark.parametrize("shrink_first", [True, False])
    async def test_a_relief_keeps_the_head_of_an_old_result_it_would_have_cleared(
        self, shrink_first: bool
    ) -> None:
        """In a small window, the relief cuts an old large result to its head (its first
        line survives); without the shrink, microcompaction clears it to the placeholder."""
        from tinyctx import RunConfig
        from tinyctx.middleware.microcompact import DEFAULT_PLACEHOLDER
        from tinyctx.middleware.stacks import default_stack

        old = "FIRST_LINE_of_the_old_result\n" + "word " * 1200  # ~2,000 tokens: enters whole
        tools = [FakeTool("read", returns=old), FakeTool("ls", returns="a.py " * 400)]
        turns: list[Any] = [reply("", call("read"))]
        turns += [reply("", call("ls")) for _ in range(12)]
        turns.append("done")
        agent = Agent(
            model=ScriptedModel(turns),
            tools=[t.tool for t in tools],
            middleware=default_stack(relief_run=0, low_water=0.6, shrink_first=shrink_first),
        )
        config = RunConfig(max_tokens=9_000, reserved_output_tokens=0)
        async with Session(agent, config=config) as session:
            await session.run("go")
            results = [m for m in session.conversation_messages if isinstance(m, ToolResult)]
        first = results[0].text
        assert first != old
        if shrink_first:
            assert first.startswith("FIRST_LINE_of_the_old_result")
        else:
            assert first == DEFAULT_PLACEHOLDER

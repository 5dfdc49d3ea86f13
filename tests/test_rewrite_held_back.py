"""A lone compaction layer rewrites the history only when the rewrite makes the request fit:
a clear or a summary that would leave it over the window is held back, so an overflowing
stretch of a conversation costs one break of the cached prefix, not one per call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    AssistantMessage,
    Message,
    ModelRequest,
    RunConfig,
    RunContext,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.conversation import Conversation
from tinyctx.middleware import Microcompact, Summarize
from tinyctx.middleware.microcompact import MicrocompactApplied, microcompact_history
from tinyctx.middleware.summarize import SummaryApplied, SummaryFailed, is_summary
from tinyctx.middleware.triggers import fits_after
from tinyctx.testing import ScriptedModel, capture_events, run_layer
from tinyctx.testing.strategies import histories
from tinyctx.tokens import HeuristicCounter

COUNTER = HeuristicCounter()
BIG = "result line\n" * 50
HUGE = "a line of a very long file\n" * 600
TRIO_ONLY = pytest.mark.parametrize("anyio_backend", ["trio"])


class Recording:
    """A summarizer that answers a short gist and records what it was asked."""

    def __init__(self) -> None:
        self.seen: list[tuple[Message, ...]] = []

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
        self.seen.append(tuple(messages))
        return "the gist"


def turn(index: int, content: str) -> list[Message]:
    call = ToolCall(f"c{index}", "read", {"path": f"f{index}"})
    return [AssistantMessage(f"step {index}", (call,)), ToolResult(call.id, content, "read")]


def windowed(history: tuple[Message, ...], usable: int) -> RunContext[Any]:
    return RunContext.new(RunConfig(max_tokens=usable), conversation=Conversation(history))


def tokens(messages: Sequence[Message]) -> int:
    return COUNTER.count_request(ModelRequest(messages=tuple(messages)))


class TestFitsAfter:
    """A rewrite is worth its break when it leaves the request within the window."""

    def test_within_the_window_or_no_window(self) -> None:
        assert fits_after(100, 100) and fits_after(10**9, None)
        assert not fits_after(101, 100)


class TestMicrocompactHoldsBackAClearThatCannotFit:
    """Clearing that leaves the request over the window waits for the clear that fits."""

    async def test_over_after_clearing_nothing_changes_then_one_batch_clears_all(self) -> None:
        first = (
            SystemMessage("sys"),
            UserMessage("task"),
            *[m for i in range(4) for m in turn(i, BIG)],
            *turn(4, HUGE),  # the newest turn: protected by keep_recent=1
        )
        _, stats = microcompact_history(first, keep_recent=1, counter=COUNTER)
        usable = tokens(first) - stats.freed_tokens - 1  # over even once cleared
        ctx = windowed(first, usable)
        layer = Microcompact(keep_recent=1, counter=COUNTER)
        model = ScriptedModel(["ok"], repeat_last=True)
        request = ModelRequest(messages=ctx.conversation.messages)
        with capture_events(MicrocompactApplied) as held:
            await run_layer(layer, request, ctx, model)
        assert model.requests[0] is request and ctx.conversation.messages == first
        assert held == []
        second = (*first, *turn(5, "ok"))  # the large result has aged out of keep_recent
        ctx.conversation.replace(second)
        with capture_events(MicrocompactApplied) as applied:
            await run_layer(layer, ModelRequest(messages=second), ctx, model)
        expected, _ = microcompact_history(second, keep_recent=1, counter=COUNTER)
        assert model.requests[1].messages == expected == ctx.conversation.messages
        assert [e.results_cleared for e in applied] == [5]
        assert tokens(expected) <= usable

    async def test_a_clear_held_back_by_clear_at_least_is_made_once_it_frees_enough(
        self,
    ) -> None:
        """The results a small clear left alone are counted again on the next call."""
        first = (SystemMessage("sys"), UserMessage("task"), *turn(0, BIG), *turn(1, BIG))
        _, one = microcompact_history(first, keep_recent=1, counter=COUNTER)
        layer = Microcompact(
            keep_recent=1, counter=COUNTER, trigger=1, clear_at_least=one.freed_tokens + 1
        )
        ctx = RunContext.new(conversation=Conversation(first))
        model = ScriptedModel(["ok"], repeat_last=True)
        await run_layer(layer, ModelRequest(messages=first), ctx, model)
        assert model.requests[0].messages is first
        second = (*first, *turn(2, BIG))
        ctx.conversation.replace(second)
        with capture_events(MicrocompactApplied) as applied:
            await run_layer(layer, ModelRequest(messages=second), ctx, model)
        assert [e.results_cleared for e in applied] == [2]
        assert model.requests[1].messages == microcompact_history(second, 1, counter=COUNTER)[0]

    @TRIO_ONLY
    @given(history=histories(min_turns=2), keep=st.integers(0, 3), slack=st.floats(0.3, 1.2))
    async def test_a_rewritten_request_fits_the_window(
        self, history: tuple[Message, ...], keep: int, slack: float
    ) -> None:
        usable = max(1, int(tokens(history) * slack))
        ctx = windowed(history, usable)
        model = ScriptedModel(["ok"], repeat_last=True)
        request = ModelRequest(messages=history)
        await run_layer(Microcompact(keep_recent=keep, counter=COUNTER), request, ctx, model)
        sent = model.requests[0]
        assert sent is request or tokens(sent.messages) <= usable


class TestSummarizeHoldsBackASummaryThatCannotFit:
    """No summarizer call and no rewrite while the kept tail alone overflows the window."""

    async def test_over_with_the_tail_alone_then_one_summary_once_it_ages(self) -> None:
        chat = [m for i in range(6) for m in (UserMessage(f"q{i} " * 20), AssistantMessage("a"))]
        first = (SystemMessage("sys"), *chat, *turn(0, HUGE))
        usable = tokens((first[0], *first[-2:])) - 1  # the tail alone is over
        ctx = windowed(first, usable)
        summarizer = Recording()
        layer = Summarize(summarizer, keep_recent=2, counter=COUNTER)
        model = ScriptedModel(["ok"], repeat_last=True)
        request = ModelRequest(messages=first)
        with capture_events(SummaryApplied, SummaryFailed) as held:
            await run_layer(layer, request, ctx, model)
        assert model.requests[0] is request and ctx.conversation.messages == first
        assert (held, summarizer.seen) == ([], [])
        second = (*first, UserMessage("go on"), AssistantMessage("sure"))
        ctx.conversation.replace(second)
        with capture_events(SummaryApplied) as applied:
            await run_layer(layer, ModelRequest(messages=second), ctx, model)
        assert len(applied) == 1 and len(summarizer.seen) == 1
        assert summarizer.seen[0][-1].text == HUGE  # the large result went into the summary
        sent = model.requests[1].messages
        assert is_summary(sent[1]) and sent[2:] == second[-2:] == ctx.conversation.messages[2:]
        assert tokens(sent) <= usable

    async def test_with_no_window_a_token_trigger_still_summarizes(self) -> None:
        history = (SystemMessage("sys"), UserMessage("q " * 50), *turn(0, HUGE))
        summarizer = Recording()
        layer = Summarize(summarizer, trigger_tokens=10, keep_recent=2, counter=COUNTER)
        model = ScriptedModel(["ok"])
        await run_layer(layer, ModelRequest(messages=history), RunContext.new(), model)
        assert len(summarizer.seen) == 1 and is_summary(model.requests[0].messages[1])

    @TRIO_ONLY
    @given(history=histories(min_turns=2), keep=st.integers(1, 6), slack=st.floats(0.3, 1.2))
    async def test_a_summarized_request_fits_the_window(
        self, history: tuple[Message, ...], keep: int, slack: float
    ) -> None:
        """Counting the summary itself as nothing: the part the summary replaced aside,
        what was sent fits."""
        usable = max(1, int(tokens(history) * slack))
        ctx = windowed(history, usable)
        model = ScriptedModel(["ok"], repeat_last=True)
        request = ModelRequest(messages=history)
        layer = Summarize(Recording(), keep_recent=keep, counter=COUNTER, max_failures=0)
        await run_layer(layer, request, ctx, model)
        sent = model.requests[0].messages
        if sent is not history:
            assert tokens([m for m in sent if not is_summary(m)]) <= usable

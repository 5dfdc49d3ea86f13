"""Microcompaction: old tool results lose their content, never their message or pairing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.chain import compose
from tinyctx.conversation import Conversation
from tinyctx.messages import check_pairing, safe_boundaries, tool_turns
from tinyctx.middleware import Microcompact
from tinyctx.middleware.microcompact import (
    DEFAULT_PLACEHOLDER,
    SHORT_RESULT_TOKENS,
    MicrocompactApplied,
    MicrocompactStats,
    microcompact_history,
)
from tinyctx.middleware.policy import PressurePolicy
from tinyctx.testing import (
    FakeTool,
    ScriptedModel,
    assert_idempotent,
    assert_pairing_intact,
    call,
    capture_events,
    reply,
    run_layer,
)
from tinyctx.testing.strategies import histories
from tinyctx.tokens import HeuristicCounter

BIG = "result line\n" * 50  # 600 bytes


def turn(index: int, *contents: str, name: str = "search") -> list[Message]:
    calls = tuple(ToolCall(f"c{index}_{k}", name, {"q": index}) for k in range(len(contents)))
    results = [ToolResult(c.id, text, c.name) for c, text in zip(calls, contents, strict=True)]
    return [AssistantMessage(f"step {index}", calls), *results]


def build(turns: int, *, results: int = 1, content: str = BIG) -> tuple[Message, ...]:
    out: list[Message] = [SystemMessage("sys"), UserMessage("start")]
    for index in range(turns):
        out += turn(index, *([content] * results))
    out.append(AssistantMessage("done"))
    return tuple(out)


def results_of(history: Sequence[Message]) -> list[ToolResult]:
    return [m for m in history if isinstance(m, ToolResult)]


def cleared(message: Message) -> bool:
    return isinstance(message, ToolResult) and message.content == DEFAULT_PLACEHOLDER


class TestMicrocompactFunction:
    """Every result except the newest keep_recent turns' is cleared; nothing is removed."""

    def test_clears_all_but_the_newest_turns_and_keeps_every_message(self) -> None:
        history = build(8)
        new, stats = microcompact_history(history, keep_recent=5)
        assert len(new) == len(history)
        assert [type(m) for m in new] == [type(m) for m in history]
        assert [r.tool_call_id for r in results_of(new)] == [
            r.tool_call_id for r in results_of(history)
        ]
        assert [cleared(r) for r in results_of(new)] == [True] * 3 + [False] * 5
        kept_from = tool_turns(history)[-5].assistant_index
        assert new[kept_from:] == history[kept_from:]
        assert all(a is b for a, b in zip(new[kept_from:], history[kept_from:], strict=True))
        assert stats.turns_cleared == 3 and stats.results_cleared == 3
        first = results_of(new)[0]
        assert first.metadata["tinyctx"]["cleared"] == {
            "by": "microcompact",
            "original_bytes": 600,
        }

    def test_stats_count_bytes_and_tokens_freed(self) -> None:
        counter = HeuristicCounter()
        history = build(4, results=2)
        new, stats = microcompact_history(history, keep_recent=1, counter=counter)
        assert stats == MicrocompactStats(
            3, 6, 6 * (600 - len(DEFAULT_PLACEHOLDER)), stats.freed_tokens
        )
        assert stats.freed_tokens == counter.count_messages(history) - counter.count_messages(new)
        assert stats.freed_tokens > 0 and stats.changed

    def test_idempotent_already_cleared_results_are_skipped_and_not_counted(self) -> None:
        once, first = microcompact_history(build(8), keep_recent=2)
        twice, second = microcompact_history(once, keep_recent=2)
        assert twice is once
        assert second == MicrocompactStats() and not second.changed
        assert first.results_cleared == 6

    def test_results_cleared_elsewhere_are_not_counted(self) -> None:
        history = list(build(3))
        old = history[3]
        assert isinstance(old, ToolResult)
        history[3] = ToolResult(old.tool_call_id, DEFAULT_PLACEHOLDER, old.name)
        _, stats = microcompact_history(history, keep_recent=1)
        assert stats.results_cleared == 1  # turn 1 only; turn 0 was already cleared

    def test_a_multi_result_turn_counts_once_and_is_cleared_whole(self) -> None:
        history = build(3, results=3)
        new, stats = microcompact_history(history, keep_recent=1)
        assert (stats.turns_cleared, stats.results_cleared) == (2, 6)
        assert [cleared(r) for r in results_of(new)] == [True] * 6 + [False] * 3

    def test_exclude_tools_are_never_cleared(self) -> None:
        history = (
            UserMessage("go"),
            *turn(0, BIG, name="read_file"),
            *turn(1, BIG, name="search"),
            *turn(2, BIG, name="search"),
        )
        new, stats = microcompact_history(history, keep_recent=1, exclude_tools=("read_file",))
        assert not cleared(new[2]) and cleared(new[4])
        assert stats.results_cleared == 1

    def test_exclusion_uses_the_call_name_when_a_result_has_none(self) -> None:
        calls = (ToolCall("a", "read_file"), ToolCall("b", "search"))
        history = (
            AssistantMessage("", calls),
            ToolResult("b", BIG),  # no name on the results: the calls say which tool
            ToolResult("a", BIG),
            *turn(9, BIG),
        )
        new, _ = microcompact_history(history, keep_recent=1, exclude_tools={"read_file"})
        assert cleared(new[1]) and not cleared(new[2])

    def test_keep_recent_zero_clears_every_turn_and_large_keep_clears_none(self) -> None:
        history = build(4)
        new, stats = microcompact_history(history, keep_recent=0)
        assert all(cleared(r) for r in results_of(new)) and stats.turns_cleared == 4
        same, stats = microcompact_history(history, keep_recent=4)
        assert same is history and stats == MicrocompactStats()

    def test_plain_assistant_answers_are_not_turns(self) -> None:
        history = (*turn(0, BIG), AssistantMessage("a"), UserMessage("u"), AssistantMessage("b"))
        history += tuple(turn(1, BIG))
        new, _ = microcompact_history(history, keep_recent=1)
        assert cleared(new[1]) and not cleared(new[-1])

    def test_error_results_are_cleared_and_keep_their_flag(self) -> None:
        history = (
            AssistantMessage("", (ToolCall("a", "run"),)),
            ToolResult("a", BIG, "run", is_error=True),
            *turn(1, BIG),
        )
        new, _ = microcompact_history(history, keep_recent=1)
        assert cleared(new[1]) and new[1].is_error  # type: ignore[attr-defined]

    def test_results_no_longer_than_the_placeholder_are_kept(self) -> None:
        history = (*turn(0, "ok", "x" * len(DEFAULT_PLACEHOLDER), BIG), *turn(1, BIG))
        new, stats = microcompact_history(history, keep_recent=1)
        assert new[1] is history[1] and new[2] is history[2] and cleared(new[3])
        assert stats.results_cleared == 1

    def test_a_clear_that_would_not_lower_the_estimate_is_skipped(self) -> None:
        class Flat:
            """A counter for which every text costs the same: clearing frees nothing."""

            def count_text(self, text: str) -> int:
                return 1

            def count_message(self, message: Message) -> int:
                return 1

            def count_messages(self, messages: Sequence[Message]) -> int:
                return len(messages)

            def count_tools(self, tools: Sequence[Any]) -> int:
                return 0

            def count_request(self, request: ModelRequest) -> int:
                return len(request.messages)

        history = build(3)
        new, stats = microcompact_history(history, keep_recent=1, counter=Flat())
        assert new is history and stats == MicrocompactStats()

    def test_pending_calls_of_the_last_turn_are_left_alone(self) -> None:
        history = (*turn(0, BIG), *turn(1, BIG), AssistantMessage("", (ToolCall("p", "t"),)))
        new, _ = microcompact_history(history, keep_recent=1)
        assert cleared(new[1]) and cleared(new[3]) and new[-1] is history[-1]
        assert_pairing_intact(new, history)

    def test_results_of_a_tool_result_subclass_are_cleared_and_keep_their_type(self) -> None:
        @attrs.frozen(cache_hash=True)
        class SourcedResult(ToolResult):
            source: str = attrs.field(default="web", kw_only=True)

        calls = (ToolCall("a", "fetch"),)
        history = (AssistantMessage("", calls), SourcedResult("a", BIG, "fetch"), *turn(1, BIG))
        new, stats = microcompact_history(history, keep_recent=1)
        assert type(new[1]) is SourcedResult and cleared(new[1])
        assert new[1].source == "web"  # type: ignore[attr-defined]
        assert stats.results_cleared == 1

    def test_custom_placeholder(self) -> None:
        new, _ = microcompact_history(build(2), keep_recent=1, placeholder="[gone]")
        assert results_of(new)[0].content == "[gone]"

    def test_a_memo_reuses_cleared_copies_across_calls(self) -> None:
        memo: dict[int, Any] = {}
        history = build(4)
        first, _ = microcompact_history(history, keep_recent=1, memo=memo)
        second, stats = microcompact_history(history, keep_recent=1, memo=memo)
        assert stats.results_cleared == 3
        assert all(a is b for a, b in zip(first, second, strict=True))

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"keep_recent": -1}, "keep_recent"),
            ({"keep_recent": "5"}, "keep_recent"),
            ({"keep_recent": True}, "keep_recent"),
            ({"placeholder": ""}, "placeholder"),
            ({"exclude_tools": "search"}, "exclude_tools"),
            ({"exclude_tools": ("", "x")}, "exclude_tools"),
        ],
    )
    def test_bad_arguments_are_config_errors(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError, match=f"microcompact.{field}"):
            microcompact_history(build(1), **kwargs)
        with pytest.raises(ConfigError, match=f"Microcompact.{field}"):
            Microcompact(**kwargs)

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"keep_recent": -1}, "keep_recent"),
            ({"persist": "yes"}, "persist"),
            ({"counter": object()}, "counter"),
        ],
    )
    def test_bad_layer_config_is_a_config_error(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError, match=f"Microcompact.{field}"):
            Microcompact(**kwargs)


class TestMicrocompactProperties:
    """On any generated history: pairing, idempotence, monotone tokens, recent turns kept."""

    @given(history=histories(), keep=st.integers(0, 4))
    def test_pairing_call_ids_and_the_newest_turns_survive(self, history: Any, keep: int) -> None:
        new, stats = microcompact_history(history, keep_recent=keep, placeholder="[x]")
        assert_pairing_intact(new, history)
        check_pairing(new, allow_pending=False)
        assert [getattr(m, "tool_call_id", None) for m in new] == [
            getattr(m, "tool_call_id", None) for m in history
        ]
        changed = [a for a, b in zip(new, history, strict=True) if a is not b]
        assert all(isinstance(m, ToolResult) and m.content == "[x]" for m in changed)
        assert stats.results_cleared == len(changed)
        for recent in tool_turns(history)[len(tool_turns(history)) - keep :] if keep else []:
            for index in (recent.assistant_index, *recent.result_indices):
                assert new[index] is history[index]

    @given(history=histories(), keep=st.integers(0, 3), need=st.integers(1, 400))
    def test_with_a_need_it_clears_oldest_first_and_short_results_last(
        self, history: Any, keep: int, need: int
    ) -> None:
        counter = HeuristicCounter()
        everything, _ = microcompact_history(history, keep, counter=counter)
        savings = [
            (i, counter.count_message(a) - counter.count_message(b))
            for i, (a, b) in enumerate(zip(history, everything, strict=True))
            if a is not b
        ]
        order = [s for s in savings if s[1] > SHORT_RESULT_TOKENS]
        order += [s for s in savings if s[1] <= SHORT_RESULT_TOKENS]
        expected: set[int] = set()
        for index, saved in order:
            if sum(dict(savings)[i] for i in expected) >= need:
                break
            expected.add(index)
        out, stats = microcompact_history(history, keep, counter=counter, need=need)
        assert {i for i, (a, b) in enumerate(zip(history, out, strict=True)) if a is not b} == (
            expected
        )
        assert stats.freed_tokens >= min(need, sum(s for _, s in savings))
        assert_pairing_intact(out, history)

    @given(history=histories(), keep=st.integers(0, 4))
    def test_idempotent_and_never_increases_tokens(self, history: Any, keep: int) -> None:
        counter = HeuristicCounter()
        once = assert_idempotent(
            lambda h: microcompact_history(h, keep_recent=keep, placeholder="[x]", counter=counter)[
                0
            ],
            history,
        )
        assert microcompact_history(once, keep_recent=keep, placeholder="[x]")[0] is once
        before, after = counter.count_messages(history), counter.count_messages(once)
        assert after <= before
        assert (
            before - after
            == microcompact_history(history, keep, "[x]", counter=counter)[1].freed_tokens
        )
        # with the default, longer placeholder too
        assert (
            counter.count_messages(microcompact_history(history, keep, counter=counter)[0])
            <= before
        )


def context_with(history: Sequence[Message]) -> RunContext[None]:
    return RunContext.new(conversation=Conversation(history))


class TestMicrocompactLayer:
    """On the model onion: persist by default, transient on request, gated by the trigger."""

    async def test_persists_to_the_conversation_without_new_message_events(self) -> None:
        ctx = context_with(build(6))
        model = ScriptedModel(["ok"], repeat_last=True)
        request = ModelRequest(messages=ctx.conversation.messages)
        with capture_events() as events:
            await run_layer(Microcompact(keep_recent=2), request, ctx, model)
        sent = model.requests[0].messages
        assert sent is ctx.conversation.messages  # inner layers still see the snapshot
        assert sum(cleared(m) for m in sent) == 4
        assert ctx.conversation.queued_events == 0
        (event,) = [e for e in events if isinstance(e, MicrocompactApplied)]
        assert event.kind == "compaction.microcompact"
        assert (event.results_cleared, event.turns_cleared, event.persisted) == (4, 4, True)
        assert event.freed_tokens > 0 and event.bytes_freed > 0

    async def test_the_next_call_is_warm_same_history_no_event(self) -> None:
        ctx = context_with(build(6))
        layer = Microcompact(keep_recent=2)
        await run_layer(layer, ModelRequest(messages=ctx.conversation.messages), ctx)
        model = ScriptedModel(["ok"], repeat_last=True)
        request = ModelRequest(messages=ctx.conversation.messages)
        with capture_events() as events:
            await run_layer(layer, request, ctx, model)
        assert model.requests[0] is request
        assert not [e for e in events if isinstance(e, MicrocompactApplied)]

    async def test_transient_leaves_the_conversation_alone(self) -> None:
        history = build(6)
        ctx = context_with(history)
        model = ScriptedModel(["ok"], repeat_last=True)
        layer = Microcompact(keep_recent=2, persist=False)
        with capture_events() as events:
            for _ in range(2):
                await run_layer(layer, ModelRequest(messages=ctx.conversation.messages), ctx, model)
        assert ctx.conversation.messages == history
        assert sum(cleared(m) for m in model.requests[0].messages) == 4
        assert all(a is b for a, b in zip(model.requests[0].messages, model.requests[1].messages))
        flags = [e.persisted for e in events if isinstance(e, MicrocompactApplied)]
        assert flags == [False, False]

    async def test_a_token_trigger_leaves_a_small_history_untouched(self) -> None:
        history = build(6)
        counter = HeuristicCounter()
        estimate = counter.count_request(ModelRequest(messages=history))
        for threshold, touched in ((estimate + 1, False), (estimate, True)):
            ctx = context_with(history)
            model = ScriptedModel(["ok"], repeat_last=True)
            request = ModelRequest(messages=ctx.conversation.messages)
            layer = Microcompact(keep_recent=2, trigger=threshold, counter=counter)
            await run_layer(layer, request, ctx, model)
            assert (model.requests[0] is not request) is touched
            assert (ctx.conversation.messages != history) is touched

    async def test_under_the_trigger_nothing_but_the_estimate_is_computed(self) -> None:
        class Spy(HeuristicCounter):
            def __init__(self) -> None:
                super().__init__()
                self.calls: list[str] = []

            def count_request(self, request: ModelRequest) -> int:
                self.calls.append("request")
                return 10

            def count_message(self, message: Message) -> int:
                self.calls.append("message")
                return super().count_message(message)

            def count_text(self, text: str) -> int:
                self.calls.append("text")
                return super().count_text(text)

        spy = Spy()
        ctx = context_with(build(6))
        layer = Microcompact(keep_recent=1, trigger=11, counter=spy)
        request = ModelRequest(messages=ctx.conversation.messages)
        model = ScriptedModel(["ok"], repeat_last=True)
        await run_layer(layer, request, ctx, model)
        assert spy.calls == ["request"] and model.requests[0] is request

    async def test_persist_maps_back_when_an_outer_layer_injected_messages(self) -> None:
        history = build(5)
        ctx = context_with(history)
        injected = SystemMessage("retrieved context", essential=False)

        async def inject(
            request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
        ) -> ModelResponse:
            return await call_next(request.evolve(messages=(injected, *request.messages)), ctx)

        model = ScriptedModel(["ok"], repeat_last=True)
        onion = compose([inject, Microcompact(keep_recent=1)], model)
        await onion(ModelRequest(messages=ctx.conversation.messages), ctx)
        conversation = ctx.conversation.messages
        assert injected not in conversation and len(conversation) == len(history)
        assert sum(cleared(m) for m in conversation) == 4
        assert model.requests[0].messages[1:] == conversation

    async def test_relieve_clears_oldest_first_what_the_guard_needs(self) -> None:
        """As a policy it clears the oldest results until the need is met, no more."""
        history = build(6)
        counter = HeuristicCounter()
        layer = Microcompact(keep_recent=2, trigger=10**9)
        one = await layer.relieve(history, context_with(history), counter, need=1)
        assert [cleared(m) for m in results_of(one.messages)] == [True] + [False] * 5
        per_result = one.freed_tokens
        two = await layer.relieve(history, context_with(history), counter, need=per_result + 1)
        assert [cleared(m) for m in results_of(two.messages)] == [True, True] + [False] * 4

    async def test_relieve_clears_short_results_last(self) -> None:
        """A short old result (cheap to keep, dense in paths) outlives a newer long one."""
        history = (
            SystemMessage("sys"),
            UserMessage("start"),
            *turn(0, "/testbed/src/rules/std_L003.py\n" * 3),
            *turn(1, BIG),
            *turn(2, BIG),
            *turn(3, BIG),
        )
        counter = HeuristicCounter()
        layer = Microcompact(keep_recent=1, trigger=10**9)
        relief = await layer.relieve(history, context_with(history), counter, need=1)
        assert [cleared(m) for m in results_of(relief.messages)] == [False, True, False, False]

    async def test_relieve_clears_everything_it_may_and_touches_no_conversation(self) -> None:
        history = build(6)
        ctx = context_with(history)
        counter = HeuristicCounter()
        layer = Microcompact(keep_recent=2, trigger=10**9)
        assert isinstance(layer, PressurePolicy) and layer.name == "Microcompact"
        with capture_events() as events:
            relief = await layer.relieve(history, ctx, counter, need=10**9)
        assert sum(cleared(m) for m in relief.messages) == 4
        assert relief.freed_tokens == counter.count_messages(history) - counter.count_messages(
            relief.messages
        )
        assert relief.detail["results_cleared"] == 4
        assert ctx.conversation.messages == history
        assert [e.source for e in events if isinstance(e, MicrocompactApplied)] == ["policy"]
        again = await layer.relieve(relief.messages, ctx, counter, need=10**9)
        assert again.messages is relief.messages and not again.changed

    @pytest.mark.parametrize("anyio_backend", ["trio"])
    @given(history=histories(), keep=st.integers(0, 3), persist=st.booleans())
    async def test_call_after_call_the_layer_equals_the_function(
        self, history: Any, keep: int, persist: bool
    ) -> None:
        """The layer works only past what it compacted before; the outcome is the same."""
        cuts = [i for i, safe in enumerate(safe_boundaries(history)) if safe and i]
        ctx = context_with(())
        layer = Microcompact(keep_recent=keep, placeholder="[x]", persist=persist)
        model = ScriptedModel(["ok"], repeat_last=True)
        done = 0
        for cut in cuts:
            ctx.conversation.replace((*ctx.conversation.messages, *history[done:cut]))
            done = cut
            given_ = ctx.conversation.messages
            expected, stats = microcompact_history(given_, keep_recent=keep, placeholder="[x]")
            with capture_events() as events:
                await run_layer(layer, ModelRequest(messages=given_), ctx, model)
            assert model.requests[-1].messages == expected
            applied = [e for e in events if isinstance(e, MicrocompactApplied)]
            assert [(e.results_cleared, e.freed_tokens) for e in applied] == (
                [(stats.results_cleared, stats.freed_tokens)] if stats.changed else []
            )
            assert (ctx.conversation.messages == expected) is (persist or not stats.changed)

    async def test_in_a_session_old_results_are_cleared_as_the_run_goes(self) -> None:
        tool = FakeTool("search", returns=BIG)
        script = [reply(f"step {i}", call("search", q=i)) for i in range(6)] + ["done"]
        model = ScriptedModel(script)
        agent = Agent(model=model, tools=[tool.tool], middleware=[Microcompact(keep_recent=2)])
        async with Session(agent) as session:
            result = await session.run("research")
        assert result.final_text == "done"
        for request in model.requests:
            check_pairing(request.messages, allow_pending=False)
        final = session.conversation_messages
        check_pairing(final, allow_pending=False)
        # the last request cleared all but the two newest turns, and that stuck
        assert [cleared(r) for r in results_of(final)] == [True] * 4 + [False] * 2
        assert [cleared(r) for r in results_of(model.requests[-1].messages)] == [True] * 4 + [
            False
        ] * 2

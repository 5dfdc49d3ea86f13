"""The budget guard: trigger, policies in order, exhaustion, circuit breaker, persistence,
provider rejections, calibration from usage, window resolution, validation and env."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    ContextLimitExceeded,
    Event,
    EventSink,
    Message,
    ModelRequest,
    ModelResponse,
    RunConfig,
    RunContext,
    Session,
    SystemMessage,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.conversation import Conversation
from tinyctx.middleware import BudgetGuard, DropNonessential, Relief, TrimOldest, default_policies
from tinyctx.middleware.budget import (
    ORDERS,
    BreakerChanged,
    ContextExhausted,
    ContextPolicyApplied,
    ContextPolicyFailed,
    ContextPolicySkipped,
    ContextPressure,
    ProviderContextLimit,
    breaker_group,
    order_policies,
    policy_role,
)
from tinyctx.middleware.drop_nonessential import droppable_groups
from tinyctx.middleware.stacks import DEFAULT_RELIEF_RUN, default_stack, seed_order_stack
from tinyctx.replay import CallRow, replay_sync
from tinyctx.testing import (
    ScriptedModel,
    assert_pairing_intact,
    capture_events,
    reply,
    run_layer,
    strategies,
)
from tinyctx.testing.bpe import train_bpe
from tinyctx.tokens import HeuristicCounter, TokenizersCounter

COUNTER = HeuristicCounter()


def _ctx(messages: tuple[Message, ...] = (), **config: Any) -> RunContext[None]:
    return RunContext.new(
        RunConfig(**config),
        events=EventSink(logger=None),
        conversation=Conversation(messages),
    )


def _request(messages: tuple[Message, ...], **fields: Any) -> ModelRequest:
    return ModelRequest(messages=messages, **fields)


def _big(text: str, *, words: int = 100, essential: bool = True) -> UserMessage:
    return UserMessage(f"{text} " + "lorem ipsum " * words, essential=essential)


def _raw(request: ModelRequest) -> int:
    return COUNTER.count_request(request)


def _of(events: list[Event], kind: type[Event]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


class FakeSummarize:
    """A summarizing policy whose outcomes follow a script (True = succeed, False = raise)."""

    role = "summarize"
    breaker_group = "summarize"

    def __init__(self, script: list[bool], *, name: str = "Summarize") -> None:
        self.script = list(script)
        self.name = name
        self.calls = 0
        self.seen: list[tuple[Message, ...]] = []

    async def relieve(
        self, messages: tuple[Message, ...], ctx: RunContext[Any], counter: Any, *, need: int
    ) -> Relief:
        self.calls += 1
        self.seen.append(messages)
        ok = self.script.pop(0) if self.script else True
        if not ok:
            raise RuntimeError("summarizer model unavailable")
        systems = tuple(m for m in messages if isinstance(m, SystemMessage))
        rest = [m for m in messages if not isinstance(m, SystemMessage)]
        summary = UserMessage("[summary of earlier turns]")
        kept = (*systems, summary, *rest[-1:])
        freed = counter.count_messages(messages) - counter.count_messages(kept)
        return Relief(kept, freed, {"summarized": len(rest) - 1})


class NamedNoop:
    """A policy that frees nothing, with a given name and role (for order tests)."""

    def __init__(self, name: str, role: str | None = None) -> None:
        self.name = name
        if role is not None:
            self.role = role

    async def relieve(
        self, messages: tuple[Message, ...], ctx: RunContext[Any], counter: Any, *, need: int
    ) -> Relief:
        return Relief(messages, 0)


class OrphanMaker:
    """A broken policy: drops a tool result and leaves its call behind."""

    name = "OrphanMaker"

    async def relieve(
        self, messages: tuple[Message, ...], ctx: RunContext[Any], counter: Any, *, need: int
    ) -> Relief:
        return Relief(tuple(m for m in messages if not isinstance(m, ToolResult)), 10)


class TestBelowTrigger:
    """Under the trigger the request passes through untouched: the same object."""

    async def test_same_request_object_and_no_event(self) -> None:
        history = (SystemMessage("rules"), UserMessage("hello"))
        request = _request(history)
        model = ScriptedModel([reply("hi", usage=(50, 5))])
        guard = BudgetGuard(trigger=0.9, max_tokens=10_000, counter=COUNTER)
        ctx = _ctx(history)
        with capture_events() as events:
            await run_layer(guard, request, ctx, model)
        assert model.requests[0] is request
        assert _of(events, ContextPressure) == []
        assert ctx.conversation.messages == history
        stats = guard.stats(ctx)
        assert stats.actions["checks"] == 1 and stats.actions.get("pressure") is None
        assert stats.utilisation == pytest.approx(_raw(request) / 10_000)
        assert stats.window == 10_000 and stats.window_source == "layer"
        assert (stats.last_input_tokens, stats.last_output_tokens) == (50, 5)

    async def test_by_default_acts_only_on_a_request_that_would_not_fit(self) -> None:
        """The default trigger is the hard limit: a request that fits, even at 100% of the
        usable window, passes untouched; one token over it is relieved."""
        history = tuple(_big(f"m{i}", words=20) for i in range(6))
        request = _request(history)
        raw = _raw(request)
        for window, fires in ((raw, False), (raw - 1, True)):
            model = ScriptedModel(["ok"])
            guard = BudgetGuard(max_tokens=window, counter=COUNTER, policies=[TrimOldest(0)])
            with capture_events() as events:
                await run_layer(guard, request, _ctx(history), model)
            assert bool(_of(events, ContextPressure)) is fires, window
            assert (model.requests[0] is request) is not fires
            if fires:
                (pressure,) = _of(events, ContextPressure)
                assert pressure.trigger_tokens == window + 1

    async def test_fires_at_the_trigger_not_before(self) -> None:
        history = tuple(_big(f"m{i}", words=20) for i in range(6))
        request = _request(history)
        raw = _raw(request)
        for window, fires in ((math.floor(raw / 0.9), True), (math.floor(raw / 0.9) + 2, False)):
            model = ScriptedModel(["ok"])
            guard = BudgetGuard(
                trigger=0.9, max_tokens=window, counter=COUNTER, policies=[TrimOldest(0)]
            )
            with capture_events() as events:
                await run_layer(guard, request, _ctx(history), model)
            assert bool(_of(events, ContextPressure)) is fires, window


class TestWindow:
    """The window comes from the run config, the layer, the provider, then the table."""

    async def test_precedence(self) -> None:
        request = _request((UserMessage("hi"),), model="gpt-4")
        guard = BudgetGuard(trigger=0.9, max_tokens=50_000, counter=COUNTER)
        assert guard.resolve_window(request, _ctx(max_tokens=30_000))[::2] == (30_000, "config")
        assert guard.resolve_window(request, _ctx())[::2] == (50_000, "layer")
        table_guard = BudgetGuard(counter=COUNTER)
        ctx = _ctx()
        assert table_guard.resolve_window(request, ctx)[::2] == (8_192, "table")
        await run_layer(table_guard, request, ctx, ScriptedModel([_usage_reply(10, window=32_000)]))
        assert table_guard.resolve_window(request, ctx)[::2] == (32_000, "reported")
        assert table_guard.stats(ctx).window_source == "table"

    async def test_a_table_model_makes_the_guard_fire(self) -> None:
        """The seed's bug: the window was always unknown, so the guard never fired."""
        history = tuple(_big(f"turn {i}", words=200) for i in range(12))
        request = _request(history, model="gpt-4-0613")
        assert _raw(request) > 0.9 * 8_192
        model = ScriptedModel(["ok"])
        with capture_events() as events:
            await run_layer(BudgetGuard(counter=COUNTER), request, _ctx(history), model)
        (pressure,) = _of(events, ContextPressure)
        assert pressure.window == 8_192 and pressure.window_source == "table"
        assert _raw(model.requests[0]) <= math.floor(0.5 * 8_192)

    async def test_unknown_window_is_an_error_not_a_silent_pass(self) -> None:
        request = _request((UserMessage("hi"),), model="my-finetune")
        with pytest.raises(ConfigError, match="my-finetune") as info:
            await run_layer(BudgetGuard(), request, _ctx(), ScriptedModel(["ok"]))
        assert info.value.field == "max_tokens"
        guard = BudgetGuard(windows={"my-finetune": 4_000})
        assert guard.resolve_window(request, _ctx())[0] == 4_000

    def test_reserve_from_layer_config_or_request_settings(self) -> None:
        request = _request((UserMessage("hi"),), settings={"max_tokens": 1_000})
        assert (
            BudgetGuard(trigger=0.9, max_tokens=8_000).resolve_window(request, _ctx())[1] == 1_000
        )
        assert (
            BudgetGuard(trigger=0.9, max_tokens=8_000, reserved_output_tokens=500).resolve_window(
                request, _ctx()
            )[1]
            == 500
        )
        config_ctx = _ctx(max_tokens=8_000, reserved_output_tokens=2_000)
        assert BudgetGuard().resolve_window(request, config_ctx)[:2] == (8_000, 2_000)
        with pytest.raises(ConfigError, match="reserved_output_tokens"):
            BudgetGuard(trigger=0.9, max_tokens=900).resolve_window(request, _ctx())


def _usage_reply(input_tokens: int, *, window: int | None = None) -> ModelResponse:
    return ModelResponse(
        AssistantMessage("ok"), usage=Usage(input_tokens, 3, context_window=window)
    )


class TestPolicies:
    """Each policy alone, the order they run in, and what each action reports."""

    async def test_drop_nonessential_alone(self) -> None:
        doc = _big("retrieved", words=300, essential=False)
        history = (SystemMessage("rules"), doc, UserMessage("question?"))
        request = _request(history)
        guard = BudgetGuard(
            trigger=0.9, max_tokens=_raw(request), counter=COUNTER, policies=[DropNonessential()]
        )
        model = ScriptedModel(["ok"])
        with capture_events() as events:
            await run_layer(guard, request, _ctx(history), model)
        assert model.requests[0].messages == (history[0], history[2])
        (applied,) = _of(events, ContextPolicyApplied)
        assert applied.policy == "DropNonessential" and applied.detail == {"dropped": 1}
        assert applied.freed_tokens == COUNTER.count_message(doc)
        assert applied.estimate_after == applied.estimate_before - applied.freed_tokens

    async def test_trim_oldest_alone(self) -> None:
        history = (SystemMessage("rules"), *(_big(f"turn {i}") for i in range(6)))
        request = _request(history)
        guard = BudgetGuard(
            trigger=0.9, max_tokens=_raw(request), counter=COUNTER, policies=[TrimOldest(2)]
        )
        model = ScriptedModel(["ok"])
        await run_layer(guard, request, _ctx(history), model)
        sent = model.requests[0].messages
        assert sent[0] == history[0] and sent[-2:] == history[-2:]
        assert _raw(model.requests[0]) <= 0.5 * _raw(request)

    async def test_order_changes_the_outcome(self) -> None:
        old = _big("old but essential", words=200)
        doc = _big("retrieved doc", words=200, essential=False)
        history = (old, AssistantMessage("noted"), doc, UserMessage("and now?"))
        request = _request(history)
        window = math.floor(_raw(request) / 0.9)  # at the trigger: one big message must go
        outcomes = []
        for policies in ([DropNonessential(), TrimOldest(0)], [TrimOldest(0), DropNonessential()]):
            model = ScriptedModel(["ok"])
            guard = BudgetGuard(trigger=0.9, max_tokens=window, counter=COUNTER, policies=policies)
            await run_layer(guard, request, _ctx(history), model)
            outcomes.append(model.requests[0].messages)
        assert old in outcomes[0] and doc not in outcomes[0]
        assert old not in outcomes[1]
        assert outcomes[0] != outcomes[1]

    def test_default_and_seed_orders(self) -> None:
        assert [policy_role(p) for p in default_policies()] == [
            "drop",
            "images",
            "compact",
            "summarize",
            "trim",
        ]
        assert [type(p).__name__ for p in default_policies("seed")] == [
            "DropNonessential",
            "TrimOldest",
            "Summarize",
            "Microcompact",
        ]
        assert ORDERS["default"] == ("drop", "images", "compact", "summarize", "trim")
        assert ORDERS["seed"] == ("drop", "trim", "summarize", "compact")
        mixed = [
            NamedNoop("Summarize"),
            TrimOldest(),
            NamedNoop("Microcompact"),
            DropNonessential(),
        ]
        seed = BudgetGuard(policies=mixed, order="seed")
        assert [p.name for p in seed.policies] == [
            "DropNonessential",
            "TrimOldest",
            "Summarize",
            "Microcompact",
        ]
        default = order_policies(mixed, "default")
        assert [policy_role(p) for p in default] == ["drop", "compact", "summarize", "trim"]
        assert [policy_role(p) for p in BudgetGuard(order="seed").policies] == [
            "drop",
            "trim",
            "summarize",
            "compact",
        ]
        assert [p.name for p in BudgetGuard(policies=mixed).policies] == [p.name for p in mixed]
        assert breaker_group(NamedNoop("Summarize")) == "summarize"
        assert breaker_group(FakeSummarize([])) == "summarize"
        assert breaker_group(TrimOldest()) is None
        assert breaker_group(NamedNoop("Microcompact")) is None

    async def test_policies_stop_once_under_target(self) -> None:
        doc = _big("retrieved", words=300, essential=False)
        history = (doc, *(_big(f"turn {i}", words=10) for i in range(4)))
        request = _request(history)
        trim = TrimOldest(0)
        guard = BudgetGuard(
            trigger=0.9,
            max_tokens=_raw(request),
            counter=COUNTER,
            policies=[DropNonessential(), trim],
        )
        ctx = _ctx(history)
        with capture_events() as events:
            await run_layer(guard, request, ctx, ScriptedModel(["ok"]))
        assert [e.policy for e in _of(events, ContextPolicyApplied)] == ["DropNonessential"]
        assert guard.stats(ctx).actions["DropNonessential.applied"] == 1

    async def test_a_policy_that_breaks_pairing_is_a_failure_and_changes_nothing(self) -> None:
        call = ToolCall("c1", "search", {})
        history = (
            UserMessage("go " * 200),
            AssistantMessage("", (call,)),
            ToolResult("c1", "found " * 200),
            UserMessage("next"),
        )
        request = _request(history)
        model = ScriptedModel(["ok"])
        guard = BudgetGuard(
            trigger=0.9,
            max_tokens=_raw(request),
            counter=COUNTER,
            policies=[OrphanMaker(), TrimOldest(0)],
        )
        with capture_events() as events:
            await run_layer(guard, request, _ctx(history), model)
        (failed,) = _of(events, ContextPolicyFailed)
        assert failed.policy == "OrphanMaker" and "pairing" in failed.error
        assert_pairing_intact(model.requests[0].messages, history)


class TestExhaustion:
    """Still over the hard limit after every policy: a clear error, nothing changed."""

    async def test_error_names_the_numbers_and_history_is_kept(self) -> None:
        history = (
            SystemMessage("rules " * 600),
            _big("doc", words=50, essential=False),
            UserMessage("question"),
        )
        request = _request(history)
        ctx = _ctx(history)
        guard = BudgetGuard(
            trigger=0.9,
            max_tokens=1_000,
            reserved_output_tokens=200,
            counter=COUNTER,
            policies=[DropNonessential(), TrimOldest(0)],
        )
        model = ScriptedModel(["ok"])
        with capture_events() as events, pytest.raises(ContextLimitExceeded) as info:
            await run_layer(guard, request, ctx, model)
        error = info.value
        assert model.calls == 0
        assert (error.window, error.reserved, error.limit) == (1_000, 200, 800)
        assert error.estimate is not None and error.estimate > 800
        assert set(error.freed) == {"DropNonessential", "TrimOldest"}
        text = str(error)
        assert f"prompt of ~{error.estimate} tokens does not fit" in text
        assert "window 1000 - reserved output 200 = usable 800" in text
        assert "hard limit 800" in text
        assert f"DropNonessential freed {error.freed['DropNonessential']}" in text
        assert ctx.conversation.messages == history
        (exhausted,) = _of(events, ContextExhausted)
        assert exhausted.estimate == error.estimate and dict(exhausted.freed) == error.freed
        assert guard.stats(ctx).actions["exhausted"] == 1

    async def test_over_target_but_under_hard_limit_passes(self) -> None:
        history = (SystemMessage("rules " * 300), UserMessage("question"))
        request = _request(history)
        raw = _raw(request)
        guard = BudgetGuard(trigger=0.9, max_tokens=raw, counter=COUNTER, policies=[TrimOldest(0)])
        model = ScriptedModel(["ok"])
        await run_layer(guard, request, _ctx(history), model)
        assert model.requests[0].messages == (history[0],)


def _reading_transcript(turns: int, size: int) -> tuple[Message, ...]:
    """An agent reading one file per call: every call adds the same number of tokens."""
    messages: list[Message] = [SystemMessage("rules"), UserMessage("the task")]
    for i in range(turns):
        call = ToolCall(f"c{i:04d}", "read", {"path": f"src/f{i:04d}.py"})
        messages += [
            AssistantMessage("", (call,)),
            ToolResult(call.id, f"line {i:04d} " * size, "read"),
        ]
    return (*messages, AssistantMessage("done"))


def _relief_calls(transcript: tuple[Message, ...], **options: Any) -> list[CallRow]:
    """The replayed calls at which the guard relieved."""
    guard = BudgetGuard(
        max_tokens=8_000, counter=COUNTER, calibrate=False, policies=[TrimOldest(2)], **options
    )
    report = replay_sync(transcript, [guard], counter=COUNTER)
    assert report.error is None
    return [r for r in report.rows if any(isinstance(e, ContextPressure) for e in r.events)]


class TestReliefRun:
    """relief_run: a relief leaves room for that many calls at the rate the conversation
    grows, going below the low-water mark when it must, never below relief_floor."""

    def test_the_goal_follows_the_growth(self) -> None:
        """Slow growth keeps the mark; fast growth goes deeper; the floor bounds it."""
        guard = BudgetGuard(low_water=0.4, relief_run=20)
        assert guard.relief_goal(10_000, 12_000, None) == 4_000  # growth not known yet
        assert guard.relief_goal(10_000, 12_000, 100.0) == 4_000  # 20 calls fit above 0.4
        assert guard.relief_goal(10_000, 12_000, 350.0) == 3_000  # 10_000 - 20 * 350
        assert guard.relief_goal(10_000, 12_000, 5_000.0) == 2_000  # the floor, 0.2
        assert BudgetGuard(low_water=0.4).relief_goal(10_000, 12_000, 5_000.0) == 4_000  # off
        low = BudgetGuard(low_water=0.1, relief_run=20)
        assert low.relief_goal(10_000, 12_000, 5_000.0) == 1_000  # never above the mark

    @pytest.mark.parametrize("size", [40, 60])
    def test_reliefs_come_at_least_relief_run_calls_apart(self, size: int) -> None:
        """Growing the same every call, a relief buys relief_run calls, not a handful."""
        transcript = _reading_transcript(120, size)
        often = [r.index for r in _relief_calls(transcript, low_water=0.9)]
        rare = [r.index for r in _relief_calls(transcript, low_water=0.9, relief_run=20)]
        assert len(rare) >= 2 and len(often) > len(rare)
        assert min(b - a for a, b in zip(rare, rare[1:])) >= 20
        assert min(b - a for a, b in zip(often, often[1:])) < 20

    def test_the_floor_bounds_how_deep_a_relief_goes(self) -> None:
        """A run no window can hold relieves down to relief_floor, and no further."""
        transcript = _reading_transcript(120, 60)
        rows = _relief_calls(transcript, low_water=0.9, relief_run=1_000, relief_floor=0.3)
        assert rows  # the growth since the first call is known at the first relief
        for row in rows:
            assert 0.3 * 8_000 - 600 <= row.tokens <= 0.3 * 8_000

    def test_the_named_stacks_run_20_and_take_another(self) -> None:
        """default_stack and seed_order_stack relieve for 20 calls; relief_run= changes it."""
        for build in (default_stack, seed_order_stack):
            (guard,) = [layer for layer in build() if isinstance(layer, BudgetGuard)]
            assert guard.relief_run == DEFAULT_RELIEF_RUN == 20
            (off,) = [layer for layer in build(relief_run=0) if isinstance(layer, BudgetGuard)]
            assert off.relief_run == 0
            with pytest.raises(ConfigError, match="relief_run"):
                build(relief_run=-3)

    def test_a_transient_relief_measures_the_conversation_growth(self) -> None:
        """persist=False: the conversation keeps its size, so the growth is the turns', not
        the gap between the conversation and the relieved request (which hit the floor)."""
        transcript = _reading_transcript(120, 60)
        rows = _relief_calls(transcript, low_water=0.6, relief_run=20, persist=False)
        assert len(rows) > 20  # every call over the window is relieved on its way
        # one turn adds ~200 tokens: 20 of them fit above half the usable window
        assert all(0.4 * 8_000 < r.tokens <= 0.6 * 8_000 for r in rows)

    @given(
        history=strategies.histories(max_turns=24, text=st.text(max_size=300)),
        relief_run=st.integers(0, 40),
        low_water=st.floats(0.2, 1.0),
        fraction=st.floats(0.1, 1.0),
    )
    def test_every_call_fits_and_a_relief_reaches_at_least_the_mark(
        self, history: tuple[Message, ...], relief_run: int, low_water: float, fraction: float
    ) -> None:
        """On generated conversations: each call fits the window, each relief goes at least
        to the low-water mark, and pairing holds, whatever the run."""
        transcript = (*history, AssistantMessage("done"))
        window = max(300, math.ceil(COUNTER.count_messages(transcript) * fraction))
        guard = BudgetGuard(
            max_tokens=window,
            low_water=low_water,
            relief_run=relief_run,
            counter=COUNTER,
            calibrate=False,
            policies=[DropNonessential(), TrimOldest(0)],
        )
        report = replay_sync(transcript, [guard], counter=COUNTER)
        assert report.error is None  # TrimOldest(0) can always make room
        systems = sum(isinstance(m, SystemMessage) for m in transcript)
        reliefs = 0
        for row in report.rows:
            assert row.tokens <= window
            if any(isinstance(e, ContextPressure) for e in row.events):
                reliefs += 1
                # to the mark, unless only what no policy removes (the system prompt) is left
                assert row.tokens <= math.floor(low_water * window) or row.messages == systems
        event(f"reliefs: {min(reliefs, 3)}{'+' if reliefs >= 3 else ''}")
        assert_pairing_intact(report.final_messages, transcript)

    def test_a_relief_stops_at_what_no_policy_removes(self) -> None:
        """A system prompt bigger than the mark is kept: the relief ends above the mark,
        with the request inside the window (a case hypothesis found)."""
        system = SystemMessage("rules " * 40)
        prompt = COUNTER.count_messages((system,))
        window = 3 * prompt
        transcript = (system, UserMessage("x " * (4 * prompt)), AssistantMessage("done"))
        guard = BudgetGuard(
            max_tokens=window,
            low_water=0.2,
            counter=COUNTER,
            calibrate=False,
            policies=[DropNonessential(), TrimOldest(0)],
        )
        report = replay_sync(transcript, [guard], counter=COUNTER)
        assert report.error is None
        (row,) = [r for r in report.rows if any(isinstance(e, ContextPressure) for e in r.events)]
        assert row.messages == 1
        assert math.floor(0.2 * window) < row.tokens <= window

    def test_the_mark_survives_in_the_thread_state(self) -> None:
        """The growth since the last relief is durable state, like the calibration."""
        transcript = _reading_transcript(60, 60)
        guard = BudgetGuard(max_tokens=8_000, counter=COUNTER, relief_run=20)
        ctx = _ctx()
        state = guard._state(ctx)
        state.relief_mark = (5_000, 7)
        restored = type(state).from_json(state.to_json())
        assert restored.relief_mark == (5_000, 7)
        with pytest.raises(TypeError, match="relief_mark"):
            type(state).from_json({**state.to_json(), "relief_mark": [1]})
        assert replay_sync(transcript, [guard], counter=COUNTER).error is None


class TestTrimAfterSummary:
    """When summarizing fails, the trim keeps the earlier summary and the task in front of it."""

    async def test_the_model_still_sees_the_task_and_the_summary(self) -> None:
        task = UserMessage("the task: port the parser to the new grammar")
        summary = UserMessage(
            "[summary of turns 0-20]", metadata={"tinyctx": {"summary": {"messages": 20}}}
        )
        turns = tuple(_big(f"turn {i}", words=80) for i in range(8))
        request = _request((SystemMessage("rules"), task, summary, *turns))
        guard = BudgetGuard(
            trigger=0.9,
            max_tokens=_raw(request) // 2,
            counter=COUNTER,
            policies=[FakeSummarize([False]), TrimOldest(1)],
            persist=False,
        )
        model = ScriptedModel(["ok"])
        with capture_events() as events:
            await run_layer(guard, request, _ctx(request.messages), model)
        assert [e.policy for e in _of(events, ContextPolicyApplied)] == ["TrimOldest"]
        seen = model.requests[0].messages
        assert seen[:3] == request.messages[:3]  # the rules, the task, the summary
        assert seen[3:] == turns[-len(seen) + 3 :] and len(seen) < 3 + len(turns)
        assert COUNTER.count_request(model.requests[0]) <= _raw(request) // 2


class TestCircuitBreaker:
    """Three consecutive summarization failures skip it until a success."""

    @staticmethod
    def _setup(summarize: FakeSummarize, **options: Any) -> tuple[BudgetGuard, ModelRequest]:
        history = tuple(_big(f"turn {i}", words=60) for i in range(6))
        request = _request(history)
        guard = BudgetGuard(
            trigger=0.9,
            max_tokens=_raw(request),
            counter=COUNTER,
            policies=[summarize, TrimOldest(0)],
            persist=False,
            **options,
        )
        return guard, request

    async def test_trips_after_three_failures_and_resets_on_success(self) -> None:
        summarize = FakeSummarize([False, False, False, True])
        guard, request = self._setup(summarize, breaker_cooldown=1)
        ctx = _ctx(request.messages)
        model = ScriptedModel(["ok"], repeat_last=True)
        with capture_events() as events:
            for _ in range(3):
                await run_layer(guard, request, ctx, model)
        assert summarize.calls == 3
        assert all(seen == request.messages for seen in summarize.seen), "failures change nothing"
        assert [e.failures for e in _of(events, ContextPolicyFailed)] == [1, 2, 3]
        (opened,) = _of(events, BreakerChanged)
        assert (opened.group, opened.state, opened.failures) == ("summarize", "open", 3)
        assert guard.stats(ctx).breakers["summarize"].state == "open"
        # open: the next firing skips it (the trim still relieves the request)
        with capture_events() as events:
            await run_layer(guard, request, ctx, model)
        assert summarize.calls == 3
        (skipped,) = _of(events, ContextPolicySkipped)
        assert skipped.policy == "Summarize"
        assert guard.stats(ctx).breakers["summarize"].state == "half_open"
        # after the cooldown one trial runs; it succeeds and closes the breaker
        with capture_events() as events:
            await run_layer(guard, request, ctx, model)
        assert summarize.calls == 4
        (closed,) = _of(events, BreakerChanged)
        assert closed.state == "closed"
        stats = guard.stats(ctx)
        assert stats.breakers["summarize"].state == "closed"
        assert stats.breakers["summarize"].failures == 0
        assert stats.actions["Summarize.failed"] == 3 and stats.actions["Summarize.skipped"] == 1

    async def test_a_success_in_between_resets_the_count(self) -> None:
        summarize = FakeSummarize([False, False, True, False, False])
        guard, request = self._setup(summarize)
        ctx = _ctx(request.messages)
        model = ScriptedModel(["ok"], repeat_last=True)
        with capture_events() as events:
            for _ in range(5):
                await run_layer(guard, request, ctx, model)
        assert _of(events, BreakerChanged) == []
        assert guard.stats(ctx).breakers["summarize"].failures == 2
        assert summarize.calls == 5

    async def test_without_cooldown_it_stays_open_until_reset(self) -> None:
        summarize = FakeSummarize([False, False, False])
        guard, request = self._setup(summarize, breaker_cooldown=None)
        ctx = _ctx(request.messages)
        model = ScriptedModel(["ok"], repeat_last=True)
        for _ in range(10):
            await run_layer(guard, request, ctx, model)
        assert summarize.calls == 3
        guard.reset_breakers(ctx)
        await run_layer(guard, request, ctx, model)
        assert summarize.calls == 4

    def test_breaker_is_per_session(self) -> None:
        summarize = FakeSummarize([])
        guard, _ = self._setup(summarize)
        assert guard.stats(_ctx()).breakers == {}


class TestPersistence:
    """Persistent by default (conversation replaced quietly); transient on request."""

    async def test_persistent_replaces_the_conversation_without_message_events(self) -> None:
        history = tuple(_big(f"turn {i}") for i in range(6))
        ctx = _ctx(history)
        request = _request(ctx.conversation.messages)
        guard = BudgetGuard(
            trigger=0.9, max_tokens=_raw(request), counter=COUNTER, policies=[TrimOldest(1)]
        )
        model = ScriptedModel(["ok"])
        with capture_events() as events:
            await run_layer(guard, request, ctx, model)
        assert ctx.conversation.messages == model.requests[0].messages
        assert len(ctx.conversation.messages) < len(history)
        assert ctx.conversation.queued_events == 0
        assert all(e.persisted for e in _of(events, ContextPolicyApplied))
        assert guard.stats(ctx).actions["persisted"] == 1

    async def test_transient_leaves_the_history_alone(self) -> None:
        history = tuple(_big(f"turn {i}") for i in range(6))
        ctx = _ctx(history)
        request = _request(ctx.conversation.messages)
        guard = BudgetGuard(
            trigger=0.9,
            max_tokens=_raw(request),
            counter=COUNTER,
            policies=[TrimOldest(1)],
            persist=False,
        )
        model = ScriptedModel(["ok"])
        await run_layer(guard, request, ctx, model)
        assert ctx.conversation.messages == history
        assert len(model.requests[0].messages) < len(history)
        assert guard.stats(ctx).actions["transient"] == 1

    async def test_a_request_that_is_not_the_conversation_is_relieved_transiently(self) -> None:
        history = tuple(_big(f"turn {i}") for i in range(6))
        ctx = _ctx(history)
        injected = _request((SystemMessage("injected by an outer layer"), *history))
        guard = BudgetGuard(
            trigger=0.9, max_tokens=_raw(injected), counter=COUNTER, policies=[TrimOldest(1)]
        )
        await run_layer(guard, injected, ctx, ScriptedModel(["ok"]))
        assert ctx.conversation.messages == history
        assert guard.stats(ctx).actions["transient"] == 1

    async def test_in_an_agent_the_next_turn_starts_from_the_relieved_history(self) -> None:
        guard = BudgetGuard(trigger=0.9, max_tokens=600, counter=COUNTER, policies=[TrimOldest(2)])
        model = ScriptedModel([reply("answer " * 40)], repeat_last=True)
        agent = Agent(model, middleware=[guard])
        async with Session(agent) as session:
            for turn in range(8):
                await session.run(f"question {turn} " + "detail " * 30)
                assert COUNTER.count_request(model.requests[-1]) <= 600
            assert len(session.conversation_messages) < 16
            assert guard.stats(session.ctx).actions["persisted"] >= 1


class TestProviderRejection:
    """A provider ContextLimitExceeded is answered once: relieve harder, retry."""

    async def test_relieves_harder_and_retries_once(self) -> None:
        history = tuple(_big(f"turn {i}", words=50) for i in range(10))
        request = _request(history)
        limit = _raw(request) // 2
        sizes: list[int] = []

        async def strict_model(req: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            size = _raw(req)
            sizes.append(size)
            if size > limit:
                raise ContextLimitExceeded("prompt is too long", estimate=size * 2)
            return reply("ok")

        ctx = _ctx(history)
        guard = BudgetGuard(
            trigger=0.9, max_tokens=10 * _raw(request), counter=COUNTER, policies=[TrimOldest(1)]
        )
        with capture_events() as events:
            response = await run_layer(guard, request, ctx, strict_model)
        assert response.text == "ok"
        assert len(sizes) == 2 and sizes[1] <= limit
        (rejected,) = _of(events, ProviderContextLimit)
        assert rejected.retrying and rejected.provider_estimate == sizes[0] * 2
        assert _of(events, ContextPressure)[0].provider_rejected
        assert guard.stats(ctx).actions["provider_limit"] == 1
        assert ctx.conversation.messages == (history[-1],)

    async def test_a_second_rejection_propagates(self) -> None:
        history = tuple(_big(f"turn {i}", words=50) for i in range(4))
        model = ScriptedModel([ContextLimitExceeded("too long"), ContextLimitExceeded("still")])
        guard = BudgetGuard(
            trigger=0.9, max_tokens=100_000, counter=COUNTER, policies=[TrimOldest(1)]
        )
        with pytest.raises(ContextLimitExceeded, match="still"):
            await run_layer(guard, _request(history), _ctx(history), model)
        assert model.calls == 2

    async def test_nothing_left_to_relieve_reraises_the_provider_error(self) -> None:
        history = (UserMessage("only one"),)
        model = ScriptedModel([ContextLimitExceeded("too long")])
        guard = BudgetGuard(
            trigger=0.9, max_tokens=100_000, counter=COUNTER, policies=[TrimOldest(1)]
        )
        with pytest.raises(ContextLimitExceeded, match="too long"):
            await run_layer(guard, _request(history), _ctx(history), model)
        assert model.calls == 1

    async def test_can_be_switched_off(self) -> None:
        history = tuple(_big(f"turn {i}") for i in range(4))
        model = ScriptedModel([ContextLimitExceeded("too long")])
        guard = BudgetGuard(
            trigger=0.9, max_tokens=100_000, counter=COUNTER, retry_on_provider_limit=False
        )
        with pytest.raises(ContextLimitExceeded, match="too long"):
            await run_layer(guard, _request(history), _ctx(history), model)
        assert model.calls == 1


class TestCalibration:
    """Reported usage calibrates the estimate, even with a hidden system prompt."""

    async def test_converges_on_a_history_with_a_hidden_system_prompt(self) -> None:
        truth = TokenizersCounter(train_bpe())
        hidden = 900
        guard = BudgetGuard(trigger=0.9, max_tokens=1_000_000, counter=HeuristicCounter())
        errors: list[float] = []

        async def provider(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            real = truth.count_request(request) + hidden
            estimate = guard.stats(ctx).estimate
            assert estimate is not None
            errors.append(abs(estimate - real) / real)
            return ModelResponse(
                AssistantMessage("def f(x):\n    return x\n" * 3), usage=Usage(real, 9)
            )

        agent = Agent(provider, middleware=[guard], system_prompt="Answer in code.")
        async with Session(agent) as session:
            for turn in range(14):
                await session.run(f"Question {turn}: the quick brown fox? " * (1 + turn % 3))
            stats = guard.stats(session.ctx)
        assert errors[0] > 0.3, "before any usage the hidden prompt is invisible"
        assert max(errors[3:]) < 0.03
        assert stats.hidden_tokens is not None and stats.hidden_tokens > 0.5 * hidden
        assert 0.5 <= stats.calibration_ratio <= 2.0

    async def test_calibration_can_be_switched_off(self) -> None:
        guard = BudgetGuard(trigger=0.9, max_tokens=100_000, counter=COUNTER, calibrate=False)
        history = (UserMessage("hello"),)
        request = _request(history)
        ctx = _ctx(history)
        await run_layer(guard, request, ctx, ScriptedModel([reply("hi", usage=(5_000, 1))]))
        await run_layer(guard, request, ctx, ScriptedModel(["hi"]))
        assert guard.stats(ctx).estimate == _raw(request)


class TestStats:
    """Stats are per conversation: sessions of one agent, and sub-agents, keep their own."""

    async def test_sessions_of_one_agent_do_not_share_stats(self) -> None:
        guard = BudgetGuard(trigger=0.9, max_tokens=100_000, counter=COUNTER)
        agent = Agent(
            ScriptedModel([reply("ok", usage=(42, 2))], repeat_last=True), middleware=[guard]
        )
        async with Session(agent) as first, Session(agent) as second:
            await first.run("hi")
            await first.run("again")
            await second.run("hello")
            assert guard.stats(first.ctx).actions["checks"] == 2
            assert guard.stats(second.ctx).actions["checks"] == 1
            assert guard.stats(first.ctx).last_input_tokens == 42

    def test_a_sub_agent_conversation_has_its_own_state(self) -> None:
        guard = BudgetGuard(trigger=0.9, max_tokens=100_000)
        ctx = _ctx()
        child = ctx.derive(conversation=Conversation())
        assert guard.stats(ctx) is not guard.stats(child)
        assert guard._state(ctx) is not guard._state(child)
        assert guard._state(ctx) is guard._state(ctx.derive())


class TestValidation:
    """Bad configuration fails at construction, naming the field, value and allowed range."""

    @pytest.mark.parametrize(
        ("options", "field", "allowed"),
        [
            ({"max_tokens": 0}, "max_tokens", ">= 1"),
            ({"max_tokens": True}, "max_tokens", ">= 1"),
            ({"max_tokens": "8k"}, "max_tokens", ">= 1"),
            ({"reserved_output_tokens": -1}, "reserved_output_tokens", ">= 0"),
            (
                {"max_tokens": 100, "reserved_output_tokens": 100},
                "reserved_output_tokens",
                "< max_tokens",
            ),
            ({"trigger": 0}, "trigger", "(0, 1]"),
            ({"trigger": 0.95, "hard_limit": 0.9}, "trigger", "trigger <= hard_limit (0.9)"),
            ({"hard_limit": 1.2}, "hard_limit", "(0, 1]"),
            ({"hard_limit": float("nan")}, "hard_limit", "(0, 1]"),
            ({"low_water": 0.95, "trigger": 0.9}, "low_water", "low_water <= trigger"),
            ({"low_water": 0}, "low_water", "(0, 1]"),
            ({"policies": ["trim"]}, "policies[0]", "PressurePolicy"),
            ({"policies": [TrimOldest(), TrimOldest()]}, "policies[1].name", "unique"),
            ({"order": "lifo"}, "order", "default"),
            ({"order": ["drop", "drop"]}, "order", "distinct roles"),
            ({"counter": object()}, "counter", "TokenCounter"),
            ({"persist": "yes"}, "persist", "True or False"),
            ({"breaker_threshold": 0}, "breaker_threshold", ">= 1"),
            ({"breaker_cooldown": -1}, "breaker_cooldown", ">= 0"),
            ({"provider_retry_factor": 1.0}, "provider_retry_factor", "(0, 1)"),
            ({"windows": {"gpt": -5}}, "windows['gpt']", "> 0"),
            ({"relief_run": -1}, "relief_run", "integer >= 0 (calls"),
            ({"relief_run": 2.5}, "relief_run", "integer >= 0 (calls"),
            ({"relief_run": None}, "relief_run", "integer >= 0 (calls"),
            ({"relief_floor": 0}, "relief_floor", "(0, 1]"),
            ({"relief_floor": 1.5}, "relief_floor", "(0, 1]"),
        ],
    )
    def test_bad_option(self, options: dict[str, Any], field: str, allowed: str) -> None:
        with pytest.raises(ConfigError) as info:
            BudgetGuard(**options)
        assert info.value.field == field
        assert allowed in str(info.value)
        assert f"BudgetGuard.{field}=" in str(info.value)

    def test_defaults(self) -> None:
        guard = BudgetGuard()
        assert (guard.trigger, guard.hard_limit) == (1.0, 1.0)
        assert guard.low_water == 0.5
        assert guard.persist and guard.calibrate and guard.breaker_threshold == 3
        assert [p.name for p in guard.policies] == [
            "DropNonessential",
            "ClearOldImages",
            "Microcompact",
            "Summarize",
            "TrimOldest",
        ]


class TestFromEnv:
    """Environment overrides parse with the same validation; nothing invalid is ignored."""

    def test_reads_overrides(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("TINYCTX_CONTEXT_MAX_TOKENS", "32_000")
        monkeypatch.setenv("TINYCTX_CONTEXT_TRIGGER", "85%")
        monkeypatch.setenv("TINYCTX_CONTEXT_HARD_LIMIT", "0.95")
        monkeypatch.setenv("TINYCTX_CONTEXT_PERSIST", "off")
        monkeypatch.setenv("TINYCTX_CONTEXT_ORDER", "seed")
        monkeypatch.setenv("TINYCTX_CONTEXT_BREAKER_COOLDOWN", "none")
        monkeypatch.setenv("TINYCTX_CONTEXT_RELIEF_RUN", "25")
        monkeypatch.setenv("TINYCTX_CONTEXT_RELIEF_FLOOR", "15%")
        guard = BudgetGuard.from_env(reserved_output_tokens=1_000, trigger=0.5)
        assert guard.relief_run == 25 and guard.relief_floor == pytest.approx(0.15)
        assert guard.max_tokens == 32_000 and guard.reserved_output_tokens == 1_000
        assert guard.trigger == pytest.approx(0.85) and guard.hard_limit == 0.95
        assert not guard.persist and guard.breaker_cooldown is None
        assert [policy_role(p) for p in guard.policies] == ["drop", "trim", "summarize", "compact"]

    @pytest.mark.parametrize(
        ("variable", "value", "allowed"),
        [
            ("TRIGGER", "abc", "fraction in (0, 1]"),
            ("TRIGGER", "0", "fraction in (0, 1]"),
            ("TRIGGER", "150%", "fraction in (0, 1]"),
            ("TRIGGER", "nan", "fraction in (0, 1]"),
            ("HARD_LIMIT", "", "fraction in (0, 1]"),
            ("MAX_TOKENS", "12k", "integer >= 1"),
            ("MAX_TOKENS", "0", "integer >= 1"),
            ("RESERVED_OUTPUT_TOKENS", "-5", "integer >= 0"),
            ("RELIEF_RUN", "twenty", "integer >= 0"),
            ("PERSIST", "maybe", "boolean"),
            ("ORDER", "random", "one of"),
            ("BREAKER_THRESHOLD", "0", "integer >= 1"),
            ("TRIGER", "0.9", "known setting"),
        ],
    )
    def test_an_invalid_value_is_an_error(
        self, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, allowed: str
    ) -> None:
        monkeypatch.setenv(f"TINYCTX_CONTEXT_{variable}", value)
        with pytest.raises(ConfigError) as info:
            BudgetGuard.from_env()
        assert info.value.field == f"TINYCTX_CONTEXT_{variable}"
        assert info.value.value == value
        assert allowed in str(info.value)

    def test_trigger_must_stay_at_or_below_the_hard_limit(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("TINYCTX_CONTEXT_TRIGGER", "0.95")
        monkeypatch.setenv("TINYCTX_CONTEXT_HARD_LIMIT", "0.9")
        with pytest.raises(ConfigError, match="trigger <= hard_limit") as info:
            BudgetGuard.from_env()
        assert info.value.field == "TINYCTX_CONTEXT_TRIGGER"
        monkeypatch.setenv("TINYCTX_CONTEXT_MAX_TOKENS", "100")
        monkeypatch.setenv("TINYCTX_CONTEXT_TRIGGER", "0.8")
        with pytest.raises(ConfigError) as info:
            BudgetGuard.from_env(reserved_output_tokens=100)
        assert info.value.field == "reserved_output_tokens"

    def test_custom_prefix_and_environ(self) -> None:
        guard = BudgetGuard.from_env("APP_CTX_", environ={"APP_CTX_LOW_WATER": "0.5", "OTHER": "x"})
        assert guard.low_water == 0.5
        assert BudgetGuard.from_env(environ={}).trigger == 1.0


def _system_only(request: ModelRequest) -> ModelRequest:
    return request.evolve(
        messages=tuple(m for m in request.messages if isinstance(m, SystemMessage))
    )


class TestProperties:
    """On generated requests: the estimate passed on is under the target (or nothing is
    left to remove) or ContextLimitExceeded; pairing holds; non-essential goes first;
    system messages stay."""

    @given(
        request=strategies.requests(strategies.histories(max_turns=12, text=st.text(max_size=120))),
        utilisation=st.floats(0.2, 3.0),
        reserved=st.integers(0, 50),
    )
    async def test_guard_invariants(
        self, request: ModelRequest, utilisation: float, reserved: int
    ) -> None:
        raw = _raw(request)
        window = max(reserved + 1, math.ceil(raw / utilisation) + reserved)
        usable = window - reserved
        guard = BudgetGuard(
            trigger=0.9,
            max_tokens=window,
            reserved_output_tokens=reserved,
            counter=COUNTER,
            policies=[DropNonessential(), TrimOldest(0)],
            persist=False,
        )
        model = ScriptedModel(["ok"])
        ctx = _ctx(request.messages)
        with capture_events() as events:
            try:
                await run_layer(guard, request, ctx, model)
            except ContextLimitExceeded:
                event("exhausted")
                assert _raw(_system_only(request)) > math.floor(usable)
                assert model.calls == 0
                return
        assert _of(events, ContextPolicyFailed) == []
        (sent,) = model.requests
        before, after = request.messages, sent.messages
        assert_pairing_intact(after, before)
        kept = {id(m) for m in after}
        assert all(id(m) in kept for m in before if isinstance(m, SystemMessage))
        estimate = _raw(sent)
        event("untouched" if sent is request else "relieved")
        if sent is request:
            fired = raw >= 0.9 * usable
            assert not fired or (
                raw <= usable and all(isinstance(m, SystemMessage) for m in before)
            )
        else:
            only_system = all(isinstance(m, SystemMessage) for m in after)
            assert estimate <= math.floor(guard.low_water * usable) or (
                only_system and estimate <= usable
            )
        removed = [m for m in before if id(m) not in kept]
        if any(m.essential for m in removed):
            assert droppable_groups(after) == [], "an essential message went before a droppable one"

    @given(
        request=strategies.requests(strategies.histories(max_turns=12, text=st.text(max_size=120))),
        slack=st.integers(0, 300),
    )
    async def test_by_default_a_request_that_fits_is_never_touched(
        self, request: ModelRequest, slack: int
    ) -> None:
        """With its default trigger and policies the guard sends every request that fits the
        usable window as it is (no rewrite, no cached prefix broken)."""
        window = max(1, _raw(request) + slack)
        guard = BudgetGuard(max_tokens=window, reserved_output_tokens=0, counter=COUNTER)
        model = ScriptedModel(["ok"])
        ctx = _ctx(request.messages)
        with capture_events() as events:
            await run_layer(guard, request, ctx, model)
        assert model.requests[0] is request
        assert _of(events, ContextPressure) == []
        assert ctx.conversation.messages == request.messages


class TestRealSummarizeAsAPolicy:
    """The built-in Summarize reports failure in its Relief; the guard's breaker counts it."""

    async def test_breaker_trips_on_reported_summary_failures(self) -> None:
        from tinyctx.middleware import Summarize

        class Broken:
            async def summarize(self, messages: Any, ctx: Any) -> str:
                raise RuntimeError("summarizer down")

        history = tuple(UserMessage("x " * 400) for _ in range(30))
        guard = BudgetGuard(
            trigger=0.9,
            max_tokens=2000,
            policies=[Summarize(Broken(), keep_recent=2)],
            persist=False,
        )
        ctx = RunContext.new(events=EventSink(logger=None))
        request = ModelRequest(messages=history)
        with capture_events() as events:
            for _ in range(3):
                with pytest.raises(ContextLimitExceeded):
                    await run_layer(guard, request, ctx)
        failed = [e for e in events if e.kind == "context.policy_failed"]
        assert len(failed) == 3
        assert all("summarizer down" in e.error for e in failed)  # type: ignore[attr-defined]
        assert guard.stats(ctx).breakers["summarize"].state == "open"


class TestCalibrationAfterARewrite:
    """The guard's calibrated estimate follows a rewritten history, not the old report."""

    async def test_a_rewritten_history_is_not_judged_by_the_report_of_the_old_one(self) -> None:
        """The provider reported 90,000 tokens for a long history; the history is then
        rewritten to one short message: the estimate is that message's count scaled (at
        most max_ratio), not 90,000 less the estimate's difference."""
        from tinyctx import Agent, Session
        from tinyctx.testing import reply

        model = ScriptedModel([reply("a", usage=(90_000, 5)), reply("b")])
        guard = BudgetGuard(max_tokens=200_000, reserved_output_tokens=0, counter=COUNTER)
        async with Session(Agent(model=model, middleware=[guard])) as session:
            await session.run("read this " * 4_000)
            session.ctx.conversation.replace((UserMessage("short"),), emit_new=False)
            await session.run("and now?")
            estimate = guard.stats(session.ctx).estimate
        raw = COUNTER.count_request(model.requests[1])
        assert estimate is not None and estimate <= 2 * raw + 1

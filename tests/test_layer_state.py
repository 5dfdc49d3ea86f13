"""Durable layer state: per thread (with the conversation) and per run (with a checkpoint)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    Interrupt,
    Interrupted,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
)
from tinyctx.agent import Checkpoint
from tinyctx.messages import check_pairing
from tinyctx.middleware import BudgetGuard, CallLimits, SessionMemory, Summarize
from tinyctx.middleware.extractors import ExtractionJob
from tinyctx.middleware.summarize import SummaryFailed
from tinyctx.state import LayerStates, StateError, check_json
from tinyctx.testing import FakeTool, ScriptedModel, call, capture_events, reply, run_layer
from tinyctx.tokens import Calibration


class Tally:
    """A user-defined durable state: a count and the names seen."""

    def __init__(self) -> None:
        self.count = 0
        self.names: list[str] = []

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "names": list(self.names)}

    @classmethod
    def from_json(cls, data: Any) -> Tally:
        tally = cls()
        tally.count = data["count"]
        tally.names = list(data["names"])
        return tally


class Counting(Layer):
    """Counts model calls per thread and per run with the public state API."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        ctx.thread_state(self, Tally).count += 1
        ctx.run_state(self, Tally).count += 1
        return await call_next(request, ctx)


class ApproveAsk(Layer):
    """Pauses the run for approval whenever the model asks to call ``ask``."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        if any(c.name == "ask" for c in response.message.tool_calls):
            ctx.request_control(Interrupt("approval", "run ask?"))
        return response


class TestLayerStates:
    """The container keeps live state by layer name and restores stored JSON lazily."""

    def test_new_state_is_made_once_and_reused(self) -> None:
        """The factory runs on first use only; later calls get the same object."""
        states = LayerStates()
        layer = Counting()
        first = states.get(layer, Tally)
        first.count = 3
        assert states.get(layer, Tally) is first
        assert states.dump() == {"Counting": {"count": 3, "names": []}}

    def test_stored_state_is_restored_by_name(self) -> None:
        """Stored JSON is handed to from_json the first time the named layer asks."""
        states = LayerStates({"Counting": {"count": 7, "names": ["a"]}})
        assert "Counting" in states
        restored = states.get(Counting(), Tally)
        assert (restored.count, restored.names) == (7, ["a"])

    def test_untouched_stored_state_survives_a_dump(self) -> None:
        """State of a layer this process never asked for is written back unchanged."""
        states = LayerStates({"Other": {"x": 1}})
        states.get(Counting(), Tally).count = 1
        assert states.dump() == {"Counting": {"count": 1, "names": []}, "Other": {"x": 1}}

    def test_a_broken_document_names_the_layer(self) -> None:
        """A stored state its class cannot read raises StateError naming the layer."""
        states = LayerStates({"Counting": {"wrong": True}})
        with pytest.raises(StateError, match="'Counting'.*could not be restored.*KeyError"):
            states.get(Counting(), Tally)

    def test_state_without_to_json_is_refused(self) -> None:
        """Durable state must dump to JSON: a plain dict factory is refused clearly."""
        with pytest.raises(StateError, match="no to_json"):
            LayerStates().get(Counting(), dict)

    def test_two_classes_with_one_name_are_refused(self) -> None:
        """Two layers of different classes sharing a name cannot share state."""
        states = LayerStates()
        states.get(Counting(), Tally)
        impostor = ApproveAsk()
        impostor.name = "Counting"
        with pytest.raises(StateError, match="belongs to a Counting"):
            states.get(impostor, Tally)

    def test_non_json_state_is_refused_at_dump(self) -> None:
        """A to_json returning a non-JSON value fails naming the path."""

        class Bad:
            def to_json(self) -> Any:
                return {"when": {1, 2}}

        states = LayerStates()
        states.get("bad", Bad)
        with pytest.raises(StateError, match=r"bad\.when: set is not JSON"):
            states.dump()

    @given(
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner),
            max_leaves=10,
        )
    )
    def test_check_json_accepts_exactly_json(self, value: Any) -> None:
        """Whatever check_json accepts, json.dumps encodes and reads back equal."""
        check_json(value, "v")
        assert json.loads(json.dumps(value, allow_nan=False)) == value

    @given(st.sampled_from([float("inf"), float("-inf"), float("nan")]), st.text(max_size=5))
    def test_check_json_refuses_non_finite_numbers(self, number: float, key: str) -> None:
        """NaN and infinities have no JSON form: refused, naming the key."""
        with pytest.raises(StateError, match="not a finite number"):
            check_json({"outer": {key: [number]}}, "v")


class TestRunAndThreadState:
    """A run's state travels in its checkpoint; a thread's stays with its conversation."""

    async def test_run_state_travels_with_the_checkpoint(self) -> None:
        """An interrupted run's layer state is in Checkpoint.state, keyed by layer name."""
        model = ScriptedModel([reply("", call("ask")), "done"])
        agent = Agent(
            model=model, tools=[FakeTool("ask").tool], middleware=[Counting(), ApproveAsk()]
        )
        async with Session(agent, thread_id="t") as session:
            with pytest.raises(Interrupted) as info:
                await session.run("go")
            paused = info.value.checkpoint
            assert session.paused is paused
            assert paused.state == {"Counting": {"count": 1, "names": ()}}
            assert len(session.ctx.run_states) == 0  # held by the checkpoint, not the session
            await session.resume()
            assert len(session.ctx.run_states) == 0  # dropped when the run ended
            tally = session.ctx.thread_state(agent.middleware[0], Tally)
            assert tally.count == 2

    async def test_thread_state_lives_with_the_conversation(self) -> None:
        """A sub-context with its own conversation has its own thread state."""
        from tinyctx.conversation import Conversation

        ctx = RunContext.new()
        layer = Counting()
        ctx.thread_state(layer, Tally).count = 5
        other = ctx.derive(conversation=Conversation())
        assert other.thread_state(layer, Tally).count == 0
        assert ctx.derive().thread_state(layer, Tally).count == 5


class TestCallLimitsAcrossSessions:
    """The issue's repro: per-run limits hold across resumes in new sessions."""

    async def test_two_resumes_in_new_sessions_keep_the_run_limits(self) -> None:
        """model_calls=2 and per_tool ask=1 per run: 2 model calls and ask runs once."""
        ask = FakeTool("ask", returns="asked")
        model = ScriptedModel([reply("", call("ask")), reply("", call("ask")), "done"])
        limits = CallLimits(model_calls=2, per_tool={"ask": 1}, scope="run", exit="end")
        agent = Agent(model=model, tools=[ask.tool], middleware=[limits, ApproveAsk()])
        async with Session(agent, thread_id="ops") as first:
            with pytest.raises(Interrupted) as info:
                await first.run("go")
        checkpoint: Checkpoint = info.value.checkpoint
        async with Session(agent, thread_id="ops") as second:
            with pytest.raises(Interrupted) as info:
                await second.resume(checkpoint)
        checkpoint = info.value.checkpoint
        assert checkpoint.state["CallLimits"]["model"] == 2
        async with Session(agent, thread_id="ops") as third:
            result = await third.resume(checkpoint)
            history = third.conversation_messages
        assert model.calls == 2
        assert len(ask.calls) == 1
        assert result.status == "stopped"
        check_pairing(history, allow_pending=False)

    async def test_thread_limits_are_thread_state(self) -> None:
        """A thread-scope count is per-thread state that dumps and restores."""
        model = ScriptedModel(["one", "two"])
        limits = CallLimits(model_calls=5, scope="thread")
        async with Session(Agent(model=model, middleware=[limits])) as session:
            await session.run("a")
            await session.run("b")
            dumped = session.ctx.conversation.layer_state.dump()
        assert dumped == {"CallLimits": {"model": 2, "tools": 0, "per_tool": {}}}


class TestBuiltInStateRoundTrips:
    """Every stateful built-in layer dumps its state and restores it equal."""

    def test_calibration_round_trip(self) -> None:
        """A calibration continues from its dump with the same estimates."""
        calibration = Calibration()
        for raw, reported in ((1000, 1300), (2000, 2500), (3500, 4300)):
            calibration.observe(raw, reported)
        again = Calibration().load_json(json.loads(json.dumps(calibration.to_json())))
        assert again.to_json() == calibration.to_json()
        assert again.estimate(5000) == calibration.estimate(5000)

    def test_a_malformed_calibration_names_the_key(self) -> None:
        """A calibration document with a bad value raises naming the key."""
        data = Calibration().to_json() | {"ratio": "high"}
        with pytest.raises(TypeError, match="ratio must be a number"):
            Calibration().load_json(data)

    async def test_budget_guard_state_continues_in_a_new_thread_object(self) -> None:
        """The guard's calibration and counters restore from its thread state."""
        guard = BudgetGuard(max_tokens=100_000)
        model = ScriptedModel(
            [reply("a", usage=(1000, 5)), reply("b", usage=(2600, 5))], repeat_last=True
        )
        async with Session(Agent(model=model, middleware=[guard])) as session:
            await session.run("x" * 3000)
            await session.run("y" * 6000)
            dumped = session.ctx.conversation.layer_state.dump()
            before = guard.stats(session.ctx)
        restored = RunContext.new()
        restored.conversation.layer_state.load(json.loads(json.dumps(dumped)))
        after = guard.stats(restored)
        assert after.calibration_ratio == before.calibration_ratio
        assert after.hidden_tokens == before.hidden_tokens
        assert after.actions == before.actions

    async def test_summarize_breaker_is_thread_state(self) -> None:
        """Summarize's consecutive-failure count restores from the thread state."""

        class Failing:
            async def summarize(self, messages: Any, ctx: RunContext[Any]) -> str:
                raise RuntimeError("down")

        layer = Summarize(Failing(), trigger_tokens=1, keep_recent=1, persist=False)
        model = ScriptedModel(["a", "b", "c"])
        with capture_events(SummaryFailed) as failed:
            async with Session(Agent(model=model, middleware=[layer])) as session:
                for text in ("one", "two", "three"):
                    await session.run(text)
                dumped = session.ctx.conversation.layer_state.dump()
        assert len(failed) == 2
        assert dumped["Summarize"] == {"failures": 2}
        restored = RunContext.new()
        restored.conversation.layer_state.load(dumped)
        with capture_events(SummaryFailed) as failed:
            await run_layer(layer, ModelRequest(messages=session.conversation_messages), restored)
        assert [e.consecutive_failures for e in failed] == [3]

    async def test_session_memory_counters_and_marks_restore(self) -> None:
        """SessionMemory's counters, marks and reading position survive a dump."""
        from tinyctx import MemoryStore

        class Notes:
            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
                return [f"- saw {len(job.new_messages)}"]

        memory = SessionMemory(
            Notes(), store=MemoryStore(), min_tokens=0, min_tool_calls=0, min_turns=1
        )
        model = ScriptedModel(["a", "b"])
        async with Session(Agent(model=model, middleware=[memory])) as session:
            await session.run("one")
        dumped = session.ctx.conversation.layer_state.dump()
        state = dumped["SessionMemory"]
        assert state["counters"]["extractions"] == 1
        assert state["seen_upto"] == 2
        assert state["pending"] is False
        ctx = RunContext.new(conversation=session.ctx.conversation)
        ctx.conversation.layer_state.load(json.loads(json.dumps(dumped)))
        counters = memory.counters(ctx)
        assert counters.totals == memory.counters(session.ctx).totals
        assert counters.marks == memory.counters(session.ctx).marks

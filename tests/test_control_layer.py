"""ControlOutcomes: stops and pauses become values inside the onion, applied exactly once."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    Interrupt,
    Interrupted,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
    StopWithFinal,
    Tool,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.chain import ToolCallHandler, compose
from tinyctx.events import ControlApplied
from tinyctx.messages import check_pairing
from tinyctx.middleware import ControlOutcomes, Retry
from tinyctx.middleware.control import (
    ControlIgnored,
    ControlSurfaced,
    PendingCallsDropped,
    pending_control,
    take_as_response,
)
from tinyctx.testing import (
    FakeTool,
    ScriptedModel,
    assert_pairing_intact,
    call,
    capture_events,
    reply,
    run_layer,
)


class Record(Layer):
    """An outer layer that records what comes back through it (a logger, say)."""

    def __init__(self, name: str = "Record") -> None:
        self.name = name
        self.responses: list[ModelResponse] = []
        self.pending_after_tool: list[Any] = []

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        self.responses.append(response)
        return response

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        result = await call_next(call, ctx)
        self.pending_after_tool.append(pending_control(ctx))
        return result


class RequestBefore(Layer):
    """Requests ``control`` before calling the rest of the onion (model or tool side)."""

    def __init__(self, control: Any, *, tools: bool = False) -> None:
        self.control = control
        self.tools = tools

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        if not self.tools:
            ctx.request_control(self.control)
        return await call_next(request, ctx)

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        if self.tools:
            ctx.request_control(self.control)
        return await call_next(call, ctx)


def requesting(control: Any, response: ModelResponse) -> Any:
    """A scripted model step that requests ``control`` on the slot, then answers."""

    def step(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        ctx.request_control(control)
        return response

    return step


def applied(events: Any) -> list[tuple[str, str]]:
    return [(e.control, e.detail) for e in events if isinstance(e, ControlApplied)]


class TestControlOnlyResponse:
    """ModelResponse.from_control answers a call that was not made; the loop adds nothing."""

    def test_value(self) -> None:
        response = ModelResponse.from_control(StopWithFinal("bye"))
        assert response.control_only
        assert response.message == AssistantMessage("")
        assert not reply("text", control=StopWithFinal("x")).control_only
        assert not reply("", call("t"), control=StopWithFinal("x")).control_only
        assert not reply("").control_only
        with pytest.raises(TypeError, match="StopWithFinal or Interrupt"):
            ModelResponse.from_control("stop")  # type: ignore[arg-type]

    async def test_a_stop_instead_of_a_call_adds_only_the_final_answer(self) -> None:
        model = ScriptedModel(["never"])
        agent = Agent(
            model=model, middleware=[RequestBefore(StopWithFinal("early")), ControlOutcomes()]
        )
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
        assert model.calls == 0
        assert (result.status, result.final_text, result.model_calls) == ("stopped", "early", 0)
        assert [m.role for m in session.conversation_messages] == ["user", "assistant"]
        assert [e.kind for e in events if e.kind == "model.call"] == []
        assert applied(events) == [("stop_with_final", "early")]

    async def test_a_pause_instead_of_a_call_resumes_with_the_call(self) -> None:
        model = ScriptedModel(["after resume"])

        class PauseOnce(Layer):
            async def wrap_model(
                self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
            ) -> ModelResponse:
                if not ctx.state_for(self, list):
                    ctx.state_for(self, list).append(True)
                    return ModelResponse.from_control(Interrupt("gate", "approve first"))
                return await call_next(request, ctx)

        async with Session(Agent(model=model, middleware=[PauseOnce()])) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("go")
            assert info.value.checkpoint.phase == "before_model"
            assert [m.role for m in session.conversation_messages] == ["user"]
            result = await session.resume(info.value.checkpoint)
        assert result.final_text == "after resume"
        assert model.calls == 1


class TestSurfacing:
    """Outer layers see the outcome as response.control; the loop applies it exactly once."""

    @pytest.mark.parametrize(
        "control", [StopWithFinal("done early"), Interrupt("review", "hold")], ids=["stop", "pause"]
    )
    async def test_a_control_requested_during_the_call_is_on_the_response(
        self, control: Any
    ) -> None:
        record = Record()
        model = ScriptedModel([requesting(control, reply("partial")), "after"])
        agent = Agent(model=model, middleware=[record, ControlOutcomes()])
        async with Session(agent) as session:
            with capture_events() as events:
                if isinstance(control, Interrupt):
                    with pytest.raises(Interrupted):
                        await session.run("go")
                else:
                    result = await session.run("go")
                    assert result.final_text == "done early"
        assert [r.control for r in record.responses] == [control]
        assert applied(events) == [(control.kind, control.detail)]
        surfaced = [e for e in events if isinstance(e, ControlSurfaced)]
        assert [(e.control, e.where) for e in surfaced] == [(control.kind, "after_model")]

    async def test_a_control_pending_before_the_call_skips_the_model(self) -> None:
        record = Record()
        model = ScriptedModel(["never"])
        layers = [record, RequestBefore(Interrupt("n", "m")), ControlOutcomes()]
        with capture_events() as events:
            response = await run_layer(
                _Chain(layers), ModelRequest(messages=(UserMessage("x"),)), None, model
            )
        assert model.calls == 0
        assert response.control_only
        assert record.responses[0].control == Interrupt("n", "m")
        assert applied(events) == []  # outside the loop nothing applies it

    async def test_a_retry_outside_never_repeats_a_control_outcome(self) -> None:
        model = ScriptedModel([requesting(StopWithFinal("stop"), reply("x")), "never"])
        agent = Agent(model=model, middleware=[Retry(attempts=5, backoff=0), ControlOutcomes()])
        with capture_events() as events:
            result = await agent.run("go")
        assert model.calls == 1
        assert result.final_text == "stop"
        attempts = [e for e in events if e.kind == "retry.attempt"]
        assert [e.outcome for e in attempts] == ["control"]  # type: ignore[attr-defined]
        assert len(applied(events)) == 1

    def test_take_as_response(self) -> None:
        ctx = RunContext.new()
        assert take_as_response(ctx) is None
        ctx.request_control(StopWithFinal("s"))
        response = take_as_response(ctx)
        assert response is not None and response.control == StopWithFinal("s")
        assert not ctx.control.pending


class _Chain(Layer):
    """Several layers as one (to drive a small onion with run_layer)."""

    def __init__(self, layers: list[Layer]) -> None:
        self.layers = layers

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await compose(self.layers, call_next)(request, ctx)


class TestPendingCallsOnStop:
    """A stop with tool calls pending leaves a valid history under both policies."""

    @pytest.mark.parametrize("policy", ["answer", "drop"])
    @pytest.mark.parametrize("text", ["", "let me look"])
    async def test_stop_arriving_with_a_responses_tool_calls(self, policy: str, text: str) -> None:
        tool = FakeTool("t")
        response = reply(text, call("t"), call("t"))
        model = ScriptedModel([requesting(StopWithFinal("final"), response)])
        agent = Agent(
            model=model, tools=[tool.tool], middleware=[ControlOutcomes(on_stop_pending=policy)]
        )
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
            history = session.conversation_messages
        assert result.status == "stopped" and result.final_text == "final"
        assert tool.calls == []
        check_pairing(history, allow_pending=False)
        roles = [m.role for m in history]
        if policy == "answer":
            assert roles == ["user", "assistant", "tool", "tool", "assistant"]
            assert all("skipped" in m.text for m in history if m.role == "tool")
        else:
            # the emptied response is not appended; one with text stays, without its calls
            assert roles == ["user", "assistant", "assistant"] if text else ["user", "assistant"]
            assert not any(getattr(m, "tool_calls", ()) for m in history)
            dropped = [e for e in events if isinstance(e, PendingCallsDropped)]
            assert len(dropped) == 1 and len(dropped[0].tool_call_ids) == 2
        assert applied(events) == [("stop_with_final", "final")]

    @pytest.mark.parametrize("policy", ["answer", "drop"])
    async def test_stop_requested_mid_batch_answers_the_rest(self, policy: str) -> None:
        finished: list[str] = []

        async def stopper(arguments: Any, ctx: RunContext[Any]) -> str:
            ctx.request_control(StopWithFinal("tool says stop"))
            await anyio.lowlevel.checkpoint()
            finished.append("stopper")  # never cut off mid-tool
            return "stopping"

        later = FakeTool("later")
        record = Record()
        model = ScriptedModel([reply("", call("later"), call("stop"), call("later"))])
        agent = Agent(
            model=model,
            tools=[Tool("stop", handler=stopper), later.tool],
            middleware=[record, ControlOutcomes(on_stop_pending=policy)],
        )
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
            history = session.conversation_messages
        assert finished == ["stopper"]
        assert len(later.calls) == 1  # the call before the stop ran, the one after did not
        assert result.final_text == "tool says stop"
        check_pairing(history, allow_pending=False)
        assert history[3].text == "stopping"
        assert "skipped" in history[4].text
        assert record.pending_after_tool == [None, StopWithFinal("tool says stop")]
        assert applied(events) == [("stop_with_final", "tool says stop")]
        surfaced = [e for e in events if isinstance(e, ControlSurfaced)]
        assert [e.where for e in surfaced] == ["tool stop"]

    @given(
        calls=st.integers(0, 4),
        text=st.sampled_from(["", "thinking"]),
        stop_at=st.integers(-1, 4),
        policy=st.sampled_from(["answer", "drop"]),
    )
    async def test_any_stop_keeps_pairing(
        self, calls: int, text: str, stop_at: int, policy: str
    ) -> None:
        """stop_at -1: the stop arrives with the response; k: tool call k requests it."""
        ran: list[int] = []

        def tool_for(index: int) -> Tool:
            async def handler(arguments: Any, ctx: RunContext[Any]) -> str:
                ran.append(index)
                if index == stop_at:
                    ctx.request_control(StopWithFinal("final"))
                return f"r{index}"

            return Tool(f"t{index}", handler=handler)

        tools = [tool_for(i) for i in range(calls)]
        response = reply(text, *(call(f"t{i}") for i in range(calls)))
        first = requesting(StopWithFinal("final"), response) if stop_at == -1 else response
        model = ScriptedModel([first, "no stop"])
        agent = Agent(model=model, tools=tools, middleware=[ControlOutcomes(policy)])
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
            history = session.conversation_messages
        assert_pairing_intact(history, allow_pending=False)
        stopped = stop_at == -1 or stop_at < calls
        if stopped:
            assert result.status == "stopped" and result.final_text == "final"
            assert len(applied(events)) == 1
            assert ran == ([] if stop_at == -1 else list(range(stop_at + 1)))
        else:
            assert result.status == "completed" and applied(events) == []
            assert ran == list(range(calls))


class TestToolOnion:
    """On the tool onion a control stays on the slot and is applied at the next checkpoint."""

    async def test_a_control_pending_before_a_tool_means_the_tool_does_not_run(self) -> None:
        tool = FakeTool("t")
        model = ScriptedModel([reply("", call("t"), call("t"))])
        agent = Agent(
            model=model,
            tools=[tool.tool],
            middleware=[RequestBefore(StopWithFinal("layer stop"), tools=True), ControlOutcomes()],
        )
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
            history = session.conversation_messages
        assert tool.calls == []
        assert result.final_text == "layer stop"
        check_pairing(history, allow_pending=False)
        first = history[2]
        assert isinstance(first, ToolResult)
        assert first.is_error and "pending" in first.content
        assert first.metadata["tinyctx"]["synthetic"] == "control"
        assert applied(events) == [("stop_with_final", "layer stop")]


class TestHonour:
    """Outcomes not honoured are taken off and reported, never applied."""

    async def test_an_interrupt_not_honoured_is_ignored_and_the_run_goes_on(self) -> None:
        pause = FakeTool("pause", control=Interrupt("n", "m"))
        model = ScriptedModel(
            [
                reply("", call("pause")),
                requesting(Interrupt("again"), reply("", call("pause"))),
                reply("end", control=Interrupt("on the response")),
            ]
        )
        agent = Agent(
            model=model,
            tools=[pause.tool],
            middleware=[ControlOutcomes(honour=["stop_with_final"])],
        )
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
        assert result.status == "completed" and result.final_text == "end"
        ignored = [(e.control, e.where) for e in events if isinstance(e, ControlIgnored)]
        assert ignored == [
            ("interrupt", "after_tool"),
            ("interrupt", "after_model"),
            ("interrupt", "after_tool"),
            ("interrupt", "after_model"),
        ]
        assert applied(events) == []

    async def test_honour_nothing_is_an_audit_mode(self) -> None:
        model = ScriptedModel([requesting(StopWithFinal("s"), reply("answer"))])
        agent = Agent(model=model, middleware=[ControlOutcomes(honour=())])
        with capture_events() as events:
            result = await agent.run("go")
        assert result.final_text == "answer"
        assert [e.kind for e in events if isinstance(e, ControlIgnored)] == ["control.ignored"]

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"on_stop_pending": "skip"}, "on_stop_pending"),
            ({"honour": ["stop"]}, "honour"),
            ({"honour": "pause"}, "honour"),
        ],
    )
    def test_bad_configuration(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError) as info:
            ControlOutcomes(**kwargs)
        assert info.value.field == field
        assert "ControlOutcomes" in str(info.value)

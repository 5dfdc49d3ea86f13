"""Session.stream: a run as an async iterator of typed events, closed early cleanly."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tinyctx import (
    Agent,
    Interrupt,
    Layer,
    MemoryStore,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunContext,
    Session,
    SessionBusy,
    ToolResult,
)
from tinyctx.events import ModelStreamDelta
from tinyctx.messages import check_pairing
from tinyctx.middleware import Microcompact, subagent_tool
from tinyctx.streaming import (
    FinalResult,
    LayerAction,
    ModelCallDone,
    ReasoningDelta,
    RunPaused,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolFinished,
    ToolStarted,
    stream_requested,
)
from tinyctx.testing import HANG, FakeTool, ScriptedModel, call, reply, stream


class Gate(Layer):
    """Pauses for approval whenever the model asks for ``deploy``."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        if any(c.name == "deploy" for c in response.message.tool_calls):
            ctx.request_control(Interrupt("approval", "deploy?"))
        return response


async def _collect(events: Any) -> list[StreamEvent]:
    return [item async for item in events]


def _tool_agent(model: ScriptedModel, *tools: FakeTool, **options: Any) -> Agent:
    return Agent(model, tools=[t.tool for t in tools], **options)


class TestWhatAStreamYields:
    """A streamed run yields deltas, tool calls and the result, in the order they happen."""

    async def test_text_tool_calls_and_the_final_result(self) -> None:
        """Text and tool-call deltas, the tool's start and end, then the run's result."""
        search = FakeTool("search", returns="found")
        model = ScriptedModel(
            [stream(reply("Looking", call("search", id="c1", q="x"))), stream("It is ", "so.")]
        )
        async with Session(_tool_agent(model, search)) as session:
            async with session.stream("what?") as events:
                items = await _collect(events)
        kinds = [type(i).__name__ for i in items]
        assert kinds == [
            "TextDelta",
            "ToolCallDelta",
            "ToolCallDelta",
            "ToolCallDelta",
            "ModelCallDone",
            "ToolStarted",
            "ToolFinished",
            "TextDelta",
            "TextDelta",
            "ModelCallDone",
            "FinalResult",
        ]
        assert isinstance(items[1], ToolCallDelta)
        assert (items[1].tool_call_id, items[1].tool_name) == ("c1", "search")
        started, finished = items[5], items[6]
        assert isinstance(started, ToolStarted)
        assert started.arguments == {"q": "x"}
        assert isinstance(finished, ToolFinished)
        assert finished.result == ToolResult("c1", "found", name="search")
        final = items[-1]
        assert isinstance(final, FinalResult)
        assert final.result.final_text == "It is so."
        assert events.result is final.result
        assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "LookingIt is so."
        assert all(not i.nested and i.run_id == final.result.run_id for i in items)

    async def test_reasoning_deltas_and_model_usage(self) -> None:
        """A reasoning delta becomes a ReasoningDelta; the call's usage comes with it."""
        model = ScriptedModel([stream(ModelStreamDelta(reasoning="hmm"), "Yes.", usage=(12, 3))])
        async with Session(Agent(model)) as session:
            items = await _collect(session.stream("sure?"))
        assert isinstance(items[0], ReasoningDelta)
        assert items[0].text == "hmm"
        done = next(i for i in items if isinstance(i, ModelCallDone))
        assert (done.input_tokens, done.output_tokens) == (12, 3)

    async def test_a_layer_action_is_reported(self) -> None:
        """A control applied (a layer's action) arrives as a LayerAction."""
        model = ScriptedModel([reply("", call("deploy", id="d1"))])
        deploy = FakeTool("deploy")
        agent = _tool_agent(model, deploy, middleware=[Gate()])
        async with Session(agent) as session:
            items = await _collect(session.stream("ship it"))
        actions = [i for i in items if isinstance(i, LayerAction)]
        assert [a.action for a in actions] == ["control.applied"]

    async def test_a_compaction_is_a_layer_action(self) -> None:
        """Microcompaction of old tool results arrives as a LayerAction with its label."""
        read = FakeTool("read", returns="x" * 200)
        script = [reply("", call("read", id=f"r{i}")) for i in range(3)]
        model = ScriptedModel([*script, "done"])
        agent = _tool_agent(model, read, middleware=[Microcompact(keep_recent=1)])
        async with Session(agent) as session:
            items = await _collect(session.stream("go"))
        actions = [i for i in items if isinstance(i, LayerAction)]
        assert [a.action for a in actions] == ["compaction.microcompact"] * 2
        assert all(a.description and "microcompact" in a.description for a in actions)

    async def test_adapters_are_asked_to_stream(self) -> None:
        """Inside a streamed run stream_requested() is True; outside it is False."""
        seen: list[bool] = []

        def answer(request: ModelRequest, ctx: RunContext[Any]) -> str:
            seen.append(stream_requested())
            return "ok"

        async with Session(Agent(ScriptedModel([answer, answer]))) as session:
            await _collect(session.stream("a"))
            await session.run("b")
        assert seen == [True, False]


class TestNestedRuns:
    """A sub-agent's items are marked nested, with its own run id."""

    async def test_a_sub_agent_streams_nested(self) -> None:
        """The helper's text deltas are nested; the parent's are not."""
        helper = Agent(ScriptedModel([stream("inner ", "text")]), name="helper")
        model = ScriptedModel([reply("", call("helper", id="h1", task="look")), stream("outer")])
        agent = Agent(model, tools=[subagent_tool(helper, name="helper")])
        async with Session(agent) as session:
            items = await _collect(session.stream("go"))
        final = items[-1]
        assert isinstance(final, FinalResult)
        texts = [(i.text, i.nested) for i in items if isinstance(i, TextDelta)]
        assert texts == [("inner ", True), ("text", True), ("outer", False)]
        nested_ids = {i.run_id for i in items if i.nested}
        assert len(nested_ids) == 1
        assert final.result.run_id not in nested_ids
        finished = next(i for i in items if isinstance(i, ToolFinished))
        assert finished.result is not None
        assert finished.result.content == "inner text"


class TestBackgroundWork:
    """Work a run starts in the background is no part of its stream."""

    async def test_a_background_task_s_events_stay_out(self) -> None:
        """A delta emitted by a task the run spawned is not streamed; the run's own are."""
        spawned = anyio.Event()

        async def job(ctx: RunContext[Any]) -> None:
            ctx.emit(ModelStreamDelta(text="from the background"))
            spawned.set()

        async def start_job(arguments: Any, ctx: RunContext[Any]) -> str:
            ctx.spawn(job, ctx)
            await spawned.wait()
            return "started"

        tool = FakeTool("start_job", returns=start_job)
        model = ScriptedModel([reply("", call("start_job", id="j1")), stream("done")])
        async with Session(_tool_agent(model, tool)) as session:
            items = await _collect(session.stream("go"))
        assert [i.text for i in items if isinstance(i, TextDelta)] == ["done"]


class TestPauseAndResume:
    """An interrupted run ends its stream with RunPaused; stream_resume goes on."""

    async def test_pause_then_resume_streamed(self) -> None:
        """The pause is the last item; the resumed stream ends with the result."""
        deploy = FakeTool("deploy", returns="deployed")
        model = ScriptedModel([reply("", call("deploy", id="d1")), stream("Done.")])
        agent = _tool_agent(model, deploy, middleware=[Gate()])
        async with Session(agent) as session:
            events = session.stream("ship it")
            items = await _collect(events)
            paused = items[-1]
            assert isinstance(paused, RunPaused)
            assert paused.node == "approval"
            assert events.checkpoint is paused.checkpoint is session.paused
            resumed = await _collect(session.stream_resume())
        assert [type(i).__name__ for i in resumed[:2]] == ["ToolStarted", "ToolFinished"]
        final = resumed[-1]
        assert isinstance(final, FinalResult)
        assert final.result.final_text == "Done."
        assert final.result.run_id == paused.checkpoint.run_id
        assert deploy.calls == [{}]


class TestClosingEarly:
    """Closing a stream before its end cancels the run; the session stays usable."""

    async def test_aclose_during_a_hanging_tool_keeps_pairing(self) -> None:
        """aclose() while a tool hangs: the call is answered, the next run works."""
        slow = FakeTool("slow", returns=HANG)
        model = ScriptedModel([reply("", call("slow", id="s1")), "after"])
        async with Session(_tool_agent(model, slow)) as session:
            events = session.stream("go")
            async for item in events:
                if isinstance(item, ToolStarted):
                    break
            await events.aclose()
            check_pairing(session.conversation_messages)
            last = session.conversation_messages[-1]
            assert isinstance(last, ToolResult)
            assert last.is_error
            result = await session.run("again")
        assert result.final_text == "after"

    async def test_leaving_async_with_mid_stream_cancels(self) -> None:
        """break inside ``async with session.stream(...)`` cancels the streamed model call."""
        model = ScriptedModel([stream("Hel", HANG), "next"])
        async with Session(Agent(model)) as session:
            async with session.stream("hi") as events:
                async for item in events:
                    assert isinstance(item, TextDelta)
                    break
            assert events.result is None
            assert (await session.run("again")).final_text == "next"
        check_pairing(session.conversation_messages)

    async def test_break_in_a_bare_async_for(self) -> None:
        """A bare ``async for`` that breaks drops the stream; the next run waits for it."""
        slow = FakeTool("slow", returns=HANG)
        model = ScriptedModel([reply("", call("slow", id="s1")), "after"])
        async with Session(_tool_agent(model, slow)) as session:
            async for item in session.stream("go"):
                if isinstance(item, ToolStarted):
                    break
            result = await session.run("again")
            check_pairing(session.conversation_messages)
        assert result.final_text == "after"

    async def test_a_cancelled_reader_closes_the_stream(self) -> None:
        """The reader's own cancel scope ends the read; leaving ``async with`` ends the run."""
        model = ScriptedModel([HANG, "next"])
        async with Session(Agent(model)) as session:
            with anyio.move_on_after(0.05):
                async with session.stream("hi") as events:
                    await _collect(events)
            assert (await session.run("again")).final_text == "next"

    async def test_a_durable_thread_is_written_and_released(self) -> None:
        """Closed early on a stored thread: the last write pairs and the lease is free."""
        store = MemoryStore()
        slow = FakeTool("slow", returns=HANG)
        model = ScriptedModel([reply("", call("slow", id="s1"))])
        agent = _tool_agent(model, slow)
        async with Session(agent, thread_id="t", store=store) as session:
            async with session.stream("go") as events:
                async for item in events:
                    if isinstance(item, ToolStarted):
                        break
            expected = session.conversation_messages
        async with Session(agent, thread_id="t", store=store) as again:
            assert again.conversation_messages == expected
            check_pairing(again.conversation_messages, allow_pending=False)


class TestStreamErrors:
    """A failing run raises from the iterator; misuse gets a clear error."""

    async def test_a_model_error_is_raised_after_the_events_before_it(self) -> None:
        """Deltas that arrived are yielded, then the model's error is raised."""
        model = ScriptedModel([stream("par", ConnectionError("reset"))])
        got: list[StreamEvent] = []
        async with Session(Agent(model)) as session:
            with pytest.raises(ConnectionError, match="reset"):
                async for item in session.stream("hi"):
                    got.append(item)
        assert [type(i).__name__ for i in got] == ["TextDelta"]

    async def test_a_stream_outside_the_session(self) -> None:
        """A stream of a session not entered raises RuntimeError saying how to use it."""
        session = Session(Agent(ScriptedModel(["x"])))
        with pytest.raises(RuntimeError, match="async with Session"):
            await _collect(session.stream("hi"))

    async def test_a_second_run_while_streaming_is_busy(self) -> None:
        """Runs stay sequential: run() while a stream is being read raises SessionBusy."""
        model = ScriptedModel([stream("a", "b"), "x"])
        async with Session(Agent(model)) as session:
            async with session.stream("hi") as events:
                await events.__anext__()
                with pytest.raises(SessionBusy):
                    await session.run("again")
                rest = await _collect(events)
        assert isinstance(rest[-1], FinalResult)

    async def test_leaving_the_session_while_streaming(self) -> None:
        """A stream whose session is left mid-run raises RunCancelled naming the stream."""
        model = ScriptedModel([HANG])
        async with Session(Agent(model)) as session:
            events = session.stream("hi")
            await events.__aenter__()
            while not model.calls:  # the run is in its model call
                await anyio.lowlevel.checkpoint()
        with pytest.raises(RunCancelled, match="stream"):
            await events.__anext__()
        check_pairing(session.conversation_messages)

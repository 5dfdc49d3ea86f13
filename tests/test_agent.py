"""End-to-end runs of the agent loop with a scripted fake model."""

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
    LimitExceeded,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    PairingError,
    RunCancelled,
    RunConfig,
    RunContext,
    Session,
    SessionBusy,
    StopWithFinal,
    Tool,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.chain import ToolCallHandler
from tinyctx.conversation import Conversation
from tinyctx.events import ControlApplied
from tinyctx.messages import check_pairing
from tinyctx.testing import (
    HANG,
    FakeTool,
    ScriptedModel,
    assert_events_form_tree,
    call,
    capture_events,
    reply,
)


def kinds(events: Any) -> list[str]:
    return [e.kind for e in events]


class TestToolUsingRun:
    """A run calls tools, appends results in order and ends on a final answer."""

    async def test_tool_run_end_to_end(self) -> None:
        search = FakeTool("search", returns="tinyctx is an onion")
        model = ScriptedModel(
            [
                reply("", call("search", q="tinyctx"), usage=(100, 10)),
                reply("It is an onion.", usage=(150, 8)),
            ]
        )
        agent = Agent(model=model, tools=[search.tool], system_prompt="be brief")
        async with Session(agent, thread_id="t1") as session:
            result = await session.run("what is tinyctx?")
        assert result.status == "completed"
        assert result.final_text == "It is an onion."
        assert result.usage == Usage(250, 18)
        assert (result.model_calls, result.tool_calls) == (2, 1)
        assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
        assert search.calls == [{"q": "tinyctx"}]
        second = model.requests[1]
        assert second.system_prompt == "be brief"
        assert [t.name for t in second.tools] == ["search"]
        assert isinstance(second.messages[-1], ToolResult)
        assert second.messages[-1].content == "tinyctx is an onion"
        check_pairing(session.conversation_messages, allow_pending=False)
        assert result.thread_id == "t1"
        assert_events_form_tree(result.events)
        assert kinds(result.events) == [
            "run.started",
            "model.call",
            "tool.started",
            "tool.call",
            "model.call",
            "run.finished",
        ]

    async def test_agent_is_reusable_across_sessions(self) -> None:
        model = ScriptedModel(["one", "two"])
        agent = Agent(model=model)
        first = await agent.run("a")
        async with Session(agent) as session:
            second = await session.run("b")
        assert (first.final_text, second.final_text) == ("one", "two")
        assert [len(r.messages) for r in model.requests] == [1, 1]

    async def test_runs_in_a_session_share_the_conversation(self) -> None:
        model = ScriptedModel(["one", "two"])
        async with Session(Agent(model=model)) as session:
            first = await session.run("a")
            second = await session.run("b")
        assert first.run_id != second.run_id
        assert [m.text for m in model.requests[1].messages] == ["a", "one", "b"]

    async def test_tool_failures_become_readable_error_results(self) -> None:
        boom = FakeTool("boom", returns=ValueError("disk on fire"))
        model = ScriptedModel(
            [
                reply(
                    "",
                    call("boom"),
                    call("missing"),
                    ToolCall("c_bad", "boom", invalid_arguments="{not json"),
                ),
                "recovered",
            ]
        )
        async with Session(Agent(model=model, tools=[boom.tool])) as session:
            result = await session.run("go")
        results = [m for m in result.messages if isinstance(m, ToolResult)]
        assert all(r.is_error for r in results)
        assert "ValueError" in results[0].content and "disk on fire" in results[0].content
        assert "unknown tool 'missing'; available tools: boom" in results[1].content
        assert "not a JSON object" in results[2].content
        failed = [e for e in result.events if e.kind == "tool.failed"]
        assert [e.error_type for e in failed] == ["ValueError", "UnknownTool", "InvalidArguments"]  # type: ignore[attr-defined]
        assert result.final_text == "recovered"

    async def test_tool_returning_values_is_serialized(self) -> None:
        async def handler(arguments: Any, ctx: RunContext[Any]) -> Any:
            return {"n": 1, "items": ("a", "b")}

        model = ScriptedModel([reply("", call("data")), "done"])
        tool = Tool("data", handler=handler)
        async with Session(Agent(model=model, tools=[tool])) as session:
            result = await session.run("go")
        assert result.messages[2].text == '{"n": 1, "items": ["a", "b"]}'


class TestInvalidText:
    """Text entering from outside (input, model output, tool results) is valid Unicode."""

    async def test_lone_surrogates_become_replacement_characters(self) -> None:
        """A lone surrogate anywhere outside text comes in becomes U+FFFD; pairs are joined."""
        tool = FakeTool("t", returns="r\udc80sult")
        model = ScriptedModel(
            [reply("thinking \ud800", call("t", id="c1", q="caf\udce9")), "fin\udfff"]
        )
        async with Session(Agent(model=model, tools=[tool.tool])) as session:
            result = await session.run("caf\udce9 and \ud83d\ude00")
            messages = session.conversation_messages
        user, assistant, tool_result, final = messages
        assert user.text == "caf\ufffd and \U0001f600"
        assert isinstance(assistant, AssistantMessage)
        assert assistant.content == "thinking \ufffd"
        assert assistant.tool_calls[0].arguments == {"q": "caf\ufffd"}
        assert tool_result.text == "r\ufffdsult" and final.text == "fin\ufffd"
        assert result.final_text == "fin\ufffd"
        for message in messages:
            message.text.encode("utf-8")  # never raises

    async def test_text_parts_are_made_valid_too(self) -> None:
        """A lone surrogate in a text part of a multimodal message becomes U+FFFD."""
        from tinyctx.parts import TextPart

        model = ScriptedModel(["ok"])
        async with Session(Agent(model=model)) as session:
            await session.run(UserMessage((TextPart("caf\udce9"),)))
            (user, _) = session.conversation_messages
        assert user.text == "caf\ufffd"


class TestReusedCallIds:
    """A call id already used in the thread is renamed as it enters history."""

    async def test_a_reused_id_gets_a_fresh_one_and_its_result_follows(self) -> None:
        """call_0 every turn: ids stay unique, results answer the renamed calls."""
        tool = FakeTool("t", returns="fine")
        model = ScriptedModel([reply("", call("t", id="call_0")) for _ in range(3)] + ["done"])
        async with Session(Agent(model=model, tools=[tool.tool])) as session:
            result = await session.run("go")
            messages = session.conversation_messages
        check_pairing(messages, allow_pending=False)
        assistants = [m for m in messages if isinstance(m, AssistantMessage) and m.tool_calls]
        ids = [m.tool_calls[0].id for m in assistants]
        assert ids == ["call_0", "call_0_r2", "call_0_r3"]
        assert "renamed_ids" not in assistants[0].metadata.get("tinyctx", {})
        assert assistants[1].metadata["tinyctx"]["renamed_ids"] == {"call_0_r2": "call_0"}
        answered = [m.tool_call_id for m in messages if isinstance(m, ToolResult)]
        assert answered == ids
        assert result.final_text == "done" and len(tool.calls) == 3

    async def test_trim_oldest_works_under_pressure_with_reused_ids(self) -> None:
        """A server reusing ids no longer ends in a misleading ContextLimitExceeded."""
        from tinyctx.middleware import BudgetGuard, TrimOldest

        tool = FakeTool("read", returns="x " * 300)
        model = ScriptedModel([reply("", call("read", id="call_0")) for _ in range(8)] + ["done"])
        guard = BudgetGuard(max_tokens=1200, policies=[TrimOldest(2)])
        async with Session(Agent(model=model, tools=[tool.tool], middleware=[guard])) as session:
            result = await session.run("go")
        assert result.final_text == "done"
        for request in model.requests:
            check_pairing(request.messages, allow_pending=False)


class TestControl:
    """StopWithFinal ends the run; Interrupt pauses it for resume; pairing always holds."""

    async def test_stop_requested_by_a_tool_answers_the_rest(self) -> None:
        stopper = FakeTool("stop", returns="stopping", control=StopWithFinal("final from tool"))
        other = FakeTool("other")
        model = ScriptedModel([reply("", call("stop"), call("other"), call("other"))])
        async with Session(Agent(model=model, tools=[stopper.tool, other.tool])) as session:
            result = await session.run("go")
        assert result.status == "stopped"
        assert result.final_text == "final from tool"
        assert other.calls == []  # never run mid-batch after the stop
        skipped = [m for m in result.messages if isinstance(m, ToolResult) and m.is_error]
        assert len(skipped) == 2
        assert all("skipped" in m.content for m in skipped)
        assert result.messages[-1] == AssistantMessage(
            "final from tool", metadata={"tinyctx": {"control": "stop_with_final"}}
        )
        check_pairing(session.conversation_messages, allow_pending=False)
        applied = [e for e in result.events if isinstance(e, ControlApplied)]
        assert [(e.control, e.detail) for e in applied] == [("stop_with_final", "final from tool")]

    async def test_control_value_on_a_response_is_applied(self) -> None:
        model = ScriptedModel([reply("", call("t"), control=StopWithFinal("layer said stop"))])
        async with Session(Agent(model=model, tools=[FakeTool("t").tool])) as session:
            result = await session.run("go")
        assert result.final_text == "layer said stop"
        check_pairing(session.conversation_messages, allow_pending=False)

    async def test_interrupt_then_resume_finishes_the_same_run(self) -> None:
        approve = FakeTool(
            "approve", returns="needs a human", control=Interrupt("review", "approve the deploy?")
        )
        deploy = FakeTool("deploy", returns="deployed")
        model = ScriptedModel(
            [
                reply("", call("approve"), call("deploy"), usage=(10, 1)),
                reply("all done", usage=(20, 2)),
            ]
        )
        agent = Agent(model=model, tools=[approve.tool, deploy.tool])
        async with Session(agent) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("ship it")
            paused = info.value.checkpoint
            assert (info.value.node, info.value.message) == ("review", "approve the deploy?")
            assert session.paused is paused
            assert [c.name for c in paused.pending] == ["deploy"]
            assert deploy.calls == []
            result = await session.resume(paused)
        assert result.run_id == paused.run_id
        assert result.final_text == "all done"
        assert deploy.calls == [{}]
        assert (result.model_calls, result.tool_calls) == (2, 2)
        assert result.usage == Usage(30, 3)
        assert [m.role for m in result.messages] == [
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
        ]
        check_pairing(session.conversation_messages, allow_pending=False)

    async def test_interrupt_outranks_stop_in_the_same_batch(self) -> None:
        stop = FakeTool("stop", control=StopWithFinal("stop"))
        pause = FakeTool("pause", control=Interrupt("n", "pause"))
        model = ScriptedModel([reply("", call("stop"), call("pause")), "x"])
        async with Session(Agent(model=model, tools=[stop.tool, pause.tool])) as session:
            # stop is requested first and applied at the next checkpoint, before pause runs
            result = await session.run("go")
        assert result.status == "stopped"
        assert pause.calls == []
        ctx = RunContext.new()
        ctx.request_control(StopWithFinal("s"))
        ctx.request_control(Interrupt("n"))
        assert isinstance(ctx.take_control(), Interrupt)

    async def test_resume_in_a_new_session_restores_the_thread(self) -> None:
        pause = FakeTool("pause", control=Interrupt("n", "m"))
        model = ScriptedModel([reply("", call("pause"), call("after")), "finished"])
        after = FakeTool("after")
        agent = Agent(model=model, tools=[pause.tool, after.tool])
        async with Session(agent, thread_id="T") as first:
            with pytest.raises(Interrupted) as info:
                await first.run("go")
        async with Session(agent, thread_id="T") as second:
            result = await second.resume(info.value.checkpoint)
            assert result.final_text == "finished"
            check_pairing(second.conversation_messages, allow_pending=False)
        async with Session(agent, thread_id="other") as third:
            with pytest.raises(ValueError, match="belongs to thread 'T'"):
                await third.resume(info.value.checkpoint)

    async def test_a_new_run_after_an_unresumed_interrupt_answers_the_pending_calls(self) -> None:
        pause = FakeTool("pause", control=Interrupt("n"))
        model = ScriptedModel([reply("", call("pause"), call("pause")), "fresh answer"])
        async with Session(Agent(model=model, tools=[pause.tool])) as session:
            with pytest.raises(Interrupted):
                await session.run("go")
            result = await session.run("never mind")
            assert result.final_text == "fresh answer"
            assert session.paused is None
            check_pairing(session.conversation_messages, allow_pending=False)
            assert "interrupted and not resumed" in session.conversation_messages[3].text


class CancelAt(Layer):
    """Cancels the run's token at a chosen moment."""

    def __init__(self, when: str) -> None:
        self.when = when

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        if self.when == "before_model_call":
            ctx.cancellation.cancel("before")
        response = await call_next(request, ctx)
        if self.when == "during_model_call":
            ctx.cancellation.cancel("during")
        return response

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        result = await call_next(call, ctx)
        if self.when == "during_tool" or (self.when == "after_last_tool" and call.id.endswith("b")):
            ctx.cancellation.cancel("tool")
        return result


class TestCancellation:
    """A cancelled token ends the run at the next checkpoint with nothing half-added."""

    @pytest.mark.parametrize(
        ("when", "checkpoint", "tool_runs"),
        [
            ("before_run", "before_model", 0),
            ("during_model_call", "after_model", 0),
            ("during_tool", "before_tool", 1),
            ("after_last_tool", "after_tools", 2),
        ],
    )
    async def test_cancel_at_each_checkpoint(
        self, when: str, checkpoint: str, tool_runs: int
    ) -> None:
        tool = FakeTool("t")
        model = ScriptedModel([reply("", call("t", id="c_a"), call("t", id="c_b")), "never"])
        agent = Agent(model=model, tools=[tool.tool], middleware=[CancelAt(when)])
        async with Session(agent) as session:
            if when == "before_run":
                session.cancel("before")
            with capture_events() as events:
                with pytest.raises(RunCancelled) as info:
                    await session.run("go")
            messages = session.conversation_messages
        assert info.value.checkpoint == checkpoint
        assert len(tool.calls) == tool_runs
        check_pairing(messages, allow_pending=False)
        if checkpoint == "after_model":
            # the answer that arrived after the cancel was dropped, not appended
            assert [m.role for m in messages] == ["user"]
        cancelled = [e for e in events if e.kind == "run.cancelled"]
        assert [e.checkpoint for e in cancelled] == [checkpoint]  # type: ignore[attr-defined]

    async def test_cancelled_results_say_the_tool_did_not_run(self) -> None:
        tool = FakeTool("t")
        agent = Agent(
            model=ScriptedModel([reply("", call("t", id="c_a"), call("t", id="c_b"))]),
            tools=[tool.tool],
            middleware=[CancelAt("during_tool")],
        )
        async with Session(agent) as session:
            with pytest.raises(RunCancelled):
                await session.run("go")
            last = session.conversation_messages[-1]
        assert isinstance(last, ToolResult)
        assert last.tool_call_id == "c_b"
        assert last.is_error and "cancelled" in last.content
        assert last.metadata["tinyctx"]["synthetic"] == "cancelled"

    async def test_a_tool_cancelled_while_running_is_answered_interrupted(self) -> None:
        """The call that had started says "interrupted while running"; later calls "not run"."""
        started = anyio.Event()

        async def slow(arguments: Any) -> str:
            started.set()
            await anyio.sleep_forever()
            return "never"

        tool = FakeTool("t", returns=slow)
        agent = Agent(
            model=ScriptedModel([reply("", call("t", id="c_a"), call("t", id="c_b"))]),
            tools=[tool.tool],
        )
        async with Session(agent) as session:
            async with anyio.create_task_group() as group:

                async def stop_when_started() -> None:
                    await started.wait()
                    group.cancel_scope.cancel()

                group.start_soon(stop_when_started)
                await session.run("go")
            messages = session.conversation_messages
        check_pairing(messages, allow_pending=False)
        running, never = messages[-2:]
        assert isinstance(running, ToolResult) and isinstance(never, ToolResult)
        assert running.tool_call_id == "c_a"
        assert running.is_error and running.content.startswith("[interrupted while running:")
        assert "not run" not in running.content
        assert running.metadata["tinyctx"]["synthetic"] == "interrupted"
        assert never.tool_call_id == "c_b" and never.content.startswith("[not run:")

    async def test_cancel_from_outside_stops_a_hanging_tool_wait_at_the_next_checkpoint(
        self,
    ) -> None:
        model = ScriptedModel([HANG])
        async with Session(Agent(model=model)) as session:
            with anyio.move_on_after(0.05):
                await session.run("go")
        # the hang was abandoned by the caller's own deadline; nothing was appended for it
        assert [m.role for m in session.conversation_messages] == ["user"]


class TestNestedCalls:
    """A tool can make a nested model call under ctx.derive(): ids nest, usage rolls up."""

    async def test_sub_call_inside_a_tool(self) -> None:
        inner = ScriptedModel([reply("inner answer", usage=(7, 3))])

        async def ask_expert(arguments: Any, ctx: RunContext[Any]) -> str:
            child = ctx.derive(tags=("expert",), metadata={"role": "expert"})
            async with Session(
                Agent(model=inner), ctx=child._with(conversation=type(ctx.conversation)())
            ) as sub:
                result = await sub.run(str(arguments["q"]))
            return result.final_text

        outer = ScriptedModel(
            [reply("", call("ask", q="why?"), usage=(10, 1)), reply("done", usage=(20, 2))]
        )
        agent = Agent(model=outer, tools=[Tool("ask", handler=ask_expert)])
        async with Session(agent) as session:
            result = await session.run("go")
            assert session.ctx.usage.total() == Usage(37, 6)
        assert result.usage == Usage(37, 6)
        assert result.messages[2].text == "inner answer"
        inner_ctx = inner.contexts[0]
        assert inner_ctx.root_run_id == result.events[0].root_run_id
        assert "expert" in inner_ctx.tags
        assert inner_ctx.depth == 3
        assert_events_form_tree(result.events)
        # the nested run's own events are attributable and part of the outer run's events
        nested = [e for e in result.events if "expert" in e.tags]
        assert kinds(nested) == ["run.started", "model.call", "run.finished"]


class TestLimitsAndErrors:
    """Limits end a run with a clear error; layer errors propagate and pairing holds."""

    async def test_model_call_limit_default_is_25(self) -> None:
        assert RunConfig().max_model_calls == 25
        model = ScriptedModel([lambda request, ctx: reply("", call("t"))], repeat_last=True)
        async with Session(
            Agent(model=model, tools=[FakeTool("t").tool]), config=RunConfig(max_model_calls=3)
        ) as session:
            with capture_events() as events:
                with pytest.raises(LimitExceeded, match="max_model_calls limit of 3 per run"):
                    await session.run("loop forever")
            check_pairing(session.conversation_messages, allow_pending=False)
        assert model.calls == 3
        assert [e.kind for e in events if e.kind == "limit.hit"] == ["limit.hit"]

    async def test_tool_call_limit_answers_the_rest(self) -> None:
        model = ScriptedModel([reply("", call("t"), call("t"), call("t"))])
        async with Session(
            Agent(model=model, tools=[FakeTool("t").tool]), config=RunConfig(max_tool_calls=2)
        ) as session:
            with pytest.raises(LimitExceeded, match="max_tool_calls"):
                await session.run("go")
            check_pairing(session.conversation_messages, allow_pending=False)

    async def test_layer_exception_propagates_unchanged_and_pairing_is_repaired(self) -> None:
        class Broken(Layer):
            async def wrap_tool(
                self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
            ) -> ToolResult:
                raise KeyError("layer bug")

        error = KeyError("layer bug")
        model = ScriptedModel([reply("", call("t"), call("t"))])
        async with Session(
            Agent(model=model, tools=[FakeTool("t").tool], middleware=[Broken()])
        ) as session:
            with pytest.raises(KeyError) as info:
                await session.run("go")
            check_pairing(session.conversation_messages, allow_pending=False)
        assert info.value.args == error.args

    async def test_model_errors_propagate(self) -> None:
        async with Session(Agent(model=ScriptedModel([ConnectionError("down")]))) as session:
            with pytest.raises(ConnectionError, match="down"):
                await session.run("go")

    async def test_concurrent_runs_of_one_session_are_refused(self) -> None:
        model = ScriptedModel([HANG])
        async with Session(Agent(model=model)) as session:
            async with anyio.create_task_group() as tg:
                tg.start_soon(session.run, "first")
                await anyio.wait_all_tasks_blocked()
                with pytest.raises(SessionBusy):
                    await session.run("second")
                tg.cancel_scope.cancel()

    async def test_session_must_be_entered(self) -> None:
        with pytest.raises(RuntimeError, match="async with Session"):
            await Session(Agent(model=ScriptedModel(["x"]))).run("go")

    @given(plan=st.lists(st.integers(0, 3), min_size=1, max_size=5))
    async def test_any_sequence_of_tool_turns_keeps_pairing(self, plan: list[int]) -> None:
        script: list[Any] = [
            reply("", *(call("t") for _ in range(n))) if n else reply("thinking") for n in plan
        ]
        script[-1] = "final"
        model = ScriptedModel(script)
        async with Session(Agent(model=model, tools=[FakeTool("t").tool])) as session:
            result = await session.run("go")
        check_pairing(session.conversation_messages, allow_pending=False)
        # the run ends at the first turn without tool calls
        ends_at = next(i for i, n in enumerate(plan) if n == 0 or i == len(plan) - 1)
        assert result.model_calls == ends_at + 1
        assert result.final_text == ("final" if ends_at == len(plan) - 1 else "thinking")


class TestBackgroundWork:
    """Background tasks live in the session's group: waited for, then cancelled."""

    async def test_session_waits_for_background_work_within_the_grace_period(self) -> None:
        done: list[str] = []

        async def slow() -> None:
            await anyio.sleep(0.01)
            done.append("slow")

        async with Session(Agent(model=ScriptedModel(["x"])), grace_period=5) as session:
            session.ctx.spawn(slow)
        assert done == ["slow"]

    async def test_hanging_work_is_cancelled_after_the_grace_period(self) -> None:
        cancelled: list[bool] = []

        async def hang() -> None:
            try:
                await anyio.sleep_forever()
            finally:
                cancelled.append(True)

        with anyio.fail_after(5):
            async with Session(Agent(model=ScriptedModel(["x"])), grace_period=0.01) as session:
                session.ctx.spawn(hang)
        assert cancelled == [True]

    async def test_failing_background_work_is_reported_not_raised(self) -> None:
        async def fail() -> None:
            raise RuntimeError("extraction failed")

        with capture_events() as events:
            async with Session(Agent(model=ScriptedModel(["x"]))) as session:
                session.ctx.spawn(fail, name="extract")
                result = await session.run("still works")
        assert result.final_text == "x"
        failed = [e for e in events if e.kind == "background.failed"]
        assert [(e.task, e.error) for e in failed] == [
            ("extract", "RuntimeError: extraction failed")
        ]  # type: ignore[attr-defined]

    async def test_spawn_outside_a_session_is_an_error(self) -> None:
        async def work() -> None:
            pass

        with pytest.raises(RuntimeError, match="owned by a Session"):
            RunContext.new().spawn(work)


class TestInputs:
    """run() accepts text, a message, several messages, or nothing."""

    async def test_input_forms(self) -> None:
        model = ScriptedModel(["a", "b", "c"])
        async with Session(Agent(model=model)) as session:
            await session.run(UserMessage("m"))
            await session.run([UserMessage("x"), UserMessage("y")])
            await session.run(None)
            with pytest.raises(TypeError, match=r"input\[0\] must be a Message"):
                await session.run(["bad"])  # type: ignore[list-item]
        assert [len(r.messages) for r in model.requests] == [1, 4, 5]

    async def test_a_request_carries_the_conversation_snapshot_itself(self) -> None:
        """A Conversation checks each message as it comes in, so a request takes its
        snapshot as it is: a model call costs no pass over a long history."""
        same: list[bool] = []

        async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            same.append(request.messages is ctx.conversation.messages)
            return ModelResponse(AssistantMessage("ok"))

        async with Session(Agent(model=model)) as session:
            await session.run("hi")
            await session.run("again")
        assert same == [True, True]

    async def test_a_conversation_subclass_gets_its_history_checked(self) -> None:
        """A subclass may answer anything for its messages: the request checks them."""

        class Stranger(Conversation):
            @property
            def messages(self) -> tuple[Message, ...]:
                return (*super().messages, "stranger")  # type: ignore[return-value]

        async with Session(Agent(model=ScriptedModel(["a"])), conversation=Stranger()) as session:
            with pytest.raises(TypeError, match=r"messages\[1\] must be a Message, got str"):
                await session.run("hi")

    @pytest.mark.parametrize(
        ("bad", "index", "call_id"),
        [
            ([UserMessage("hi"), ToolResult("nope", "dangling")], 1, "nope"),
            (
                [
                    UserMessage("hi"),
                    AssistantMessage("", (ToolCall("mid", "t"),)),
                    UserMessage("and then?"),
                ],
                1,
                "mid",
            ),
            (
                [
                    AssistantMessage("", (ToolCall("a", "t"), ToolCall("b", "t"))),
                    ToolResult("a", "ok"),
                    AssistantMessage("next"),
                ],
                0,
                "b",
            ),
        ],
        ids=["dangling-result", "unanswered-call", "half-answered"],
    )
    async def test_malformed_input_is_refused_before_anything_is_appended(
        self, bad: list[Any], index: int, call_id: str
    ) -> None:
        """Input breaking the pairing rule raises PairingError naming index and id."""
        model = ScriptedModel(["never"])
        async with Session(Agent(model=model)) as session:
            await session.ctx.conversation.append(UserMessage("earlier"))
            with pytest.raises(PairingError, match=f"input\\[{index}\\].*{call_id!r}") as info:
                await session.run(bad)
            assert (info.value.index, info.value.tool_call_id) == (index, call_id)
            assert session.conversation_messages == (UserMessage("earlier"),)
        assert model.requests == []

    async def test_malformed_input_is_refused_through_a_budget_guard_with_microcompact(
        self,
    ) -> None:
        """The full compaction stack never forwards an orphan: the input check comes first."""
        from tinyctx.middleware import BudgetGuard, Microcompact

        model = ScriptedModel(["never"])
        guard = BudgetGuard(max_tokens=200, policies=[Microcompact(keep_recent=1)])
        agent = Agent(model=model, middleware=[guard])
        async with Session(agent) as session:
            with pytest.raises(PairingError, match="nope"):
                await session.run([UserMessage("hi"), ToolResult("nope", "dangling")])
            assert session.conversation_messages == ()
        assert model.requests == []

    async def test_input_reusing_a_call_id_of_the_thread_is_refused(self) -> None:
        """A call id the thread used already cannot come back in input."""
        model = ScriptedModel([reply("", call("t", id="c1")), "ok", "never"])
        tool = FakeTool("t")
        async with Session(Agent(model=model, tools=[tool.tool])) as session:
            await session.run("first")
            before = session.conversation_messages
            again = [AssistantMessage("", (ToolCall("c1", "t"),)), ToolResult("c1", "x")]
            with pytest.raises(PairingError, match="input\\[0\\].*'c1'.*used it already"):
                await session.run(again)
            assert session.conversation_messages == before

    async def test_input_may_answer_the_calls_an_abandoned_pause_left(self) -> None:
        """A well-paired input after an unresumed interrupt runs normally."""
        gate = FakeTool("gate", control=Interrupt("approve", "ok?"))
        model = ScriptedModel([reply("", call("gate", id="g1")), "fine"])
        async with Session(Agent(model=model, tools=[gate.tool])) as session:
            with pytest.raises(Interrupted):
                await session.run("go")
            result = await session.run([UserMessage("skip that"), AssistantMessage("ok")])
            check_pairing(session.conversation_messages, allow_pending=False)
        assert result.final_text == "fine"


class BadToolLayer(Layer):
    """Answers every tool call with a result for another call (a layer bug)."""

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        await call_next(call, ctx)
        return ToolResult("someone-else", "wrong")


class BadModelLayer(Layer):
    """Returns the answer's message instead of the ModelResponse (a layer bug)."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        return response.message  # type: ignore[return-value]


class BadCheckpointLayer(Layer):
    """Returns None from on_checkpoint (forgot to return the checkpoint)."""

    def on_checkpoint(self, checkpoint: Any, ctx: RunContext[Any]) -> Any:
        return None


class TestMisuseIsNamed:
    """Wrong arguments and buggy layers fail with an error naming what is wrong, and the
    conversation stays well-paired."""

    async def test_wrong_constructor_and_call_arguments(self) -> None:
        """Agent, Session, enter and resume refuse what they cannot use, saying why."""
        with pytest.raises(TypeError, match="Agent.model must be an async callable"):
            Agent(model=42)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"Agent.model='gpt-4o'.*'<prefix>:<model>'"):
            Agent(model="gpt-4o")
        with pytest.raises(TypeError, match="Session needs an Agent, got str"):
            Session("agent")  # type: ignore[arg-type]
        agent = Agent(model=ScriptedModel(["ok"]))
        with pytest.raises(ValueError, match="grace_period"):
            Session(agent, grace_period=-1)
        session = Session(agent)
        async with session:
            with pytest.raises(RuntimeError, match="entered once"):
                await session.__aenter__()
            with pytest.raises(TypeError, match="resume needs a Checkpoint, got dict"):
                await session.resume({"phase": "model"})  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="entered once"):
            await session.__aenter__()  # not after leaving either

    @pytest.mark.parametrize(
        ("decisions", "message"),
        [
            (["approve"], "decisions must be a mapping of call id to decision, got list"),
            ({1: "approve"}, "decision keys must be call ids"),
            ({"g1": "approve"}, r"decisions\['g1'\] must be Approve, Edit, Reject or Respond"),
        ],
        ids=["not-a-mapping", "key-not-a-call-id", "not-a-decision"],
    )
    async def test_bad_decisions_are_refused_and_the_session_stays_paused(
        self, decisions: Any, message: str
    ) -> None:
        """resume(decisions=...) of the wrong shape raises TypeError; the run is still paused."""
        gate = FakeTool("gate", control=Interrupt("approve", "ok?"))
        model = ScriptedModel([reply("", call("gate", id="g1")), "done"])
        async with Session(Agent(model=model, tools=[gate.tool])) as session:
            with pytest.raises(Interrupted):
                await session.run("go")
            paused = session.paused
            with pytest.raises(TypeError, match=message):
                await session.resume(decisions=decisions)
            assert session.paused is paused

    async def test_a_tool_layer_answering_the_wrong_call_is_named(self) -> None:
        """A tool layer returning another call's result fails the run naming the call;
        the call is still answered in the history."""
        tool = FakeTool("t")
        model = ScriptedModel([reply("", call("t", id="c1")), "never"])
        agent = Agent(model=model, tools=[tool.tool], middleware=[BadToolLayer()])
        async with Session(agent) as session:
            with pytest.raises(Exception, match="answered call 'c1'.*same tool_call_id"):
                await session.run("go")
            check_pairing(session.conversation_messages, allow_pending=False)

    async def test_a_model_layer_returning_no_response_is_named(self) -> None:
        """A model layer that returns something else than a ModelResponse fails the run
        naming the type, and nothing is appended for that call."""
        model = ScriptedModel(["hello"])
        async with Session(Agent(model=model, middleware=[BadModelLayer()])) as session:
            with pytest.raises(
                TypeError, match="returned AssistantMessage, expected ModelResponse"
            ):
                await session.run("hi")
            assert session.conversation_messages == (UserMessage("hi"),)

    async def test_an_on_checkpoint_hook_returning_none_is_named(self) -> None:
        """on_checkpoint must return a Checkpoint: None fails the pause naming the layer."""
        gate = FakeTool("gate", control=Interrupt("approve", "ok?"))
        model = ScriptedModel([reply("", call("gate", id="g1"))])
        agent = Agent(model=model, tools=[gate.tool], middleware=[BadCheckpointLayer()])
        async with Session(agent) as session:
            with pytest.raises(
                TypeError, match="BadCheckpointLayer.*on_checkpoint returned NoneType"
            ):
                await session.run("go")
            assert session.paused is None  # no half-made pause to resume
            check_pairing(session.conversation_messages, allow_pending=False)


class TestRunHooks:
    """Layers see a run start and end, in layer order and reverse, however it ends."""

    class Hooks(Layer):
        def __init__(self, name: str, log: list[str]) -> None:
            self.name = name
            self.log = log

        async def on_run_start(self, ctx: RunContext[Any]) -> None:
            self.log.append(f"start:{self.name}")

        async def on_run_end(
            self, ctx: RunContext[Any], result: Any, error: BaseException | None
        ) -> None:
            outcome = result.status if result is not None else type(error).__name__
            self.log.append(f"end:{self.name}:{outcome}")

    async def test_hooks_on_completion_and_on_failure(self) -> None:
        log: list[str] = []
        model = ScriptedModel(["fine", ValueError("model down")])
        agent = Agent(model=model, middleware=[self.Hooks("a", log), self.Hooks("b", log)])
        async with Session(agent) as session:
            await session.run("1")
            with pytest.raises(ValueError):
                await session.run("2")
        assert log == [
            "start:a",
            "start:b",
            "end:b:completed",
            "end:a:completed",
            "start:a",
            "start:b",
            "end:b:ValueError",
            "end:a:ValueError",
        ]

    async def test_a_tool_registered_at_run_start_is_offered_for_that_run_only(self) -> None:
        extra = FakeTool("extra", returns="from run tool")

        class Registers(Layer):
            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                ctx.tools.register(extra.tool)

        model = ScriptedModel([reply("", call("extra")), "done", "plain"])
        agent = Agent(model=model, middleware=[Registers()])
        async with Session(agent) as session:
            await session.run("go")
        assert [t.name for t in model.requests[0].tools] == ["extra"]
        assert extra.calls == [{}]
        async with Session(Agent(model=model)) as other:
            await other.run("again")
        assert model.requests[-1].tools == ()


class TestTraceCloses:
    """Every run's trace ends with run.finished, however the run ended."""

    async def test_failed_and_handler_cancelled_runs_report_their_end(self) -> None:
        async def cancelling_tool(arguments: Any, ctx: RunContext[Any]) -> str:
            raise RunCancelled("stream", "upstream closed")

        model = ScriptedModel([ValueError("boom"), reply("", call("c"))])
        agent = Agent(model=model, tools=[Tool("c", handler=cancelling_tool)])
        async with Session(agent) as session:
            with capture_events() as events:
                with pytest.raises(ValueError):
                    await session.run("first")
                with pytest.raises(RunCancelled):
                    await session.run("second")
            check_pairing(session.conversation_messages, allow_pending=False)
        finished = [e.status for e in events if e.kind == "run.finished"]  # type: ignore[attr-defined]
        assert finished == ["failed", "cancelled"]
        cancelled = [e for e in events if e.kind == "run.cancelled"]
        assert [(e.checkpoint, e.reason) for e in cancelled] == [("stream", "upstream closed")]  # type: ignore[attr-defined]

    async def test_a_checkpoint_cancel_is_reported_once(self) -> None:
        async with Session(Agent(model=ScriptedModel(["x"]))) as session:
            session.cancel("stop")
            with capture_events() as events:
                with pytest.raises(RunCancelled):
                    await session.run("go")
        assert [e.kind for e in events if e.kind in ("run.cancelled", "run.finished")] == [
            "run.cancelled",
            "run.finished",
        ]


class TestCancelRun:
    """cancel_run stops the run in progress; the session stays usable."""

    async def test_stop_generating_then_continue(self) -> None:
        model = ScriptedModel([HANG, "second answer"])
        async with Session(Agent(model=model)) as session:
            assert session.cancel_run() is False  # nothing running
            async with anyio.create_task_group() as tg:

                async def first() -> None:
                    with pytest.raises(RunCancelled):
                        await session.run("first")

                tg.start_soon(first)
                await anyio.wait_all_tasks_blocked()
                assert session.cancel_run("user pressed stop") is True
            result = await session.run("second")
        assert result.final_text == "second answer"
        assert not session.ctx.cancellation.is_cancelled()

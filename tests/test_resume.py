"""Resuming an interrupted run: validation, failed resumes, and the exception path."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    Interrupt,
    Interrupted,
    Layer,
    MemoryStore,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunContext,
    Session,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.agent import Checkpoint
from tinyctx.codec import decode_messages
from tinyctx.errors import InvalidCheckpoint
from tinyctx.messages import check_pairing
from tinyctx.testing import FakeTool, ScriptedModel, call, reply


class Gate(Layer):
    """Pauses for approval whenever the model asks for ``deploy``."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        if any(c.name == "deploy" for c in response.message.tool_calls):
            ctx.request_control(Interrupt("approval", "deploy?"))
        return response


class FailingStart(Layer):
    """A run-start hook that awaits and then fails (or hangs) while ``armed``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.armed = False

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        if not self.armed:
            return
        await anyio.lowlevel.checkpoint()
        if self.mode == "raise":
            raise RuntimeError("notes store down")
        await anyio.sleep_forever()


def strict_model(*script: Any) -> ScriptedModel:
    """A scripted model that checks every request it gets keeps strict pairing."""

    def checked(answer: Any) -> Any:
        def respond(request: ModelRequest, ctx: RunContext[Any]) -> Any:
            check_pairing(request.messages, allow_pending=False)
            return answer

        return respond

    return ScriptedModel([checked(a) for a in script])


async def paused_session(
    session: Session[Any],
) -> Checkpoint:
    with pytest.raises(Interrupted) as info:
        await session.run("ship it")
    return info.value.checkpoint


class TestFailedResume:
    """#15 D1: a resume that fails leaves the session paused on the same checkpoint."""

    @pytest.mark.parametrize("mode", ["raise", "cancel"])
    async def test_failed_resume_keeps_the_pause(self, mode: str) -> None:
        """A run-start hook raising, or the caller cancelling it, keeps the checkpoint."""
        deploy = FakeTool("deploy", returns="deployed")
        start = FailingStart(mode)
        model = strict_model(reply("", call("deploy", id="d")), "after", "fresh")
        agent = Agent(model=model, tools=[deploy.tool], middleware=[start, Gate()])
        async with Session(agent) as session:
            checkpoint = await paused_session(session)
            start.armed = True
            if mode == "raise":
                with pytest.raises(RuntimeError, match="notes store down"):
                    await session.resume()
            else:
                with anyio.move_on_after(0.05):
                    await session.resume()
            assert session.paused is checkpoint
            assert deploy.calls == []
            check_pairing(session.conversation_messages)  # 'd' still pending, not orphaned
            start.armed = False
            result = await session.resume()
            assert result.final_text == "after"
            assert deploy.calls == [{}]
            assert session.paused is None
            check_pairing(session.conversation_messages, allow_pending=False)

    async def test_a_run_after_a_failed_resume_answers_the_pending_call(self) -> None:
        """After a failed resume a new run answers the pending call; no orphan reaches the model."""
        start = FailingStart("raise")
        model = strict_model(reply("", call("deploy", id="d")), "fresh")
        agent = Agent(model=model, tools=[FakeTool("deploy").tool], middleware=[start, Gate()])
        async with Session(agent) as session:
            checkpoint = await paused_session(session)
            start.armed = True
            with pytest.raises(RuntimeError):
                await session.resume(checkpoint)
            start.armed = False
            result = await session.run("never mind")
        assert result.final_text == "fresh"
        check_pairing(session.conversation_messages, allow_pending=False)

    async def test_a_failed_resume_in_a_new_session_keeps_the_checkpoint(self) -> None:
        """A checkpoint from elsewhere stays the session's pause when its resume fails."""
        start = FailingStart("raise")
        model = strict_model(reply("", call("deploy", id="d")), "after")
        deploy = FakeTool("deploy")
        agent = Agent(model=model, tools=[deploy.tool], middleware=[start, Gate()])
        async with Session(agent, thread_id="t") as first:
            checkpoint = await paused_session(first)
        async with Session(agent, thread_id="t") as second:
            start.armed = True
            with pytest.raises(RuntimeError):
                await second.resume(checkpoint)
            assert second.paused is checkpoint
            start.armed = False
            assert (await second.resume()).final_text == "after"
        assert deploy.calls == [{}]

    async def test_a_failure_after_the_start_answers_the_pending_calls(self) -> None:
        """Once the resumed run is past its start, a failure answers pending calls instead."""

        async def boom(arguments: Any) -> str:
            raise RunCancelled("in_tool", "the tool gave up")

        model = strict_model(reply("", call("deploy", id="d"), call("deploy", id="e")))
        deploy = FakeTool("deploy", returns=boom)
        agent = Agent(model=model, tools=[deploy.tool], middleware=[Gate()])
        async with Session(agent) as session:
            await paused_session(session)
            with pytest.raises(RunCancelled):
                await session.resume()
            assert session.paused is None
            check_pairing(session.conversation_messages, allow_pending=False)


class TestResumeValidation:
    """A corrupted or hand-edited checkpoint is refused before anything runs."""

    async def test_pending_calls_must_be_the_open_calls(self) -> None:
        """The issue's case: pending says 'zzz' while call '1' is open: refused, nothing ran."""
        deploy = FakeTool("deploy")
        model = ScriptedModel([reply("", call("deploy", id="1")), "never"])
        agent = Agent(model=model, tools=[deploy.tool], middleware=[Gate()])
        async with Session(agent) as session:
            checkpoint = await paused_session(session)
            forged = checkpoint.evolve(pending=(ToolCall("zzz", "deploy"),))
            history = session.conversation_messages
            with pytest.raises(InvalidCheckpoint, match=r"pending calls \['zzz'\].*\['1'\]"):
                await session.resume(forged)
            assert session.paused is checkpoint
            assert session.conversation_messages == history
        assert model.calls == 1
        assert deploy.calls == []

    async def test_an_orphan_result_in_the_history_is_refused(self) -> None:
        """A history with a result answering no call is refused with the pairing error."""
        model = ScriptedModel([reply("", call("deploy", id="1")), "never"])
        agent = Agent(model=model, tools=[FakeTool("deploy").tool], middleware=[Gate()])
        async with Session(agent) as session:
            checkpoint = await paused_session(session)
            orphan = ToolResult("zzz", "deploy", "forged")
            forged = checkpoint.evolve(messages=(*checkpoint.messages, orphan))
            with pytest.raises(InvalidCheckpoint, match="breaks tool-call pairing.*'zzz'"):
                await session.resume(forged)
        assert model.calls == 1

    def test_phase_and_pending_must_agree(self) -> None:
        """A before_model checkpoint with pending calls, or an unknown phase, is refused."""
        from tinyctx import AssistantMessage, RunConfig, UserMessage

        calls = (ToolCall("1", "deploy"),)
        messages: tuple[Message, ...] = (UserMessage("go"), AssistantMessage("", calls))
        base = Checkpoint(RunConfig(), "tools", calls, "n", "m", messages, messages)
        base.check()
        with pytest.raises(InvalidCheckpoint, match="phase 'before_model' with open"):
            base.evolve(phase="before_model").check()
        with pytest.raises(InvalidCheckpoint, match="phase 'later'"):
            base.evolve(phase="later").check()

    async def test_resume_without_a_pause_is_a_clear_error(self) -> None:
        """resume() with nothing paused names the thread."""
        async with Session(Agent(model=ScriptedModel([])), thread_id="quiet") as session:
            with pytest.raises(InvalidCheckpoint, match="'quiet' has no paused run"):
                await session.resume()

    @given(drop=st.integers(0, 2), extra=st.booleans())
    async def test_only_the_exact_open_calls_resume(self, drop: int, extra: bool) -> None:
        """Any pending set other than exactly the open calls is refused."""
        calls = (ToolCall("a", "deploy"), ToolCall("b", "deploy"))
        pending = calls[drop:] + ((ToolCall("c", "deploy"),) if extra else ())
        model = ScriptedModel([reply("", *calls)])
        agent = Agent(model=model, tools=[FakeTool("deploy").tool], middleware=[Gate()])
        async with Session(agent) as session:
            checkpoint = await paused_session(session)
            forged = checkpoint.evolve(pending=pending)
            if pending == calls:
                forged.check()
            else:
                with pytest.raises(InvalidCheckpoint):
                    await session.resume(forged)


class TestEachPauseResumesOnce:
    """A checkpoint resumes only the pause its session or thread is on: a second resume of
    the same checkpoint (a double-clicked approval), or one of a pause the thread went on
    from (a stale review page), is refused and runs nothing."""

    def agent(self, deploy: FakeTool, *script: Any) -> Agent:
        return Agent(model=ScriptedModel(list(script)), tools=[deploy.tool], middleware=[Gate()])

    async def paused_thread(self, store: MemoryStore, deploy: FakeTool) -> Checkpoint:
        """Stored thread 't' paused on deploy 'd1': the pause's checkpoint."""
        agent = self.agent(deploy, reply("", call("deploy", id="d1")))
        async with Session(agent, thread_id="t", store=store) as session:
            return await paused_session(session)

    async def test_the_same_checkpoint_twice_in_one_session(self) -> None:
        """The second resume is refused naming the thread; deploy ran once."""
        deploy = FakeTool("deploy")
        agent = self.agent(deploy, reply("", call("deploy", id="d1")), "shipped", "again")
        async with Session(agent, thread_id="m") as session:
            checkpoint = await paused_session(session)
            assert (await session.resume(checkpoint)).final_text == "shipped"
            history = session.conversation_messages
            with pytest.raises(InvalidCheckpoint, match="'m' is not paused on this checkpoint"):
                await session.resume(checkpoint)
            assert session.conversation_messages == history
        assert len(deploy.calls) == 1

    async def test_the_same_checkpoint_twice_across_durable_sessions(self) -> None:
        """Two workers given the same checkpoint: the first resumes, the second is refused
        and leaves the stored thread as the first left it."""
        store = MemoryStore()
        deploy = FakeTool("deploy")
        checkpoint = await self.paused_thread(store, deploy)
        async with Session(self.agent(deploy, "shipped"), thread_id="t", store=store) as s:
            assert (await s.resume(checkpoint)).final_text == "shipped"  # a decoded copy
        version = (await store.load_thread("t")).version
        async with Session(self.agent(deploy, "again"), thread_id="t", store=store) as s:
            with pytest.raises(InvalidCheckpoint, match="resumed or abandoned already"):
                await s.resume(checkpoint)
        assert (await store.load_thread("t")).version == version
        assert len(deploy.calls) == 1

    async def test_a_pause_the_thread_went_on_from_is_not_rolled_back(self) -> None:
        """The user moved on instead of approving; a late approval of the old checkpoint
        is refused: the later turns stay, deploy never runs."""
        store = MemoryStore()
        deploy = FakeTool("deploy")
        checkpoint = await self.paused_thread(store, deploy)
        async with Session(self.agent(deploy, "not shipping"), thread_id="t", store=store) as s:
            await s.run("never mind")
        before = (await store.load_thread("t")).messages
        async with Session(self.agent(deploy, "shipped"), thread_id="t", store=store) as s:
            with pytest.raises(InvalidCheckpoint, match="not paused on this checkpoint"):
                await s.resume(checkpoint)
        after = decode_messages((await store.load_thread("t")).messages)
        assert after == decode_messages(before)
        assert [m.text for m in after][-2:] == ["never mind", "not shipping"]
        assert deploy.calls == []

    async def test_a_session_paused_on_another_run_refuses_an_older_checkpoint(self) -> None:
        """Paused again after a resume: the first pause's checkpoint is refused, the
        session stays paused on the second, and resume() resumes it."""
        deploy = FakeTool("deploy")
        agent = self.agent(
            deploy,
            reply("", call("deploy", id="d1")),
            reply("", call("deploy", id="d2")),
            "both shipped",
        )
        async with Session(agent, thread_id="p") as session:
            first = await paused_session(session)
            with pytest.raises(Interrupted) as info:
                await session.resume(first)
            second = info.value.checkpoint
            with pytest.raises(InvalidCheckpoint, match="paused on another run.*pending 'd2'"):
                await session.resume(first)
            edited = (UserMessage("ship everything"), *second.messages[1:])
            with pytest.raises(InvalidCheckpoint, match="paused on another run"):
                await session.resume(second.evolve(messages=edited))  # same ids, other history
            assert session.paused is second
            assert (await session.resume()).final_text == "both shipped"
        assert len(deploy.calls) == 2

    async def test_a_fresh_session_takes_a_checkpoint_from_elsewhere(self) -> None:
        """Without a store, a new session restores the checkpoint's history and resumes."""
        deploy = FakeTool("deploy")
        async with Session(
            self.agent(deploy, reply("", call("deploy", id="d1"))), thread_id="f"
        ) as session:
            checkpoint = await paused_session(session)
        async with Session(self.agent(deploy, "shipped"), thread_id="f") as session:
            assert (await session.resume(checkpoint)).final_text == "shipped"
        assert len(deploy.calls) == 1

    @given(steps=st.lists(st.sampled_from(["resume_checkpoint", "resume", "run"]), max_size=5))
    async def test_any_order_of_resumes_runs_the_approved_call_at_most_once(
        self, steps: list[str]
    ) -> None:
        """Whatever workers do with one paused thread (resume the checkpoint they hold,
        resume the stored pause, or move on), deploy runs at most once and the thread
        stays paired."""
        store = MemoryStore()
        deploy = FakeTool("deploy")
        checkpoint = await self.paused_thread(store, deploy)
        for step in steps:
            async with Session(self.agent(deploy, "ok"), thread_id="t", store=store) as s:
                try:
                    if step == "run":
                        await s.run("next")
                    else:
                        await s.resume(checkpoint if step == "resume_checkpoint" else None)
                except InvalidCheckpoint:
                    pass
        assert len(deploy.calls) <= 1
        check_pairing(decode_messages((await store.load_thread("t")).messages))


class TestExceptionPath:
    """Synthetic results reach subscribers when a run's exception leaves the session."""

    async def test_caller_cancel_delivers_synthetic_results(self) -> None:
        """A caller's cancel scope around the session: every call is answered to subscribers."""
        seen: list[Message] = []

        async def keep(message: Message, usage: Usage | None) -> None:
            seen.append(message)

        with anyio.CancelScope() as scope:

            async def cancel_caller(arguments: Any) -> str:
                scope.cancel()
                await anyio.sleep_forever()
                return "never"

            model = ScriptedModel([reply("", call("slow", id="s1"), call("slow", id="s2"))])
            agent = Agent(model=model, tools=[FakeTool("slow", returns=cancel_caller).tool])
            async with Session(agent) as session:
                session.ctx.conversation.subscribe(keep)
                await session.run("go")
        assert scope.cancelled_caught
        check_pairing(seen, allow_pending=False)
        assert {m.tool_call_id for m in seen if isinstance(m, ToolResult)} == {"s1", "s2"}

    async def test_uncaught_run_cancelled_delivers_synthetic_results(self) -> None:
        """A RunCancelled leaving the session block still persists every synthetic result."""
        seen: list[Message] = []

        async def keep(message: Message, usage: Usage | None) -> None:
            seen.append(message)

        async def give_up(arguments: Any) -> str:
            raise RunCancelled("in_tool", "stop")

        model = ScriptedModel([reply("", call("t", id="a"), call("t", id="b"))])
        agent = Agent(model=model, tools=[FakeTool("t", returns=give_up).tool])
        with pytest.raises(RunCancelled):
            async with Session(agent) as session:
                session.ctx.conversation.subscribe(keep)
                await session.run("go")
        check_pairing(seen, allow_pending=False)
        assert [m.tool_call_id for m in seen if isinstance(m, ToolResult)] == ["a", "b"]

    async def test_a_failing_subscriber_does_not_replace_the_error(self) -> None:
        """The run's own exception leaves the session even when a subscriber fails."""
        from tinyctx.events import SubscriberFailed
        from tinyctx.testing import capture_events

        async def give_up(arguments: Any) -> str:
            raise RunCancelled("in_tool", "stop")

        async def broken(message: Message, usage: Usage | None) -> None:
            if isinstance(message, ToolResult):
                raise OSError("disk full")

        model = ScriptedModel([reply("", call("t", id="a"))])
        agent = Agent(model=model, tools=[FakeTool("t", returns=give_up).tool])
        with capture_events(SubscriberFailed) as failures, pytest.raises(RunCancelled):
            async with Session(agent) as session:
                session.ctx.conversation.subscribe(broken)
                await session.run("go")
        assert [e.error for e in failures] == ["OSError: disk full"]

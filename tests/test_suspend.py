"""Suspended tool calls: a call that pauses the run without a result, and a sub-agent's
review completed through its parent's resume (in memory and through a store)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    Approve,
    Edit,
    Interrupted,
    InvalidCheckpoint,
    Layer,
    Reject,
    ResumeError,
    RunCancelled,
    RunConfig,
    Session,
    SqliteStore,
    Suspend,
    TinyCtxError,
    Tool,
    ToolCall,
    ToolResult,
)
from tinyctx.agent import Checkpoint
from tinyctx.chain import ToolCallHandler
from tinyctx.codec import decode_checkpoint, encode_checkpoint
from tinyctx.context import RunContext
from tinyctx.control import Resumption, resumption
from tinyctx.events import ToolCallSuspended
from tinyctx.frozen import thaw
from tinyctx.messages import check_pairing
from tinyctx.middleware import (
    Approvals,
    CallLimits,
    ContextPolicy,
    Inherit,
    check_subagent_resume,
    run_subagent,
    subagent_tool,
)
from tinyctx.middleware.context_view import VIEW_GLOBAL_KEY
from tinyctx.middleware.stacks import default_stack
from tinyctx.state import StateError
from tinyctx.testing import HANG, FakeTool, ScriptedModel, call, capture_events, reply


def results_of(messages: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for message in messages:
        if isinstance(message, ToolResult):
            out.setdefault(message.tool_call_id, []).append(message.content)
    return out


class Reviewed:
    """A parent whose ``helper`` sub-agent deploys only after a review."""

    def __init__(self, *, child_replies: int = 1) -> None:
        self.deployed: list[dict[str, Any]] = []

        async def deploy(arguments: Any, ctx: RunContext[Any]) -> str:
            self.deployed.append(thaw(arguments))
            return f"deployed to {arguments['env']}"

        self.deploy = Tool(
            "deploy",
            "Deploy.",
            {
                "type": "object",
                "properties": {"env": {"type": "string"}},
                "required": ["env"],
                "additionalProperties": False,
            },
            handler=deploy,
        )
        self.child_model = ScriptedModel(
            [reply("", call("deploy", id="d1", env="prod")), "shipped"]
        )
        self.child = Agent(
            model=self.child_model,
            tools=[self.deploy],
            middleware=[Approvals("deploy")],
            name="helper",
        )
        self.after = FakeTool("after")
        self.parent_model = ScriptedModel(
            [
                reply("", call("helper", id="h1", task="ship it"), call("after", id="a1")),
                "parent done",
            ]
        )
        self.parent = Agent(
            model=self.parent_model, tools=[subagent_tool(self.child), self.after.tool]
        )


async def pause(session: Session[Any]) -> Interrupted:
    with pytest.raises(Interrupted) as info:
        await session.run("go")
    return info.value


class TestSubagentReview:
    """A review inside a sub-agent is shown and decided through the parent's pause."""

    async def test_the_parent_pauses_at_the_delegating_call_with_the_childs_review(self) -> None:
        """The parent's pause names the sub-agent's node, carries its review card, and
        leaves the delegating call and the calls after it pending, unanswered."""
        case = Reviewed()
        async with Session(case.parent) as session:
            paused = await pause(session)
            assert paused.node == "helper/Approvals"
            card = thaw(paused.payload)
            assert card["type"] == "tool_review"
            assert [(c["id"], c["name"]) for c in card["calls"]] == [("d1", "deploy")]
            checkpoint = paused.checkpoint
            assert checkpoint.phase == "tools"
            assert [c.id for c in checkpoint.pending] == ["h1", "a1"]
            assert results_of(session.conversation_messages) == {}
            assert case.deployed == [] and case.after.calls == []

    async def test_the_parents_resume_runs_the_reviewed_call_once_and_finishes(self) -> None:
        """resume(decisions=...) on the parent continues the sub-agent with them: the
        approved call runs once, the sub-agent's answer is the delegating call's result,
        and the parent's later calls run."""
        case = Reviewed()
        async with Session(case.parent) as session:
            with capture_events() as events:
                await pause(session)
                result = await session.resume(decisions={"d1": Approve()})
            history = session.conversation_messages
        assert result.status == "completed" and result.final_text == "parent done"
        assert case.deployed == [{"env": "prod"}]
        assert results_of(history) == {"h1": ["shipped"], "a1": ["ok"]}
        check_pairing(history, allow_pending=False)
        (suspended,) = [e for e in events if isinstance(e, ToolCallSuspended)]
        assert (suspended.tool, suspended.tool_call_id, suspended.node) == (
            "helper",
            "h1",
            "helper/Approvals",
        )
        # the sub-agent's model saw the approved call's real result
        child_last = case.child_model.requests[-1].messages
        assert [m.content for m in child_last if isinstance(m, ToolResult)] == ["deployed to prod"]

    async def test_edited_and_rejected_calls_reach_the_subagent(self) -> None:
        """An edit runs the call with the reviewer's arguments; a rejection never runs it
        and the sub-agent reads why."""
        edited = Reviewed()
        async with Session(edited.parent) as session:
            await pause(session)
            await session.resume(decisions={"d1": Edit({"env": "staging"})})
        assert edited.deployed == [{"env": "staging"}]

        rejected = Reviewed()
        async with Session(rejected.parent) as session:
            await pause(session)
            result = await session.resume(decisions={"d1": Reject("not on a Friday")})
        assert result.status == "completed" and rejected.deployed == []
        child_last = rejected.child_model.requests[-1].messages
        (answer,) = [m for m in child_last if isinstance(m, ToolResult)]
        assert "not on a Friday" in answer.content

    async def test_bad_decisions_are_refused_before_anything_runs(self) -> None:
        """The sub-agent's review checks the parent's resume: a missing, unknown or
        disallowed decision is a ResumeError, the parent stays paused, nothing ran; a
        good decision then resumes."""
        case = Reviewed()
        async with Session(case.parent) as session:
            paused = await pause(session)
            for decisions, problem in (
                ({}, "missing decision for call 'd1'"),
                ({"d1": Approve(), "zz": Approve()}, "unknown call id 'zz'"),
                ({"d1": Edit({"env": 3})}, "fail the schema of 'deploy'"),
            ):
                with pytest.raises(ResumeError, match=problem):
                    await session.resume(decisions=decisions)
                assert session.paused is paused.checkpoint
                assert case.deployed == [] and case.after.calls == []
                assert len(case.child_model.requests) == 1  # the sub-agent did not go on
            result = await session.resume(decisions={"d1": Approve()})
        assert result.status == "completed" and case.deployed == [{"env": "prod"}]

    async def test_check_resume_tells_without_changing_anything(self) -> None:
        """Session.check_resume raises what resume would and leaves the pause as it was."""
        case = Reviewed()
        async with Session(case.parent) as session:
            paused = await pause(session)
            with pytest.raises(ResumeError, match="missing decision for call 'd1'"):
                await session.check_resume()
            await session.check_resume(decisions={"d1": Approve()})
            await session.check_resume(paused.checkpoint, decisions={"d1": Approve()})
            assert session.paused is paused.checkpoint and case.deployed == []
            result = await session.resume(decisions={"d1": Approve()})
        assert result.status == "completed" and case.deployed == [{"env": "prod"}]

    async def test_a_second_resume_of_the_same_pause_is_refused(self) -> None:
        """The reviewed call never runs twice, however often the pause is resumed."""
        case = Reviewed()
        async with Session(case.parent) as session:
            paused = await pause(session)
            await session.resume(decisions={"d1": Approve()})
            with pytest.raises(InvalidCheckpoint):
                await session.resume(paused.checkpoint, decisions={"d1": Approve()})
        assert case.deployed == [{"env": "prod"}]

    async def test_the_pause_survives_a_store_and_another_session(self, tmp_path: Path) -> None:
        """Stored with the parent's thread, the sub-agent's pause is resumed by a later
        session that only has the store (another request, another worker)."""
        case = Reviewed()
        async with SqliteStore(tmp_path / "t.db") as store:
            async with Session(case.parent, thread_id="ops", store=store) as first:
                paused = await pause(first)
            # the checkpoint the store keeps round-trips through the codec
            again = decode_checkpoint(encode_checkpoint(paused.checkpoint))
            assert again.state == paused.checkpoint.state
            async with Session(case.parent, thread_id="ops", store=store) as later:
                assert later.paused is not None
                assert later.paused.node == "helper/Approvals"
                with pytest.raises(ResumeError):
                    await later.resume(decisions={"d1": Reject("wrong"), "x": Approve()})
                result = await later.resume(decisions={"d1": Approve()})
                history = later.conversation_messages
            async with Session(case.parent, thread_id="ops", store=store) as third:
                assert third.paused is None
                assert third.conversation_messages == history
        assert result.final_text == "parent done"
        assert case.deployed == [{"env": "prod"}]
        check_pairing(history, allow_pending=False)

    async def test_a_review_two_subagents_deep_reaches_the_innermost(self) -> None:
        """A sub-agent of a sub-agent: the node names the path, and the resume goes down
        to the innermost pause (each level resumes its own call, no other)."""
        inner = Reviewed()
        middle_model = ScriptedModel(
            [reply("", call("helper", id="m1", task="deep")), "middle done"]
        )
        middle = Agent(model=middle_model, tools=[subagent_tool(inner.child)], name="middle")
        top_model = ScriptedModel([reply("", call("middle", id="t1", task="go")), "top done"])
        top = Agent(model=top_model, tools=[subagent_tool(middle)])
        async with Session(top) as session:
            paused = await pause(session)
            assert paused.node == "middle/helper/Approvals"
            assert [c["id"] for c in thaw(paused.payload)["calls"]] == ["d1"]
            with pytest.raises(ResumeError, match="missing decision"):
                await session.resume(decisions={"m1": Approve()})
            result = await session.resume(decisions={"d1": Approve()})
            history = session.conversation_messages
        assert result.final_text == "top done"
        assert inner.deployed == [{"env": "prod"}]
        assert results_of(history) == {"t1": ["middle done"]}
        assert len(middle_model.requests) == 2 and len(top_model.requests) == 2

    async def test_cancelling_the_resumed_subagent_leaves_the_parent_paired(self) -> None:
        """A cancel while the resumed sub-agent works (after the approved call ran) ends
        the parent's run promptly; the delegating call is answered, nothing is orphaned."""
        case = Reviewed()
        waiting = anyio.Event()

        def ask_to_wait(request: Any, ctx: RunContext[Any]) -> Any:
            waiting.set()
            return reply("", call("wait", id="w1"))

        wait = FakeTool("wait", returns=HANG)
        child = case.child.evolve(
            model=ScriptedModel(
                [
                    reply("", call("deploy", id="d1", env="prod")),
                    ask_to_wait,
                    "never",
                ]
            ),
            tools=[case.deploy, wait.tool],
        )
        parent = case.parent.evolve(tools=[subagent_tool(child), case.after.tool])
        async with Session(parent) as session:
            await pause(session)

            async def cancel_when_waiting() -> None:
                await waiting.wait()
                session.cancel_run("user left")

            with anyio.fail_after(5):
                async with anyio.create_task_group() as group:
                    group.start_soon(cancel_when_waiting)
                    with pytest.raises(RunCancelled):
                        await session.resume(decisions={"d1": Approve()})
            history = session.conversation_messages
        assert case.deployed == [{"env": "prod"}] and case.after.calls == []
        check_pairing(history, allow_pending=False)
        answered = results_of(history)
        assert set(answered) == {"h1", "a1"}
        assert "interrupted while running" in answered["h1"][0]

    async def test_without_suspend_the_old_note_and_the_childs_payload(self) -> None:
        """subagent_tool(suspend=False) keeps the earlier contract: the call returns a note
        and the parent pauses after it, now with the sub-agent's review payload."""
        case = Reviewed()
        parent = case.parent.evolve(
            tools=[subagent_tool(case.child, suspend=False), case.after.tool]
        )
        async with Session(parent) as session:
            paused = await pause(session)
            assert paused.node == "Approvals"
            assert [c["id"] for c in thaw(paused.payload)["calls"]] == ["d1"]
            assert "paused at Approvals" in results_of(session.conversation_messages)["h1"][0]

    async def test_the_parents_own_review_and_limits_count_the_call_once(self) -> None:
        """The parent reviews the delegation itself, then the sub-agent reviews its call;
        a per-run limit of one ``helper`` call is not spent again by the call's second run
        after the resume."""
        case = Reviewed()
        parent = case.parent.evolve(
            middleware=[Approvals("helper"), CallLimits(per_tool={"helper": 1}, scope="run")]
        )
        async with Session(parent) as session:
            first = await pause(session)
            assert first.node == "Approvals"
            with pytest.raises(Interrupted) as second:
                await session.resume(decisions={"h1": Approve()})
            assert second.value.node == "helper/Approvals"
            result = await session.resume(decisions={"d1": Approve()})
            history = session.conversation_messages
        assert result.final_text == "parent done" and case.deployed == [{"env": "prod"}]
        assert results_of(history) == {"h1": ["shipped"], "a1": ["ok"]}

    async def test_a_stored_subagent_pause_keeps_no_hidden_field(self) -> None:
        """Under an Inherit view that hides a field, neither the parent's checkpoint nor
        the sub-agent's pause kept inside it carries the field; the resume still works."""
        case = Reviewed()
        parent = case.parent.evolve(
            middleware=[Inherit(view=ContextPolicy(exclude=("extra.api_key",)))],
            tools=[subagent_tool(case.child), case.after.tool],
        )
        config = RunConfig(configurable={VIEW_GLOBAL_KEY: {"user": "ann", "api_key": "sk-hidden"}})
        async with Session(parent, config=config) as session:
            paused = await pause(session)
            stored = encode_checkpoint(paused.checkpoint)
            assert "sk-hidden" not in stored
            # the sub-agent's pause keeps no configurable: the resume inherits it again
            state = thaw(paused.checkpoint.state)["tinyctx:suspended"]["state"]
            assert decode_checkpoint(state["checkpoint"]).run_config.configurable == {}
            result = await session.resume(decisions={"d1": Approve()})
        assert result.final_text == "parent done" and case.deployed == [{"env": "prod"}]

    async def test_the_resumed_subagent_inherits_the_parents_configurable_again(self) -> None:
        """A value a store could not keep (a client object) in the parent's configurable
        does not stop the sub-agent's pause in memory, and its tools see it again after the
        parent's resume."""
        client = object()
        seen: list[object] = []

        async def deploy(arguments: Any, ctx: RunContext[Any]) -> str:
            seen.append(ctx.config.configurable.get("db"))
            return "deployed"

        child = Agent(
            model=ScriptedModel([reply("", call("deploy", id="d1")), "shipped"]),
            tools=[Tool("deploy", "Deploy.", handler=deploy)],
            middleware=[Approvals("deploy")],
            name="helper",
        )
        parent = Agent(
            model=ScriptedModel([reply("", call("helper", id="h1", task="ship")), "done"]),
            tools=[subagent_tool(child)],
        )
        async with Session(parent, config=RunConfig(configurable={"db": client})) as session:
            paused = await pause(session)
            assert paused.node == "helper/Approvals"
            result = await session.resume(decisions={"d1": Approve()})
        assert result.final_text == "done"
        assert seen == [client]

    async def test_suspend_outside_a_tool_call_is_refused_up_front(self) -> None:
        """run_subagent(suspend=True) outside any tool call says so before it runs anything
        (a Suspend there would escape the run); inside a tool it is what subagent_tool does."""
        case = Reviewed()
        with pytest.raises(TypeError, match="call it from a tool's handler"):
            await run_subagent(case.child, "ship it", RunContext.new(), suspend=True)
        assert case.child_model.requests == []
        assert resumption() is None

    async def test_check_subagent_resume_takes_only_the_context_options(self) -> None:
        """An option that does not shape the sub-agent's context is a mistake, named."""
        case = Reviewed()
        with pytest.raises(TypeError, match=r"got \['grace_period'\]; it takes name= and"):
            await check_subagent_resume(case.child, {}, {}, RunContext.new(), grace_period=1)

    def test_subagent_tool_refuses_resume_options(self) -> None:
        """A resume brings the checkpoint and decisions; the tool cannot fix them."""
        case = Reviewed()
        with pytest.raises(Exception, match="resume"):
            subagent_tool(case.child, resume=None)


def suspending_tool(times: int, seen: list[Resumption | None]) -> Tool:
    """A tool that suspends its first ``times`` runs, then answers with what it resumed."""

    async def handler(arguments: Any, ctx: RunContext[Any]) -> str:
        resumed = resumption()
        seen.append(resumed)
        done = 0 if resumed is None else int(resumed.state["done"])
        if done < times:
            raise Suspend(
                "wait", f"round {done + 1}", payload={"round": done + 1}, state={"done": done + 1}
            )
        return f"finished after {done} pauses"

    return Tool("slow", "Suspends.", handler=handler)


def pausing_once(**options: Any) -> Agent:
    """An agent whose model calls ``slow`` once (call ``s1``), which suspends once, then
    says "done"."""
    return Agent(
        model=ScriptedModel([reply("", call("slow", id="s1")), "done"]),
        tools=[suspending_tool(1, [])],
        **options,
    )


async def first_pause(agent: Agent) -> Checkpoint:
    """The checkpoint ``agent`` pauses with on its first run (in a session now closed)."""
    async with Session(agent) as session:
        with pytest.raises(Interrupted) as info:
            await session.run("go")
    return info.value.checkpoint


class CatchAll(Layer):
    """A careless tool layer that turns every exception into an error result."""

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        try:
            return await call_next(call, ctx)
        except Exception as exc:  # noqa: BLE001 - what a careless layer does
            return ToolResult.for_call(call, f"swallowed {exc!r}", is_error=True)


class TestSuspend:
    """A tool suspends its call: the run pauses without a result for it."""

    async def test_a_suspended_call_runs_again_with_its_state(self) -> None:
        """The call stays pending at the pause; the resume runs it again, and only that
        run sees resumption(); the other calls of the batch see None."""
        seen: list[Resumption | None] = []
        other = FakeTool("other", returns=lambda a: repr(resumption()))
        model = ScriptedModel(
            [
                reply("", call("other", id="o1"), call("slow", id="s1"), call("other", id="o2")),
                "done",
            ]
        )
        agent = Agent(model=model, tools=[suspending_tool(1, seen), other.tool])
        async with Session(agent) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("go")
            assert (info.value.node, info.value.message) == ("wait", "round 1")
            assert thaw(info.value.payload) == {"round": 1}
            assert [c.id for c in info.value.checkpoint.pending] == ["s1", "o2"]
            result = await session.resume()
            history = session.conversation_messages
        assert result.final_text == "done"
        assert seen[0] is None and seen[1] == Resumption({"done": 1})
        assert results_of(history) == {
            "o1": ["None"],
            "s1": ["finished after 1 pauses"],
            "o2": ["None"],
        }

    async def test_a_plain_tool_takes_no_decisions(self) -> None:
        """Decisions for a call whose tool does not check them are refused, paused still."""
        agent = pausing_once()
        async with Session(agent) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("go")
            with pytest.raises(ResumeError, match="tool 'slow', which takes none"):
                await session.resume(decisions={"s1": Approve()})
            assert session.paused is info.value.checkpoint
            assert (await session.resume()).final_text == "done"

    async def test_a_corrupted_suspension_record_is_refused(self) -> None:
        """A checkpoint whose record of the suspended call was edited (another call, a
        malformed record) is refused before anything runs; the intact one still resumes."""
        agent = pausing_once()
        checkpoint = await first_pause(agent)
        state = thaw(checkpoint.state)
        record = state["tinyctx:suspended"]
        assert record == {"call_id": "s1", "tool": "slow", "state": {"done": 1}}
        elsewhere = {**record, "call_id": "zz"}
        async with Session(agent, thread_id=checkpoint.thread_id) as fresh:
            with pytest.raises(InvalidCheckpoint, match="paused at call 'zz'"):
                await fresh.resume(
                    checkpoint.evolve(state={**state, "tinyctx:suspended": elsewhere})
                )
            with pytest.raises(StateError, match="tinyctx:suspended"):
                await fresh.resume(checkpoint.evolve(state={"tinyctx:suspended": {"call": "s1"}}))
            assert fresh.conversation_messages == ()
            result = await fresh.resume(checkpoint)
        assert result.final_text == "done"

    async def test_a_suspended_call_whose_tool_is_gone(self) -> None:
        """A later process whose agent no longer has the suspended call's tool: decisions
        for it are refused naming the tool; without decisions the call runs again and the
        model reads that the tool is unknown, pairing intact."""
        agent = pausing_once()
        checkpoint = await first_pause(agent)
        redeployed = agent.evolve(tools=[], model=ScriptedModel(["answered anyway"]))
        async with Session(redeployed, thread_id=checkpoint.thread_id) as later:
            with pytest.raises(ResumeError, match="tool 'slow', which this agent does not have"):
                await later.resume(checkpoint, decisions={"x": Approve()})
            result = await later.resume(checkpoint)
            history = later.conversation_messages
        assert result.final_text == "answered anyway"
        (answer,) = results_of(history)["s1"]
        assert "unknown tool 'slow'" in answer
        check_pairing(history, allow_pending=False)

    async def test_no_layer_can_swallow_a_suspension(self) -> None:
        """Suspend is a BaseException: a layer's ``except Exception`` lets it through."""
        agent = pausing_once(middleware=[CatchAll()])
        async with Session(agent) as session:
            with pytest.raises(Interrupted):
                await session.run("go")
            assert results_of(session.conversation_messages) == {}

    async def test_a_subagent_beside_a_heartbeat_in_a_task_group_pauses_the_parent(self) -> None:
        """A tool that runs its sub-agent in a task group (a heartbeat beside it) gets the
        Suspend back in an exception group: the parent still pauses at the call, and the
        resume completes the review."""
        case = Reviewed()
        beats: list[str] = []

        async def watched(arguments: Any, ctx: RunContext[Any]) -> str:
            async def heartbeat() -> None:
                while True:
                    beats.append("beat")
                    await anyio.lowlevel.checkpoint()

            async with anyio.create_task_group() as group:
                group.start_soon(heartbeat)
                done = await run_subagent(case.child, arguments["task"], ctx, suspend=True)
                group.cancel_scope.cancel()
            return done.text

        class Watched(Tool):
            async def check_resume(
                self, state: Any, decisions: Mapping[str, Any], ctx: RunContext[Any]
            ) -> None:
                await check_subagent_resume(case.child, state, decisions, ctx)

        tool = Watched(
            "helper",
            "Delegate.",
            {"type": "object", "properties": {"task": {"type": "string"}}},
            handler=watched,
        )
        parent = Agent(model=case.parent_model, tools=[tool, case.after.tool])
        async with Session(parent) as session:
            paused = await pause(session)
            assert paused.node == "helper/Approvals"
            assert [c.id for c in paused.checkpoint.pending] == ["h1", "a1"]
            assert results_of(session.conversation_messages) == {}
            with pytest.raises(ResumeError, match="unknown call id 'zz'"):
                await session.check_resume(decisions={"zz": Approve()})
            result = await session.resume(decisions={"d1": Approve()})
            history = session.conversation_messages
        assert result.final_text == "parent done"
        assert case.deployed == [{"env": "prod"}]
        assert results_of(history) == {"h1": ["shipped"], "a1": ["ok"]}
        assert beats
        check_pairing(history, allow_pending=False)

    async def test_two_suspensions_of_one_call_fail_clearly(self) -> None:
        """Work in one call that pauses at two nodes at once cannot be resumed as one
        pause: the run fails naming both, and the call is answered."""
        reached = anyio.Event()

        async def twice(arguments: Any, ctx: RunContext[Any]) -> str:
            async def second() -> None:
                with anyio.CancelScope(shield=True):
                    await reached.wait()
                raise Suspend("b")

            async with anyio.create_task_group() as group:
                group.start_soon(second)
                await anyio.sleep(0.01)
                reached.set()
                raise Suspend("a")

        agent = Agent(
            model=ScriptedModel([reply("", call("twice", id="t1")), "done"]),
            tools=[Tool("twice", "Pauses twice.", handler=twice)],
        )
        async with Session(agent) as session:
            twice_at_once = r"suspended 2 times at once \(nodes ('a', 'b'|'b', 'a')\)"
            with pytest.raises(TinyCtxError, match=twice_at_once):
                await session.run("go")
            history = session.conversation_messages
        check_pairing(history, allow_pending=False)
        assert results_of(history)["t1"][0].startswith("[interrupted while running")

    async def test_a_suspension_beside_a_failure_is_the_failure(self) -> None:
        """A group holding a Suspend and an error is not a pause: the run fails with the
        group as raised, pairing intact."""

        async def broken(arguments: Any, ctx: RunContext[Any]) -> str:
            async def fail() -> None:
                raise ValueError("the tool's helper failed")

            async with anyio.create_task_group() as group:
                group.start_soon(fail)
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.01)
                raise Suspend("a")

        agent = Agent(
            model=ScriptedModel([reply("", call("broken", id="b1")), "done"]),
            tools=[Tool("broken", "Fails.", handler=broken)],
        )
        async with Session(agent) as session:
            with pytest.raises(BaseExceptionGroup) as info:
                await session.run("go")
            history = session.conversation_messages
        assert info.group_contains(ValueError) and info.group_contains(Suspend)
        check_pairing(history, allow_pending=False)
        assert results_of(history)["b1"][0].startswith("[interrupted while running")

    def test_state_and_payload_must_be_json(self) -> None:
        """A Suspend whose state or payload a store could not keep fails where it is made."""
        with pytest.raises(TypeError, match="state"):
            Suspend("n", state={"x": object()})
        with pytest.raises(TypeError, match="payload"):
            Suspend("n", payload={1: "x"})
        with pytest.raises(TypeError, match="node"):
            Suspend("")

    @settings(max_examples=25, deadline=None)
    @given(
        rounds=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=4),
        stacked=st.booleans(),
        stored=st.booleans(),
    )
    def test_any_number_of_suspensions_keeps_pairing(
        self, rounds: list[int], stacked: bool, stored: bool
    ) -> None:
        """Calls that suspend any number of times each, with or without the default stack,
        in one session or each step in a new session on a store: every resume pauses at
        the next one or finishes; each call is answered once, in order, and pairing holds."""
        import tempfile

        import anyio

        tools = [
            Tool(f"t{i}", "Suspends.", handler=suspending_tool(n, []).handler)
            for i, n in enumerate(rounds)
        ]
        calls = [call(f"t{i}", id=f"c{i}") for i in range(len(rounds))]
        agent = Agent(
            model=ScriptedModel([reply("", *calls), "done"]),
            tools=tools,
            middleware=default_stack() if stacked else [],
        )

        config = RunConfig(thread_id="t", max_tokens=200_000)

        async def scenario(store: SqliteStore | None) -> None:
            pauses = 0
            result = None
            async with Session(agent, config=config, store=store) as session:
                step = session.run("go")
                while result is None:
                    try:
                        result = await step
                    except Interrupted:
                        pauses += 1
                        check_pairing(session.conversation_messages)
                        if store is not None:
                            break  # the next step is another request's
                        step = session.resume()
                history = session.conversation_messages
            while result is None:
                assert store is not None
                async with Session(agent, config=config, store=store) as later:
                    try:
                        result = await later.resume()
                    except Interrupted:
                        pauses += 1
                    history = later.conversation_messages
                    check_pairing(history)
            assert pauses == sum(rounds)
            assert result.final_text == "done"
            assert results_of(history) == {
                f"c{i}": [f"finished after {n} pauses"] for i, n in enumerate(rounds)
            }
            check_pairing(history, allow_pending=False)

        async def main() -> None:
            if not stored:
                await scenario(None)
                return
            with tempfile.TemporaryDirectory() as folder:
                async with SqliteStore(Path(folder) / "t.db") as store:
                    await scenario(store)

        anyio.run(main, backend="trio")

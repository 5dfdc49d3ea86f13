"""Inherit and run_subagent: nested calls run under derived contexts and keep the tree."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest
from attrs import frozen
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    ConfigError,
    Event,
    Interrupt,
    Interrupted,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunConfig,
    RunContext,
    Session,
    StopWithFinal,
    Tool,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.chain import compose
from tinyctx.conversation import Conversation
from tinyctx.events import ControlApplied
from tinyctx.messages import check_pairing
from tinyctx.middleware import Inherit, run_subagent, subagent_tool
from tinyctx.middleware.inheritance import SubagentFinished
from tinyctx.testing import (
    FakeTool,
    ScriptedModel,
    assert_events_form_tree,
    assert_parent_unchanged,
    call,
    capture_events,
    reply,
    run_layer,
    run_tool_layer,
)
from tinyctx.testing.strategies import contexts, json_values
from tinyctx.tools import ToolRegistry


@frozen
class Marker(Event):
    """An event emitted from inside a nested call (to see whose ids it carries)."""

    kind: ClassVar[str] = "test.marker"


def _marker_model(text: str = "ok") -> Any:
    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        ctx.emit(Marker())
        return reply(text)

    return model


class TestDeriveWithTools:
    """derive(tools=...) gives a nested call its own tool registry (kernel addition)."""

    def test_default_shares_the_registry_and_an_override_replaces_it(self) -> None:
        tool = FakeTool("search").tool
        ctx = RunContext.new(tools=[tool])
        assert ctx.derive().tools is ctx.tools
        own = ToolRegistry()
        child = ctx.derive(tools=own)
        assert child.tools is own
        assert "search" not in child.tools
        assert "search" in ctx.tools


class TestAgentRunId:
    """RunConfig.agent_run_id names the agent run a context belongs to (kernel addition)."""

    async def test_runs_set_it_and_nested_calls_keep_it(self) -> None:
        assert RunConfig().agent_run_id is None
        tool = FakeTool("t")
        sub_model = ScriptedModel(["sub"])
        sub = Agent(model=sub_model, name="sub")
        model = ScriptedModel(
            [reply("", call("t"), call("sub", task="x")), reply("", call("pause")), "done"]
        )
        pause = FakeTool("pause", control=Interrupt("n"))
        agent = Agent(
            model=model,
            tools=[tool.tool, subagent_tool(sub), pause.tool],
            middleware=[Inherit()],
        )
        async with Session(agent) as session:
            assert session.ctx.config.agent_run_id is None
            with pytest.raises(Interrupted) as info:
                await session.run("go")
            run_id = info.value.checkpoint.run_id
            result = await session.resume(info.value.checkpoint)
        assert result.run_id == run_id
        # every call of the run, however derived, names the run; the resumed run too
        for ctx in [*model.contexts, *tool.contexts]:
            assert ctx.config.agent_run_id == run_id
            assert ctx.run_id != run_id
        # the sub-agent's run is a run of its own
        (sub_ctx,) = sub_model.contexts
        assert sub_ctx.config.agent_run_id not in (None, run_id)
        assert sub_ctx.config.agent_run_id == sub_ctx.run_id  # no layer derives there


class TestInheritLayer:
    """Each model call and each tool call runs under ctx.derive with the layer's labels."""

    async def test_model_call_runs_under_a_child_with_local_tags_and_metadata(self) -> None:
        parent = RunContext.new(RunConfig(tags=("app",), metadata={"user": "u1"}))
        model = ScriptedModel([_marker_model()])
        layer = Inherit(tags=("planner",), metadata={"step": "plan"}, view=False)
        with capture_events() as events:
            await run_layer(layer, ModelRequest(messages=(UserMessage("hi"),)), parent, model)
        (inner,) = model.contexts
        assert inner.parent_run_id == parent.run_id
        assert inner.root_run_id == parent.root_run_id
        assert inner.run_id != parent.run_id
        assert inner.tags == ("app", "planner")
        assert dict(inner.metadata) == {"user": "u1", "step": "plan"}
        assert inner.depth == parent.depth + 1
        (marker,) = [e for e in events if isinstance(e, Marker)]
        assert marker.run_id == inner.run_id
        assert marker.parent_run_id == parent.run_id
        assert marker.lineage == (parent.run_id,)
        assert marker.tags == ("app", "planner")
        # the parent itself is untouched
        assert parent.tags == ("app",)
        assert dict(parent.metadata) == {"user": "u1"}

    async def test_tool_call_runs_under_a_child(self) -> None:
        parent = RunContext.new()
        tool = FakeTool("t")
        seen: list[RunContext[Any]] = []

        async def core(tool_call: Any, ctx: RunContext[Any]) -> ToolResult:
            seen.append(ctx)
            return ToolResult.for_call(tool_call, "ok")

        layer = Inherit(tags=("tools",), view=False)
        result = await run_tool_layer(layer, call(tool.name), parent, core)
        assert result.content == "ok"
        (inner,) = seen
        assert inner.parent_run_id == parent.run_id
        assert "tools" in inner.tags
        # shared handles: the tree's events, usage, control slot and conversation
        for handle in ("events", "usage", "costs", "cache", "stores", "control", "conversation"):
            assert getattr(inner, handle) is getattr(parent, handle), handle
        assert inner.cancellation is not parent.cancellation

    async def test_in_an_agent_tools_and_model_see_derived_contexts(self) -> None:
        tool = FakeTool("t")
        model = ScriptedModel([reply("", call("t")), "done"])
        agent = Agent(model=model, tools=[tool.tool], middleware=[Inherit(tags=("inh",))])
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
        assert result.final_text == "done"
        run_id = result.run_id
        assert all(c.parent_run_id == run_id and "inh" in c.tags for c in model.contexts)
        assert tool.contexts[0].parent_run_id == run_id
        assert len({c.run_id for c in [*model.contexts, *tool.contexts]}) == 3
        assert_events_form_tree(events)

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"tags": ["ok", ""]}, "tags"),
            ({"tags": [3]}, "tags"),
            ({"metadata": ["not", "a", "mapping"]}, "metadata"),
            ({"view": "yes"}, "view"),
        ],
    )
    def test_bad_configuration_names_the_field(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError) as info:
            Inherit(**kwargs)
        assert info.value.field == field
        assert "Inherit" in str(info.value)

    @given(
        ctx=contexts(),
        tags=st.lists(st.text("abc", min_size=1, max_size=3), max_size=3),
        metadata=st.dictionaries(st.text("kv", min_size=1, max_size=2), json_values, max_size=2),
        view=st.booleans(),
    )
    async def test_parent_is_unchanged_by_any_inherited_call(
        self, ctx: RunContext[Any], tags: list[str], metadata: dict[str, Any], view: bool
    ) -> None:
        layer = Inherit(tags=tags, metadata=metadata, view=view)
        onion = compose([layer], _marker_model())
        tool_onion = compose([layer], _echo_tool, hook="tool")
        request = ModelRequest(messages=(UserMessage("x"),), system_prompt="s")
        with capture_events() as events:
            await assert_parent_unchanged(ctx, lambda c: onion(request, c))
            await assert_parent_unchanged(ctx, lambda c: tool_onion(call("t"), c))
        assert_events_form_tree(events)


async def _echo_tool(tool_call: Any, ctx: RunContext[Any]) -> ToolResult:
    ctx.emit(Marker())
    await anyio.lowlevel.checkpoint()
    return ToolResult.for_call(tool_call, "ok")


def _delegating_agent(sub: Agent, *, extra_tools: tuple[Tool, ...] = (), **options: Any) -> Any:
    """A parent whose model calls the sub-agent tool once, then answers."""
    model = ScriptedModel([reply("", call(sub.name, task="do it"), usage=(10, 1)), "parent done"])
    tool = subagent_tool(sub, **options)
    return Agent(model=model, tools=[tool, *extra_tools], name="parent"), model


def _pausing_child(*, suspend: bool) -> tuple[FakeTool, FakeTool, Agent]:
    """A parent delegating to ``helper``, whose ``approve`` tool requests an Interrupt,
    then calling ``after``: (approve, after, parent)."""
    approve = FakeTool("approve", control=Interrupt("review", "approve?"))
    child_model = ScriptedModel([reply("", call("approve")), "approved and done"])
    sub = Agent(model=child_model, tools=[approve.tool], name="helper")
    after = FakeTool("after")
    parent_model = ScriptedModel(
        [reply("", call("helper", task="x"), call("after")), "parent done"]
    )
    parent = Agent(model=parent_model, tools=[subagent_tool(sub, suspend=suspend), after.tool])
    return approve, after, parent


class TestRunSubagent:
    """A sub-agent inherits the parent's context and keeps its own conversation."""

    async def test_inherits_ids_labels_stores_usage_and_limits(self) -> None:
        store = MemoryStore()
        child_tool = FakeTool("note", returns="noted")
        child_model = ScriptedModel([reply("", call("note"), usage=(5, 2)), reply("sub done")])
        sub = Agent(model=child_model, tools=[child_tool.tool], name="helper")
        parent, parent_model = _delegating_agent(sub)
        config = RunConfig(
            tags=("app",),
            metadata={"tenant": "acme"},
            configurable={"region": "eu"},
            max_model_calls=7,
            max_depth=20,
        )
        async with Session(
            parent, config=config, stores={"notes": store}, data={"k": 1}
        ) as session:
            with capture_events() as events:
                result = await session.run("delegate")
            parent_messages = session.conversation_messages
        assert result.final_text == "parent done"
        assert parent_model.requests[1].messages[-1].text == "sub done"
        inner = child_model.contexts[0]
        assert inner.root_run_id == session.ctx.root_run_id
        assert inner.thread_id == session.ctx.thread_id
        assert inner.tags[:2] == ("app", "subagent:helper")
        assert inner.metadata["tenant"] == "acme"
        assert inner.metadata["subagent"] == "helper"
        assert inner.config.configurable["region"] == "eu"
        assert inner.config.max_model_calls == 7
        assert inner.stores["notes"] is store
        assert inner.data == {"k": 1}
        assert inner.usage is session.ctx.usage
        # session (0) -> run (1) -> sub-agent context (2) -> sub-agent run (3)
        assert inner.depth == 3
        # usage rolls up: the parent's run includes the sub-agent's tokens
        assert result.usage == Usage(15, 3)
        # its own conversation: none of the child's messages entered the parent's
        assert [m.role for m in parent_messages] == ["user", "assistant", "tool", "assistant"]
        assert [m.role for m in child_model.requests[1].messages] == ["user", "assistant", "tool"]
        # its own tools: the parent's delegate tool is not offered to the child
        assert [t.name for t in child_model.requests[0].tools] == ["note"]
        # attributable: nested events carry the sub-agent's tag and hang under the tool call
        nested = [e for e in events if "subagent:helper" in e.tags]
        assert [e.kind for e in nested if e.kind.startswith(("run.", "model."))] == [
            "run.started",
            "model.call",
            "model.call",
            "run.finished",
        ]
        assert all(result.run_id in e.lineage for e in nested)
        finished = [e for e in events if isinstance(e, SubagentFinished)]
        assert [(e.agent, e.status, e.model_calls, e.tool_calls) for e in finished] == [
            ("helper", "completed", 2, 1)
        ]
        assert_events_form_tree(events)

    async def test_inherit_tools_offers_the_parents_tools_own_win(self) -> None:
        shared = FakeTool("lookup", returns="from parent")
        child_model = ScriptedModel([reply("", call("lookup")), "sub done"])
        own_lookup = FakeTool("lookup", returns="from child")
        sub = Agent(model=child_model, tools=[own_lookup.tool], name="helper")
        extra = FakeTool("extra")
        parent, _ = _delegating_agent(sub, extra_tools=(shared.tool, extra.tool))
        parent = parent.evolve(
            tools=[subagent_tool(sub, inherit_tools=True), shared.tool, extra.tool],
        )
        async with Session(parent) as session:
            await session.run("go")
        names = sorted(t.name for t in child_model.requests[0].tools)
        assert names == ["extra", "helper", "lookup"]
        assert own_lookup.calls == [{}]
        assert shared.calls == []

    async def test_without_suspend_a_child_interrupt_pauses_the_parent_after_the_call(
        self,
    ) -> None:
        approve, after, parent = _pausing_child(suspend=False)
        async with Session(parent) as session:
            with capture_events() as events:
                with pytest.raises(Interrupted) as info:
                    await session.run("go")
            paused = info.value.checkpoint
            assert (info.value.node, info.value.message) == ("review", "approve?")
            # the parent paused after the delegate returned, before the next tool ran
            assert after.calls == []
            assert [c.name for c in paused.pending] == ["after"]
            helper_result = session.conversation_messages[2]
            assert isinstance(helper_result, ToolResult)
            assert "paused at review: approve?" in helper_result.content
            check_pairing(session.conversation_messages)
            # one ControlApplied per applied outcome: the child's pause and the parent's
            applied = [e for e in events if isinstance(e, ControlApplied)]
            assert sorted(e.control for e in applied) == ["interrupt", "interrupt"]
            assert len({e.run_id for e in applied}) == 2
            finished = [e for e in events if isinstance(e, SubagentFinished)]
            assert [e.status for e in finished] == ["interrupted"]
            resumed = await session.resume(paused)
        assert resumed.final_text == "parent done"
        assert after.calls == [{}]
        check_pairing(session.conversation_messages, allow_pending=False)

    async def test_a_child_interrupt_suspends_the_delegating_call(self) -> None:
        approve, after, parent = _pausing_child(suspend=True)
        async with Session(parent) as session:
            with capture_events() as events:
                with pytest.raises(Interrupted) as info:
                    await session.run("go")
            paused = info.value.checkpoint
            assert (info.value.node, info.value.message) == ("helper/review", "approve?")
            # the delegating call has no result: it is pending with the call after it
            assert [c.name for c in paused.pending] == ["helper", "after"]
            assert not any(isinstance(m, ToolResult) for m in session.conversation_messages)
            finished = [e for e in events if isinstance(e, SubagentFinished)]
            assert [e.status for e in finished] == ["interrupted"]
            resumed = await session.resume(paused)
            history = session.conversation_messages
        assert resumed.final_text == "parent done"
        assert approve.calls == [{}] and after.calls == [{}]
        helper_result = history[2]
        assert isinstance(helper_result, ToolResult)
        assert helper_result.content == "approved and done"
        check_pairing(history, allow_pending=False)

    async def test_a_paused_child_can_be_resumed_from_its_checkpoint(self) -> None:
        approve = FakeTool("approve", control=Interrupt("review"))
        child_model = ScriptedModel([reply("", call("approve"), call("approve")), "resumed end"])
        sub = Agent(model=child_model, tools=[approve.tool], name="helper")
        ctx = RunContext.new()
        first = await run_subagent(sub, "go", ctx)
        assert first.status == "interrupted"
        assert first.checkpoint is not None
        assert isinstance(ctx.take_control(), Interrupt)  # re-requested on the parent slot
        approve_again = FakeTool("approve")
        sub2 = sub.evolve(tools=[approve_again.tool])
        second = await run_subagent(sub2, None, ctx, resume=first.checkpoint)
        assert second.status == "completed"
        assert second.text == "resumed end"
        assert second.run_id == first.run_id
        assert approve_again.calls == [{}]

    async def test_stop_in_the_child_stops_only_the_child_unless_propagated(self) -> None:
        for propagate in (False, True):
            stopper = FakeTool("stop", control=StopWithFinal("child final"))
            sub = Agent(
                model=ScriptedModel([reply("", call("stop")), "never"]),
                tools=[stopper.tool],
                name="helper",
            )
            parent, parent_model = _delegating_agent(sub, propagate_stop=propagate)
            async with Session(parent) as session:
                result = await session.run("go")
            assert session.conversation_messages[2].text == "child final"
            if propagate:
                assert result.status == "stopped"
                assert result.final_text == "child final"
                assert parent_model.calls == 1
            else:
                assert result.status == "completed"
                assert result.final_text == "parent done"
            check_pairing(session.conversation_messages, allow_pending=False)

    async def test_cancelling_the_parent_cancels_the_child_and_the_error_propagates(
        self,
    ) -> None:
        started = anyio.Event()

        async def hang(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            started.set()
            with ctx.cancellation.linked_scope("model"):
                await anyio.sleep_forever()
            raise AssertionError("unreachable")

        sub = Agent(model=ScriptedModel([hang]), name="helper")
        parent, _ = _delegating_agent(sub)
        async with Session(parent) as session:

            async def cancel_when_started() -> None:
                await started.wait()
                session.cancel("user stop")

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_started)
                with pytest.raises(RunCancelled, match="user stop"):
                    await session.run("go")
            check_pairing(session.conversation_messages, allow_pending=False)

    async def test_a_cancel_local_to_the_child_ends_only_the_child(self) -> None:
        async def cancel_self(arguments: Any, ctx: RunContext[Any]) -> str:
            ctx.cancellation.cancel("child gave up")
            return "cancelling"

        sub = Agent(
            model=ScriptedModel([reply("", call("quit")), "never"]),
            tools=[Tool("quit", handler=cancel_self)],
            name="helper",
        )
        parent, _ = _delegating_agent(sub)
        async with Session(parent) as session:
            with capture_events() as events:
                result = await session.run("go")
        assert result.final_text == "parent done"
        assert "was cancelled: child gave up" in session.conversation_messages[2].text
        assert [e.status for e in events if isinstance(e, SubagentFinished)] == ["cancelled"]

    async def test_a_parent_already_cancelled_starts_no_child(self) -> None:
        model = ScriptedModel(["never"])
        ctx = RunContext.new()
        ctx.cancellation.cancel()
        with pytest.raises(RunCancelled, match="subagent"):
            await run_subagent(Agent(model=model), "go", ctx)
        assert model.calls == 0

    async def test_subagent_errors_become_a_tool_error_for_the_parent(self) -> None:
        sub = Agent(model=ScriptedModel([ValueError("child broke")]), name="helper")
        parent, parent_model = _delegating_agent(sub)
        async with Session(parent) as session:
            result = await session.run("go")
        assert result.final_text == "parent done"
        tool_result = parent_model.requests[1].messages[-1]
        assert isinstance(tool_result, ToolResult)
        assert tool_result.is_error and "child broke" in tool_result.content

    async def test_bad_arguments(self) -> None:
        with pytest.raises(TypeError, match="needs an Agent"):
            await run_subagent("agent", "go", RunContext.new())  # type: ignore[arg-type]
        sub = Agent(model=ScriptedModel(["x"]))
        tool = subagent_tool(sub, name="ask", description="ask it")
        assert (tool.name, tool.description) == ("ask", "ask it")
        assert tool.parameters["required"] == ("task",)
        with pytest.raises(TypeError, match="'task'"):
            await tool.invoke({"task": 3}, RunContext.new())


# ---------------------------------------------------------------------------------------
# any tree of nested calls

Plan = list[Any]  # each item: "leaf" (a tool making a nested Inherit-wrapped model call)
#                  or a Plan (a tool running a sub-agent with that plan)

plans: st.SearchStrategy[Plan] = st.lists(
    st.recursive(
        st.just("leaf"),
        lambda inner: st.lists(inner, max_size=3),
        max_leaves=6,
    ),
    max_size=3,
)

nested_onion = compose([Inherit(tags=("nested",))], _marker_model("nested answer"))


async def _leaf(arguments: Any, ctx: RunContext[Any]) -> str:
    request = ModelRequest(messages=(UserMessage("inner"),))
    response = await assert_parent_unchanged(ctx, lambda c: nested_onion(request, c))
    return response.text


def _plan_agent(plan: Plan, depth: int) -> Agent:
    tools: list[Tool] = [Tool("leaf", handler=_leaf)]
    calls = []
    for index, item in enumerate(plan):
        if item == "leaf":
            calls.append(call("leaf"))
            continue
        name = f"sub{index}"

        async def delegate(
            arguments: Any, ctx: RunContext[Any], child: Plan = item, level: int = depth + 1
        ) -> str:
            agent = _plan_agent(child, level)
            outcome = await assert_parent_unchanged(
                ctx, lambda c: run_subagent(agent, "go", c, name=f"d{level}")
            )
            return str(outcome.text)

        tools.append(Tool(name, handler=delegate))
        calls.append(call(name))
    script: list[Any] = [reply("", *calls), f"done at {depth}"] if calls else [f"done at {depth}"]
    return Agent(
        model=ScriptedModel(script),
        tools=tools,
        middleware=[Inherit(tags=(f"level{depth}",))],
        name=f"agent{depth}",
    )


def _subagent_count(plan: Plan) -> int:
    return sum(1 + _subagent_count(item) for item in plan if item != "leaf")


class TestEventTree:
    """For any tree of nested calls, event ids form one tree and parents stay unchanged."""

    @given(plan=plans)
    async def test_any_nesting_forms_a_valid_event_tree(self, plan: Plan) -> None:
        agent = _plan_agent(plan, 0)
        async with Session(agent, config=RunConfig(max_depth=200)) as session:
            with capture_events() as events:
                result = await assert_parent_unchanged(session.ctx, lambda c: session.run("go"))
        assert result.final_text == "done at 0"
        assert_events_form_tree(events)
        finished = [e for e in events if isinstance(e, SubagentFinished)]
        assert len(finished) == _subagent_count(plan)
        assert all(e.status == "completed" for e in finished)
        # nested calls inside leaves are attributable to their own derived runs
        nested = [e for e in events if isinstance(e, Marker)]
        run_ids = {e.run_id for e in events if e.kind == "run.started"}
        for marker in nested:
            assert marker.run_id not in run_ids
            assert "nested" in marker.tags
            assert set(marker.lineage) & run_ids

    async def test_conversations_stay_separate(self) -> None:
        conversation = Conversation()
        ctx = RunContext.new(conversation=conversation)
        sub = Agent(model=ScriptedModel(["child answer"]))
        outcome = await run_subagent(sub, "child question", ctx)
        assert outcome.text == "child answer"
        assert len(conversation) == 0
        assert outcome.result is not None
        assert [m.text for m in outcome.result.messages] == ["child question", "child answer"]


class TestCheckpointKeepsNoExcludedField:
    """#15 D11: a checkpoint never carries a view field the run's policy excluded."""

    async def test_excluded_global_field_is_not_in_the_checkpoint(self) -> None:
        """The paused run's config lacks the excluded entry; the resumed view is unchanged."""
        from tinyctx.middleware import ContextPolicy
        from tinyctx.middleware.context_view import VIEW_GLOBAL_KEY

        seen: list[str | None] = []

        async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            seen.append(request.system_prompt)
            if len(seen) == 1:
                ctx.request_control(Interrupt("approval"))
                return reply("", call("t"))
            return reply("done")

        config = RunConfig(
            thread_id="d11",
            configurable={VIEW_GLOBAL_KEY: {"project_root": "/srv/app", "api_key": "sk-secret-1"}},
        )
        agent = Agent(
            model=model,
            tools=[FakeTool("t").tool],
            middleware=[Inherit(view=ContextPolicy(exclude=("extra.api_key",)))],
        )
        async with Session(agent, config=config) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("go")
            paused = info.value.checkpoint
            assert "sk-secret" not in repr(paused.run_config)
            assert dict(paused.run_config.configurable[VIEW_GLOBAL_KEY]) == {
                "project_root": "/srv/app"
            }
            assert session.paused is paused
        async with Session(agent, thread_id="d11") as later:
            result = await later.resume(paused)
        assert result.final_text == "done"
        assert seen[0] == seen[1]  # the resumed run's view is the one the run had
        assert "project_root: /srv/app" in (seen[1] or "")

    async def test_a_nested_runs_materialized_view_becomes_a_filtered_tier(self) -> None:
        """A sub-agent's checkpoint keeps its inherited view as plain, filtered data."""
        from tinyctx.middleware import ContextPolicy, ContextView
        from tinyctx.middleware.context_view import VIEW_GLOBAL_KEY, VIEW_KEY

        policy = ContextPolicy(exclude=("extra.token",))
        view = ContextView(project_root="/p", extra={"token": "t0k", "team": "ops"})
        config = RunConfig(configurable={VIEW_KEY: view})
        pause = FakeTool("pause", control=Interrupt("n"))
        sub = Agent(
            model=ScriptedModel([reply("", call("pause"))]),
            tools=[pause.tool],
            middleware=[Inherit(view=policy)],
        )
        async with Session(sub, config=config) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("go")
        configurable = info.value.checkpoint.run_config.configurable
        assert VIEW_KEY not in configurable
        assert configurable[VIEW_GLOBAL_KEY] == {"project_root": "/p", "extra": {"team": "ops"}}

"""CallLimits: run and thread limits on model and tool calls, ending with an error or a stop."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    ConfigError,
    Interrupt,
    Interrupted,
    LimitExceeded,
    ModelRequest,
    RunConfig,
    RunContext,
    Session,
    ToolResult,
    UserMessage,
)
from tinyctx.events import ControlApplied, LimitHit
from tinyctx.messages import check_pairing
from tinyctx.middleware import CallLimits, ControlOutcomes, Inherit, subagent_tool
from tinyctx.testing import FakeTool, ScriptedModel, call, capture_events, reply, run_layer


def looping_model() -> ScriptedModel:
    """A model that asks for tool ``t`` forever."""
    return ScriptedModel([lambda request, ctx: reply("", call("t"))], repeat_last=True)


def hits(events: Any) -> list[tuple[str, int, str]]:
    return [(e.limit, e.value, e.scope) for e in events if isinstance(e, LimitHit)]


class TestConfiguration:
    """Bad limits fail at construction with the field named."""

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({}, "model_calls"),
            ({"model_calls": 0}, "model_calls"),
            ({"tool_calls": True}, "tool_calls"),
            ({"per_tool": {"search": 0}}, "per_tool['search']"),
            ({"per_tool": {"": 1}}, "per_tool"),
            ({"model_calls": 1, "exit": "continue"}, "exit"),
            ({"tool_calls": 1, "exit": "stop"}, "exit"),
            ({"model_calls": {"session": 2}}, "model_calls"),
            ({"model_calls": {}}, "model_calls"),
            ({"model_calls": {"run": 0}}, "model_calls['run']"),
            ({"per_tool": {"search": {"thread": -1}}}, "per_tool['search']['thread']"),
            ({"model_calls": 1, "scope": "session"}, "scope"),
            ({"model_calls": 1, "end_message": "{nope}"}, "end_message"),
            ({"model_calls": 1, "end_message": ""}, "end_message"),
        ],
    )
    def test_bad_values(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError) as info:
            CallLimits(**kwargs)
        assert info.value.field == field


class TestContinue:
    """exit="continue": a refused tool call is answered and the run goes on."""

    async def test_parallel_calls_of_one_limited_tool(self) -> None:
        """Calls past the limit get an error result; the others run; the model answers."""
        search = FakeTool("search", returns=lambda a: f"found {a['q']}")
        other = FakeTool("other")
        model = ScriptedModel(
            [
                reply(
                    "",
                    call("search", id="s1", q="a"),
                    call("search", id="s2", q="b"),
                    call("other", id="o1"),
                    call("search", id="s3", q="c"),
                    call("search", id="s4", q="d"),
                ),
                "summary of a and b",
            ]
        )
        limits = CallLimits(per_tool={"search": 2}, exit="continue")
        agent = Agent(model=model, tools=[search.tool, other.tool], middleware=[limits])
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
            history = session.conversation_messages
        check_pairing(history, allow_pending=False)
        assert result.status == "completed"
        assert result.final_text == "summary of a and b"
        assert [c["q"] for c in search.calls] == ["a", "b"]
        assert len(other.calls) == 1
        results = [m for m in history if isinstance(m, ToolResult)]
        assert [r.tool_call_id for r in results] == ["s1", "s2", "o1", "s3", "s4"]
        assert [r.is_error for r in results] == [False, False, False, True, True]
        assert results[3].content == (
            "Error (LimitExceeded): the 'search' call limit of 2 per run was reached, so this "
            "call of 'search' was not run. Do not call it again; continue with what you have."
        )
        # the model read the refusals before its final answer
        assert results[4] in model.requests[-1].messages
        assert hits(events) == [("tool_calls[search]", 2, "run")] * 2
        assert not [e for e in events if isinstance(e, ControlApplied)]


class TestBothScopes:
    """One layer counts a run and a thread limit; a call reaching both names both."""

    async def test_the_same_call_reaches_both_limits(self) -> None:
        """The error and the single LimitHit event name the run and the thread limit."""
        model = ScriptedModel(["one", reply("", call("t")), reply("", call("t")), "never"])
        limits = CallLimits(model_calls={"run": 2, "thread": 3})
        agent = Agent(model=model, tools=[FakeTool("t").tool], middleware=[limits])
        async with Session(agent) as session:
            assert (await session.run("a")).final_text == "one"  # thread 1
            with capture_events() as events:
                # run: call 1 (thread 2), call 2 (thread 3), call 3 refused by both
                with pytest.raises(LimitExceeded) as info:
                    await session.run("b")
            check_pairing(session.conversation_messages, allow_pending=False)
        error = info.value
        assert str(error) == (
            "model_calls limit of 2 per run and model_calls limit of 3 per thread reached"
        )
        assert error.hits == (("model_calls", 2, "run"), ("model_calls", 3, "thread"))
        (hit,) = [e for e in events if isinstance(e, LimitHit)]
        assert hit.hits == (("model_calls", 2, "run"), ("model_calls", 3, "thread"))
        assert model.calls == 3

    async def test_only_the_limit_reached_is_named(self) -> None:
        """A call past the thread limit alone names the thread limit only."""
        model = ScriptedModel(["one", "two"])
        limits = CallLimits(model_calls={"run": 5, "thread": 1})
        async with Session(Agent(model=model, middleware=[limits])) as session:
            await session.run("a")
            with pytest.raises(LimitExceeded) as info:
                await session.run("b")
        assert str(info.value) == "model_calls limit of 1 per thread reached"
        assert info.value.hits == (("model_calls", 1, "thread"),)

    async def test_tool_limits_in_both_scopes_end_the_run(self) -> None:
        """per_tool with both scopes: the refusal's event names both when both are reached."""
        search = FakeTool("search")
        model = ScriptedModel([reply("", call("search"), call("search")), "unused"])
        limits = CallLimits(per_tool={"search": {"run": 1, "thread": 1}}, exit="end")
        agent = Agent(model=model, tools=[search.tool], middleware=[limits])
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
        assert len(search.calls) == 1
        assert result.final_text == "Stopped: the 'search' call limit of 1 per run was reached."
        (hit,) = [e for e in events if isinstance(e, LimitHit)]
        assert hit.hits == (("tool_calls[search]", 1, "run"), ("tool_calls[search]", 1, "thread"))


class TestRunLimits:
    """Per-run limits: "error" raises a clear LimitExceeded, "end" stops with a final answer."""

    async def test_model_call_limit_error(self) -> None:
        model = looping_model()
        agent = Agent(model=model, tools=[FakeTool("t").tool], middleware=[CallLimits(3)])
        async with Session(agent) as session:
            with capture_events() as events:
                with pytest.raises(LimitExceeded, match="model_calls limit of 3 per run reached"):
                    await session.run("go")
            check_pairing(session.conversation_messages, allow_pending=False)
        assert model.calls == 3
        assert hits(events) == [("model_calls", 3, "run")]

    async def test_model_call_limit_end(self) -> None:
        model = looping_model()
        agent = Agent(
            model=model, tools=[FakeTool("t").tool], middleware=[CallLimits(2, exit="end")]
        )
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
            history = session.conversation_messages
        assert model.calls == 2
        assert result.status == "stopped"
        assert result.final_text == "Stopped: the model call limit of 2 per run was reached."
        assert history[-1].text == result.final_text
        check_pairing(history, allow_pending=False)
        assert [e.control for e in events if isinstance(e, ControlApplied)] == ["stop_with_final"]

    async def test_tool_call_limit_end_refuses_and_answers_the_rest(self) -> None:
        tool = FakeTool("t")
        model = ScriptedModel([reply("", call("t"), call("t"), call("t"), call("t"))])
        agent = Agent(
            model=model, tools=[tool.tool], middleware=[CallLimits(tool_calls=2, exit="end")]
        )
        async with Session(agent) as session:
            result = await session.run("go")
            history = session.conversation_messages
        assert len(tool.calls) == 2
        results = [m for m in history if isinstance(m, ToolResult)]
        assert [r.is_error for r in results] == [False, False, True, True]
        assert "tool call limit of 2 per run was reached" in results[2].content
        assert "skipped" in results[3].content
        assert result.final_text == "Stopped: the tool call limit of 2 per run was reached."
        check_pairing(history, allow_pending=False)

    async def test_tool_call_limit_error_keeps_pairing(self) -> None:
        model = ScriptedModel([reply("", call("t"), call("t"), call("t"))])
        agent = Agent(
            model=model, tools=[FakeTool("t").tool], middleware=[CallLimits(tool_calls=1)]
        )
        async with Session(agent) as session:
            with pytest.raises(LimitExceeded, match="tool_calls limit of 1 per run"):
                await session.run("go")
            check_pairing(session.conversation_messages, allow_pending=False)

    async def test_per_tool_limit(self) -> None:
        search = FakeTool("search")
        other = FakeTool("other")
        model = ScriptedModel(
            [reply("", call("search"), call("other"), call("search"), call("other")), "after"]
        )
        limits = CallLimits(per_tool={"search": 1}, exit="end", end_message="{what} cap {value}")
        agent = Agent(model=model, tools=[search.tool, other.tool], middleware=[limits])
        async with Session(agent) as session:
            with capture_events() as events:
                result = await session.run("go")
        assert (len(search.calls), len(other.calls)) == (1, 1)
        assert result.final_text == "'search' call cap 1"
        assert hits(events) == [("tool_calls[search]", 1, "run")]

    async def test_each_run_counts_afresh_and_a_resumed_run_keeps_its_count(self) -> None:
        pause = FakeTool("pause", control=Interrupt("n"))
        model = ScriptedModel(
            [reply("", call("pause")), "first", reply("", call("t")), "second", "third"]
        )
        limits = CallLimits(model_calls=2)
        agent = Agent(model=model, tools=[pause.tool, FakeTool("t").tool], middleware=[limits])
        async with Session(agent) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("one")  # 1 model call, then paused
            assert (await session.resume(info.value.checkpoint)).final_text == "first"
            assert (await session.run("two")).final_text == "second"  # 2 calls: at the limit
            assert (await session.run("three")).final_text == "third"
        # the resumed run continued its count: pausing is no way around a limit
        model2 = ScriptedModel([reply("", call("pause")), reply("", call("t")), "never"])
        agent2 = agent.evolve(model=model2)
        async with Session(agent2) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("one")
            with pytest.raises(LimitExceeded):
                await session.resume(info.value.checkpoint)
        assert model2.calls == 2

    async def test_counts_per_run_even_under_a_layer_that_derives_each_call(self) -> None:
        model = looping_model()
        agent = Agent(
            model=model,
            tools=[FakeTool("t").tool],
            middleware=[Inherit(tags=("x",)), CallLimits(model_calls=2, tool_calls=5)],
        )
        with pytest.raises(LimitExceeded, match="model_calls"):
            await agent.run("go")
        assert model.calls == 2

    async def test_a_sub_agent_with_the_same_layer_has_its_own_run_count(self) -> None:
        limits = CallLimits(model_calls=2)
        sub_model = ScriptedModel([reply("", call("t")), "sub done"])
        sub = Agent(model=sub_model, tools=[FakeTool("t").tool], middleware=[limits], name="sub")
        model = ScriptedModel([reply("", call("sub", task="x")), "parent done"])
        agent = Agent(model=model, tools=[subagent_tool(sub)], middleware=[limits])
        result = await agent.run("go")
        assert result.final_text == "parent done"
        assert (model.calls, sub_model.calls) == (2, 2)


class TestThreadLimits:
    """A thread limit counts across the runs of a session."""

    async def test_thread_model_limit_ends_a_later_run(self) -> None:
        model = ScriptedModel(["one", "two", "never"])
        limits = CallLimits(model_calls=2, scope="thread", exit="end")
        async with Session(Agent(model=model, middleware=[limits])) as session:
            assert (await session.run("a")).final_text == "one"
            assert (await session.run("b")).final_text == "two"
            with capture_events() as events:
                third = await session.run("c")
            history = session.conversation_messages
        assert third.status == "stopped"
        assert third.final_text == "Stopped: the model call limit of 2 per thread was reached."
        assert model.calls == 2
        assert hits(events) == [("model_calls", 2, "thread")]
        check_pairing(history, allow_pending=False)

    async def test_run_and_thread_limits_stack(self) -> None:
        model = ScriptedModel(
            [reply("", call("t")), "a", reply("", call("t")), "b", reply("", call("t")), "never"]
        )
        agent = Agent(
            model=model,
            tools=[FakeTool("t").tool],
            middleware=[
                CallLimits(tool_calls=1, name="per_run"),
                CallLimits(tool_calls=2, scope="thread", exit="end", name="per_thread"),
            ],
        )
        async with Session(agent) as session:
            await session.run("1")
            await session.run("2")
            third = await session.run("3")
        assert third.final_text == "Stopped: the tool call limit of 2 per thread was reached."
        assert model.calls == 5


class TestLimitProperty:
    """Whatever the model asks for, a limit is never exceeded and pairing always holds."""

    @given(
        model_limit=st.integers(1, 4),
        tool_limit=st.none() | st.integers(1, 4),
        batch=st.integers(0, 3),
        exit=st.sampled_from(["error", "end"]),
        with_control_layer=st.booleans(),
    )
    async def test_limits_hold(
        self,
        model_limit: int,
        tool_limit: int | None,
        batch: int,
        exit: str,
        with_control_layer: bool,
    ) -> None:
        tool = FakeTool("t")
        model = ScriptedModel(
            [lambda request, ctx: reply("", *(call("t") for _ in range(batch)))],
            repeat_last=True,
        )
        layers: list[Any] = [CallLimits(model_limit, tool_limit, exit=exit)]  # type: ignore[arg-type]
        if with_control_layer:
            layers.insert(0, ControlOutcomes())
        agent = Agent(model=model, tools=[tool.tool], middleware=layers)
        async with Session(agent, config=RunConfig(max_model_calls=None)) as session:
            try:
                result = await session.run("go")
            except LimitExceeded:
                assert exit == "error"
            else:
                assert result.status == ("stopped" if batch else "completed")
            history = session.conversation_messages
        assert model.calls <= model_limit
        assert len(tool.calls) <= (tool_limit if tool_limit is not None else len(tool.calls))
        check_pairing(history, allow_pending=False)


class TestOutsideASession:
    """Used directly (run_layer), the layer counts per context."""

    async def test_run_layer_counts_per_context(self) -> None:
        layer = CallLimits(1)
        ctx = RunContext.new()
        request = ModelRequest(messages=(UserMessage("x"),))
        await run_layer(layer, request, ctx)
        with pytest.raises(LimitExceeded):
            await run_layer(layer, request, ctx)
        await run_layer(layer, request, RunContext.new())


class TestLimitProperties:
    """Random batches and limits: refusals are exactly the calls past a limit."""

    @given(
        names=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=8),
        limits=st.fixed_dictionaries(
            {}, optional={n: st.integers(1, 3) for n in ("a", "b", "c")}
        ).filter(bool),
    )
    async def test_continue_refuses_exactly_the_calls_past_each_limit(
        self, names: list[str], limits: dict[str, int]
    ) -> None:
        """Each tool runs up to its limit; later calls get the limit error; all are answered."""
        fakes = {n: FakeTool(n) for n in ("a", "b", "c")}
        calls = [call(n, id=f"c{i}") for i, n in enumerate(names)]
        model = ScriptedModel([reply("", *calls), "end"])
        agent = Agent(
            model=model,
            tools=[f.tool for f in fakes.values()],
            middleware=[CallLimits(per_tool=limits, exit="continue")],
        )
        async with Session(agent) as session:
            result = await session.run("go")
            history = session.conversation_messages
        check_pairing(history, allow_pending=False)
        assert result.final_text == "end"
        results = [m for m in history if isinstance(m, ToolResult)]
        assert [r.tool_call_id for r in results] == [c.id for c in calls]
        seen: dict[str, int] = {}
        for name, answer in zip(names, results, strict=True):
            seen[name] = seen.get(name, 0) + 1
            refused = name in limits and seen[name] > limits[name]
            assert answer.is_error == refused
        for name, fake in fakes.items():
            assert len(fake.calls) == min(names.count(name), limits.get(name, len(names)))

    @given(run=st.integers(1, 4), thread=st.integers(1, 6), before=st.integers(0, 5))
    async def test_the_error_names_every_limit_the_call_reached(
        self, run: int, thread: int, before: int
    ) -> None:
        """After `before` one-call runs, a looping run stops at the first scope reached."""
        limits = CallLimits(model_calls={"run": run, "thread": thread})
        script: list[Any] = ["done"] * before
        model = ScriptedModel(script + [lambda r, c: reply("", call("t"))], repeat_last=True)
        agent = Agent(model=model, tools=[FakeTool("t").tool], middleware=[limits])
        async with Session(agent) as session:
            used = 0
            for _ in range(before):
                if used >= thread:
                    break
                await session.run("warm up")
                used += 1
            with pytest.raises(LimitExceeded) as info:
                await session.run("loop")
        # the looping run makes calls until one is refused by the run or the thread limit
        made = min(run, thread - used)
        expected = []
        if made >= run:
            expected.append(("model_calls", run, "run"))
        if used + made >= thread:
            expected.append(("model_calls", thread, "thread"))
        assert info.value.hits == tuple(expected)
        assert model.calls == used + made

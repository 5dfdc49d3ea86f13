"""Request-scoped tool registries, server tools, layer pub/sub and message events in runs."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
    SystemMessage,
    ToolResult,
    Usage,
    UserMessage,
    tool,
)
from tinyctx.chain import LayerBus
from tinyctx.conversation import Conversation
from tinyctx.messages import snap_boundary
from tinyctx.testing import FakeTool, ScriptedModel, call, reply
from tinyctx.tools import Injected, ServerTool, ToolRegistry


def tool_names(request: ModelRequest) -> list[str]:
    return [t.name for t in request.tools]


class TestRequestScopedRegistration:
    """A tool registered for a run exists in that run only, even under concurrency."""

    async def test_registration_does_not_leak_across_two_concurrent_runs(self) -> None:
        both_registered = anyio.Event()
        registered: list[str] = []

        class PerUserTool(Layer):
            async def on_run_start(self, ctx: RunContext[str]) -> None:
                user = ctx.data

                @tool(name=f"inbox_{user}")
                async def inbox() -> str:
                    return f"mail of {user}"

                ctx.tools.register(inbox)
                ctx.tools.register_server_tool(ServerTool("web_search", {"user": user}))
                registered.append(user)
                if len(registered) == 2:
                    both_registered.set()
                await both_registered.wait()  # both runs hold their registrations now

        requests: dict[str, list[ModelRequest]] = {"ada": [], "bob": []}

        async def model(request: ModelRequest, ctx: RunContext[str]) -> ModelResponse:
            requests[ctx.data].append(request)
            await anyio.lowlevel.checkpoint()  # let the other run interleave
            other = "bob" if ctx.data == "ada" else "ada"
            if len(requests[ctx.data]) == 1:
                message = reply("", call(f"inbox_{ctx.data}"), call(f"inbox_{other}")).message
                return ModelResponse(message)
            return ModelResponse(AssistantMessage(f"done {ctx.data}"))

        shared = FakeTool("shared")
        agent = Agent(model=model, tools=[shared.tool], middleware=[PerUserTool()])
        outcomes: dict[str, Any] = {}

        async def run(user: str) -> None:
            async with Session(agent, data=user) as session:
                outcomes[user] = await session.run("check mail")

        async with anyio.create_task_group() as group:
            group.start_soon(run, "ada")
            group.start_soon(run, "bob")

        for user, other in (("ada", "bob"), ("bob", "ada")):
            first = requests[user][0]
            assert tool_names(first) == ["shared", f"inbox_{user}"]
            assert [(s.type, dict(s.configuration)) for s in first.server_tools] == [
                ("web_search", {"user": user})
            ]
            own, foreign = [m for m in outcomes[user].messages if isinstance(m, ToolResult)]
            assert (own.is_error, own.content) == (False, f"mail of {user}")
            assert foreign.is_error and f"unknown tool 'inbox_{other}'" in foreign.content
        assert agent.tools == (shared.tool,)

    async def test_the_next_run_of_the_same_session_starts_clean(self) -> None:
        extra = FakeTool("extra")

        class Once(Layer):
            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                if ctx.state_for(self, lambda: {"done": False})["done"]:
                    return
                ctx.state_for(self, dict)["done"] = True
                ctx.tools.register(extra.tool)
                ctx.tools.register_server_tool(ServerTool("code_interpreter"))

        model = ScriptedModel(["one", "two"])
        async with Session(Agent(model=model, middleware=[Once()])) as session:
            await session.run("a")
            assert "extra" not in session.ctx.tools
            await session.run("b")
        assert [tool_names(r) for r in model.requests] == [["extra"], []]
        assert [len(r.server_tools) for r in model.requests] == [1, 0]

    async def test_the_request_carries_agent_run_and_server_tools(self) -> None:
        agent_tool, run_tool, session_tool = FakeTool("a"), FakeTool("r"), FakeTool("s")

        class Adds(Layer):
            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                ctx.tools.register(run_tool.tool)
                ctx.tools.register_server_tool(ServerTool("file_search", {"ids": ["v1"]}))

        model = ScriptedModel(["ok"])
        agent = Agent(
            model=model,
            tools=[agent_tool.tool],
            server_tools=[ServerTool("web_search", {"size": "medium"})],
            middleware=[Adds()],
        )
        ctx = RunContext.new(tools=[session_tool.tool])
        async with Session(agent, ctx=ctx) as session:
            await session.run("go")
        (request,) = model.requests
        assert tool_names(request) == ["a", "s", "r"]
        assert [(s.type, dict(s.configuration)) for s in request.server_tools] == [
            ("web_search", {"size": "medium"}),
            ("file_search", {"ids": ("v1",)}),
        ]


class TestAmbiguousNames:
    """A tool name must be unambiguous; the error names both tools."""

    def test_duplicate_agent_tools(self) -> None:
        first, second = FakeTool("search"), FakeTool("search")
        with pytest.raises(ValueError, match="tool name 'search' is ambiguous") as info:
            Agent(model=ScriptedModel(), tools=[first.tool, second.tool])
        assert str(info.value).count("search") >= 3  # the name, and both tools

    def test_session_tools_clashing_with_agent_tools(self) -> None:
        agent = Agent(model=ScriptedModel(), tools=[FakeTool("search").tool])
        with pytest.raises(ValueError, match="ambiguous"):
            Session(agent, ctx=RunContext.new(tools=[FakeTool("search").tool]))

    async def test_run_registration_of_a_taken_name(self) -> None:
        @tool
        async def search(q: str) -> str:
            return q

        @tool(name="search")
        async def other_search(q: str) -> str:
            return q

        registry = ToolRegistry([FakeTool("read").tool]).for_new_run()
        registry.register(search)
        with pytest.raises(ValueError) as info:
            registry.register(other_search)
        message = str(info.value)
        assert "already in this run's tools" in message
        assert "test_registry_publish" in message and "other_search" in message
        with pytest.raises(ValueError, match="the agent already has"):
            registry.register(FakeTool("read").tool)
        with pytest.raises(TypeError, match="expected a Tool"):
            registry.register("read")  # type: ignore[arg-type]
        assert registry.names == ("read", "search")
        fresh = registry.for_new_run()
        fresh.register(other_search)  # another run: the name is free again
        assert fresh.get("search") is other_search

    def test_a_run_tool_can_be_replaced_but_an_agent_tool_cannot(self) -> None:
        """unregister frees a run tool's name for a new tool (a layer replacing what it
        registered); the agent's tools and unknown names raise KeyError, changing nothing."""
        first, second, agent_tool = FakeTool("lookup"), FakeTool("lookup"), FakeTool("read")
        registry = ToolRegistry([agent_tool.tool]).for_new_run()
        registry.register(first.tool)
        assert registry.unregister("lookup") is first.tool
        registry.register(second.tool)
        assert registry.get("lookup") is second.tool
        with pytest.raises(KeyError, match="'read': it is an agent tool"):
            registry.unregister("read")
        with pytest.raises(KeyError, match="'nothing': it is not registered"):
            registry.unregister("nothing")
        assert registry.names == ("read", "lookup")


class TestServerTools:
    """Provider-hosted tools: unique by type, configuration copied, never run locally."""

    def test_mutating_the_original_configuration_changes_nothing(self) -> None:
        config: dict[str, Any] = {"filters": {"domains": ["a.org"]}, "size": "low"}
        definition = ServerTool("web_search", config)
        registry = ToolRegistry()
        registry.register_server_tool(definition)
        config["size"] = "high"
        config["filters"]["domains"].append("evil.org")
        config["new"] = True
        (registered,) = registry.server_tools
        for tool_ in (definition, registered):
            assert dict(tool_.configuration) == {"filters": {"domains": ("a.org",)}, "size": "low"}
        with pytest.raises(TypeError):
            registered.configuration["size"] = "high"  # type: ignore[index]

    async def test_one_definition_shared_by_concurrent_sessions(self) -> None:
        config: dict[str, Any] = {"region": "eu"}
        definition = ServerTool("web_search", config)

        class Adds(Layer):
            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                ctx.tools.register_server_tool(definition)
                config["region"] = "us"  # a careless caller, mid-flight

        model = ScriptedModel(["ok"], repeat_last=True)
        agent = Agent(model=model, middleware=[Adds()])

        async def run() -> None:
            async with Session(agent) as session:
                await session.run("go")

        async with anyio.create_task_group() as group:
            group.start_soon(run)
            group.start_soon(run)
        assert [dict(r.server_tools[0].configuration) for r in model.requests] == [
            {"region": "eu"},
            {"region": "eu"},
        ]

    def test_unique_by_type(self) -> None:
        registry = ToolRegistry(server_tools=[ServerTool("web_search")]).for_new_run()
        with pytest.raises(ValueError, match="'web_search' is already registered"):
            registry.register_server_tool(ServerTool("web_search", {"size": "low"}))
        registry.register_server_tool(ServerTool("code_interpreter"))
        with pytest.raises(ValueError, match="order-dependent"):
            registry.register_server_tool(ServerTool("code_interpreter"))
        with pytest.raises(TypeError, match="expected a ServerTool"):
            registry.register_server_tool(FakeTool("x").tool)  # type: ignore[arg-type]

    async def test_server_tools_never_reach_the_local_executor(self) -> None:
        model = ScriptedModel([reply("", call("web_search", q="x")), "done"])
        agent = Agent(model=model, server_tools=[ServerTool("web_search")])
        async with Session(agent) as session:
            result = await session.run("go")
            assert "web_search" not in session.ctx.tools
        (error,) = [m for m in result.messages if isinstance(m, ToolResult)]
        assert error.is_error and "unknown tool 'web_search'" in error.content


class Listener(Layer):
    def __init__(self, name: str, log: list[tuple[str, object]]) -> None:
        self.name = name
        self.log = log

    async def on_event(self, event: object, ctx: RunContext[Any]) -> None:
        self.log.append((self.name, event))


class TestPublishInARun:
    """Layers and tools talk through ctx.publish; a bad target delivers nothing."""

    async def test_targeted_and_broadcast_delivery_during_a_run(self) -> None:
        log: list[tuple[str, object]] = []

        class Announcer(Layer):
            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                await ctx.publish("index ready", target="search")
                await ctx.publish("hello all")

        @tool
        async def notify(text: str, ctx: Injected[RunContext[Any]]) -> str:
            await ctx.publish(text, target="metrics")
            return "sent"

        model = ScriptedModel([reply("", call("notify", text="tool says hi")), "done"])
        agent = Agent(
            model=model,
            tools=[notify],
            middleware=[Announcer(), Listener("search", log), Listener("metrics", log)],
        )
        async with Session(agent) as session:
            await session.run("go")
        assert log == [
            ("search", "index ready"),
            ("search", "hello all"),
            ("metrics", "hello all"),
            ("metrics", "tool says hi"),
        ]

    async def test_unknown_target_delivers_nothing_and_fails_the_caller(self) -> None:
        log: list[tuple[str, object]] = []

        class Announcer(Layer):
            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                await ctx.publish("x", target="nobody")

        model = ScriptedModel(["never"])
        agent = Agent(model=model, middleware=[Announcer(), Listener("search", log)])
        async with Session(agent) as session:
            with pytest.raises(ValueError, match="no layer named 'nobody'"):
                await session.run("go")
        assert log == []
        assert model.calls == 0
        with pytest.raises(ValueError, match="this context has no layers"):
            await RunContext.new().publish("x", target="search")
        await RunContext.new().publish("broadcast to no layers is a no-op")

    async def test_ambiguous_target_delivers_nothing(self) -> None:
        log: list[tuple[str, object]] = []
        bus = LayerBus([Listener("twin", log), Listener("twin", log), Listener("solo", log)])
        with pytest.raises(ValueError, match="target 'twin' is ambiguous \\(2 layers\\)"):
            await bus.publish("x", RunContext.new(), target="twin")
        assert log == []
        await bus.publish("y", RunContext.new(), target="solo")
        assert log == [("solo", "y")]


# ---------------------------------------------------------------------------------------
# message events through the loop


class Persistence:
    """A persistence subscriber: records every message event it gets."""

    def __init__(self) -> None:
        self.delivered: list[Message] = []

    async def __call__(self, message: Message, usage: Usage | None) -> None:
        self.delivered.append(message)


_op = st.sampled_from(["append", "add_end", "add_front", "replace_new", "replace_silent", "drop"])


class TestMessageEventsInARun:
    """Message events are flushed exactly once, by the loop, before the next request."""

    async def test_exactly_once_flush_under_appends_adds_and_replaces(self) -> None:
        persistence = Persistence()
        queued_at_request: list[int] = []
        delivered_at_request: list[set[Message]] = []

        class Curator(Layer):
            """Appends, adds, replaces (emitting and not) around every model call."""

            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                ctx.conversation.add(SystemMessage("memo"), index=0)

            async def wrap_model(
                self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
            ) -> ModelResponse:
                conversation = ctx.conversation
                queued_at_request.append(conversation.queued_events)
                delivered_at_request.append(set(persistence.delivered))
                step = len(queued_at_request)
                await conversation.append(UserMessage(f"appended {step}"))
                conversation.add(SystemMessage(f"added {step}"))
                history = conversation.messages
                cut = snap_boundary(history, len(history) - 3)  # replace() checks pairing
                conversation.replace([SystemMessage(f"summary {step}"), *history[cut:]])
                restored = SystemMessage(f"restored {step}")
                conversation.replace([restored, *conversation.messages], emit_new=False)
                if step == 2:
                    conversation.add_message_event(restored)
                return await call_next(request.evolve(messages=conversation.messages), ctx)

        @tool
        async def jot(text: str, conversation: Injected[Conversation]) -> str:
            conversation.add(SystemMessage(f"jotted {text}"))
            return "noted"

        model = ScriptedModel(
            [reply("", call("jot", text="x")), reply("", call("jot", text="y")), "done"]
        )
        agent = Agent(model=model, tools=[jot], middleware=[Curator()])
        async with Session(agent) as session:
            session.ctx.conversation.subscribe(persistence)
            result = await session.run("start")
            assert session.ctx.conversation.queued_events == 0

        assert result.final_text == "done"
        assert queued_at_request == [0, 0, 0]
        counts = Counter(persistence.delivered)
        assert max(counts.values()) == 1  # nothing delivered twice
        texts = {m.text for m in persistence.delivered}
        expected = {"start", "memo", "done", "noted"}
        expected |= {
            f"{kind} {step}" for kind in ("appended", "added", "summary") for step in (1, 2, 3)
        }
        expected |= {"jotted x", "jotted y", "restored 2"}
        assert expected <= texts
        assert not texts & {"restored 1", "restored 3"}  # emit_new=False stays silent
        # before each request, everything queued earlier had already been delivered
        assert SystemMessage("memo") in delivered_at_request[0]
        assert SystemMessage("jotted x") in delivered_at_request[1]
        assert SystemMessage("summary 1") in delivered_at_request[1]
        assert SystemMessage("jotted y") in delivered_at_request[2]

    @given(st.lists(st.lists(_op, max_size=4), min_size=1, max_size=3))
    async def test_any_mix_of_operations_delivers_each_new_message_once(
        self, plan: list[list[str]]
    ) -> None:
        persistence = Persistence()
        expected: list[Message] = []  # messages whose event the layer asked for
        counter = iter(range(10**6))
        step = iter(range(len(plan)))

        def fresh(kind: str) -> Message:
            return SystemMessage(f"{kind} {next(counter)}", essential=kind != "note")

        def layer_events() -> Counter[Message]:
            return Counter(m for m in persistence.delivered if isinstance(m, SystemMessage))

        class Operator(Layer):
            async def wrap_model(
                self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
            ) -> ModelResponse:
                conversation = ctx.conversation
                # flushed before this request: every earlier event delivered, exactly once
                assert conversation.queued_events == 0
                assert layer_events() == Counter(expected)
                for op in plan[next(step)]:
                    if op == "append":
                        message = fresh("appended")
                        await conversation.append(message)
                    elif op in ("add_end", "add_front"):
                        message = fresh("note")
                        conversation.add(message, index=0 if op == "add_front" else None)
                    elif op == "replace_new":
                        message = fresh("summary")
                        conversation.replace([message, *conversation.messages])
                    elif op == "replace_silent":
                        restored = fresh("restored")
                        conversation.replace([restored, *conversation.messages], emit_new=False)
                        continue
                    else:  # drop the non-essential notes: their queued events still go out
                        conversation.replace([m for m in conversation.messages if m.essential])
                        continue
                    expected.append(message)
                return await call_next(request, ctx)

        script = [reply("", call("noop")) for _ in plan[1:]] + ["done"]
        noop = FakeTool("noop")
        agent = Agent(model=ScriptedModel(script), tools=[noop.tool], middleware=[Operator()])
        async with Session(agent) as session:
            session.ctx.conversation.subscribe(persistence)
            result = await session.run("go")
            assert session.ctx.conversation.queued_events == 0
        assert layer_events() == Counter(expected)
        produced = [m for m in persistence.delivered if not isinstance(m, SystemMessage)]
        assert produced == list(result.messages)

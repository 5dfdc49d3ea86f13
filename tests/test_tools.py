"""@tool: functions become tools; injected values come from the context; failures are results."""

from __future__ import annotations

import enum
import functools
import gc
import threading
import weakref
from typing import Annotated, Any

import anyio
import attrs
import pytest

from tinyctx import (
    Agent,
    CancellationToken,
    EventSink,
    Layer,
    MemoryStore,
    RunConfig,
    RunContext,
    Session,
    ToolCall,
    ToolResult,
    tool,
)
from tinyctx.conversation import Conversation
from tinyctx.frozen import thaw
from tinyctx.stores import Store, StoreRegistry
from tinyctx.testing import ScriptedModel, call, capture_events, reply
from tinyctx.tool_handler import run_tool_or_error_result
from tinyctx.tools import (
    FunctionTool,
    Inject,
    Injected,
    InjectionError,
    SchemaError,
    ToolArgumentError,
    ToolRegistry,
)


@attrs.frozen
class AppData:
    user: str


@attrs.frozen
class OtherData:
    n: int = 0


class Shade(enum.Enum):
    DARK = "dark"


@attrs.frozen
class Found:
    title: str
    shade: Shade


def results(messages: Any) -> list[ToolResult]:
    return [m for m in messages if isinstance(m, ToolResult)]


class TestToolDecorator:
    """@tool builds a named, described tool from a function; the function stays callable."""

    def test_bare_and_configured_forms(self) -> None:
        async def lookup(q: str) -> str:
            """Look a word up."""
            return q

        bare = tool(lookup)
        called = tool()(lookup)
        named = tool(name="define", description="Define a word.")(lookup)
        assert (bare.name, bare.description) == ("lookup", "Look a word up.")
        assert (called.name, called.description) == ("lookup", "Look a word up.")
        assert (named.name, named.description) == ("define", "Define a word.")
        assert isinstance(bare, FunctionTool)
        assert named.spec.name == "define"
        assert repr(bare) == f"<tool 'lookup' from {__name__}.{lookup.__qualname__}>"

    async def test_the_tool_object_still_calls_the_function(self) -> None:
        @tool
        async def double(n: int) -> int:
            return n * 2

        assert await double(4) == 8

    def test_definition_errors_are_clear(self) -> None:
        with pytest.raises(TypeError, match="pass @tool\\(name=...\\)"):
            tool(lambda: "x")
        with pytest.raises(TypeError, match="pass the name as a keyword"):
            tool("search")  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="generator function"):

            @tool
            async def stream() -> Any:
                yield 1

        with pytest.raises(TypeError, match="needs a function"):
            tool(42)  # type: ignore[call-overload]
        with pytest.raises(ValueError, match="tool name"):
            tool(name="")(lambda: "x")

    async def test_a_plain_function_runs_in_a_worker_thread_and_never_blocks_the_loop(
        self,
    ) -> None:
        released = threading.Event()
        loop_thread = threading.get_ident()

        @tool
        def wait_for_release() -> dict[str, Any]:
            # if this ran on the event loop thread, the task setting the event could not run
            return {"released": released.wait(timeout=10), "thread": threading.get_ident()}

        async def release() -> None:
            await anyio.lowlevel.checkpoint()
            released.set()

        async with anyio.create_task_group() as group:
            group.start_soon(release)
            text = await wait_for_release.invoke({}, RunContext.new())
        assert isinstance(text, str)
        assert '"released": true' in text
        assert str(loop_thread) not in text

    async def test_in_thread_false_runs_a_cheap_function_inline(self) -> None:
        @tool(in_thread=False)
        def where() -> int:
            return threading.get_ident()

        assert await where.invoke({}, RunContext.new()) == str(threading.get_ident())

    async def test_results_that_are_not_text_become_json(self) -> None:
        @tool
        async def find() -> Any:
            return {"hits": (Found("a", Shade.DARK),), "tags": {"x"}, "none": None}

        @tool
        async def nothing() -> None:
            return None

        @tool
        async def text() -> str:
            return "plain"

        ctx = RunContext.new()
        assert await find.invoke({}, ctx) == (
            '{"hits": [{"title": "a", "shade": "dark"}], "tags": ["x"], "none": null}'
        )
        assert await nothing.invoke({}, ctx) == "null"
        assert await text.invoke({}, ctx) == "plain"

    async def test_a_returned_tool_result_keeps_its_flags_and_gets_the_call_id(self) -> None:
        @tool
        async def check() -> ToolResult:
            return ToolResult("x", "not found", "check", is_error=True)

        result = await run_tool_or_error_result(
            ToolCall("c9", "check"), RunContext.new(tools=[check])
        )
        assert (result.tool_call_id, result.is_error, result.content) == ("c9", True, "not found")

    async def test_positional_only_methods_and_partials(self) -> None:
        @tool
        async def scale(value: float, factor: int = 2, /, *, offset: float = 0.0) -> float:
            return value * factor + offset

        class Greeter:
            def __init__(self, greeting: str) -> None:
                self.greeting = greeting

            async def greet(self, name: str) -> str:
                """Greet someone."""
                return f"{self.greeting}, {name}"

        async def power(base: int, exponent: int) -> int:
            return int(base**exponent)

        ctx = RunContext.new()
        assert await scale.invoke({"value": 1, "offset": 0.5}, ctx) == "2.5"
        assert await scale.invoke({"value": 1, "factor": 3}, ctx) == "3.0"
        greet = tool(Greeter("hello").greet)
        assert list(thaw(greet.parameters)["properties"]) == ["name"]
        assert greet.description == "Greet someone."
        assert await greet.invoke({"name": "ada"}, ctx) == "hello, ada"
        square = tool(name="square")(functools.partial(power, exponent=2))
        assert await square.invoke({"base": 3}, ctx) == "9"


class TestInjection:
    """Injected parameters are filled from the context and never reach the model."""

    async def test_every_source_is_injected(self) -> None:
        seen: dict[str, Any] = {}

        @tool
        async def everything(
            q: str,
            ctx: Injected[RunContext[AppData]],
            config: Injected[RunConfig],
            token: Injected[CancellationToken],
            sink: Injected[EventSink],
            stores: Injected[StoreRegistry],
            conversation: Injected[Conversation],
            notes: Injected[Store],
            archive: Annotated[Store, Inject(store="cold")],
            data: Injected[AppData],
            missing: Injected[MemoryStore | None],
        ) -> str:
            seen.update(locals())
            return q

        stores = {"notes": MemoryStore(), "cold": MemoryStore()}
        ctx = RunContext.new(data=AppData("ada"), stores=stores, tools=[everything])
        assert await everything.invoke({"q": "hi"}, ctx) == "hi"
        assert seen["ctx"] is ctx
        assert seen["config"] is ctx.config
        assert seen["token"] is ctx.cancellation
        assert seen["sink"] is ctx.events
        assert seen["stores"] is ctx.stores
        assert seen["conversation"] is ctx.conversation
        assert seen["notes"] is stores["notes"]
        assert seen["archive"] is stores["cold"]
        assert seen["data"] == AppData("ada")
        assert seen["missing"] is None
        assert thaw(everything.parameters) == {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
            "additionalProperties": False,
        }

    async def test_injected_parameters_appear_nowhere_the_model_or_events_look(self) -> None:
        @tool
        async def remember(text: str, secret_store: Injected[Store], who: Injected[AppData]) -> str:
            """Remember a note for the user.

            Args:
                text: what to remember
                secret_store: where the notes live
                who: the user
            """
            await secret_store.append_note(who.user, text)
            return "saved"

        store = MemoryStore()
        model = ScriptedModel([reply("", call("remember", text="milk")), "done"])
        agent = Agent(model=model, tools=[remember])
        with capture_events() as events:
            async with Session(
                agent, data=AppData("ada-the-user"), stores={"secret_store": store}
            ) as session:
                result = await session.run("remember milk")
        assert result.final_text == "done"
        assert [n.text for n in await store.notes("ada-the-user")] == ["milk"]
        (spec,) = model.requests[0].tools
        visible = repr(spec) + repr(result.messages)
        visible += "".join(repr(e.payload()) for e in events)
        for hidden in ("secret_store", "who", "ada-the-user", "MemoryStore", "where the notes"):
            assert hidden not in visible

    async def test_the_model_cannot_set_an_injected_parameter(self) -> None:
        calls: list[Any] = []

        @tool
        async def act(ctx: Injected[RunContext[Any]]) -> str:
            calls.append(ctx)
            return "ok"

        model = ScriptedModel([reply("", call("act", ctx="forged")), "done"])
        async with Session(Agent(model=model, tools=[act])) as session:
            result = await session.run("go")
        (error,) = results(result.messages)
        assert error.is_error and "unexpected argument 'ctx'" in error.content
        assert calls == []

    def test_a_missing_store_fails_when_the_session_is_created(self) -> None:
        @tool
        async def remember(text: str, notes: Injected[Store]) -> str:
            return text

        agent = Agent(model=ScriptedModel(), tools=[remember])
        with pytest.raises(InjectionError) as info:
            Session(agent, stores={"memory": MemoryStore()})
        assert str(info.value) == (
            "tool 'remember': parameter 'notes' (Injected[Store]) needs the store 'notes', "
            "but the context's stores are: memory"
        )
        assert (info.value.tool, info.value.parameter) == ("remember", "notes")
        Session(agent, stores={"notes": MemoryStore()})  # satisfied: fine

    def test_app_data_of_the_wrong_type_fails_when_the_session_is_created(self) -> None:
        @tool
        async def whoami(data: Injected[AppData]) -> str:
            return data.user

        @tool
        async def maybe(data: Injected[AppData | None]) -> str:
            return "ok"

        with pytest.raises(InjectionError, match="needs the app data as AppData, but the"):
            Session(Agent(model=ScriptedModel(), tools=[whoami]), data=OtherData())
        with pytest.raises(InjectionError, match="context's data is None"):
            Session(Agent(model=ScriptedModel(), tools=[whoami]))
        Session(Agent(model=ScriptedModel(), tools=[maybe]))
        with pytest.raises(InjectionError, match="app data as AppData"):
            RunContext.new(data=OtherData(), tools=[whoami])

    async def test_registering_a_tool_the_run_cannot_satisfy_fails_at_registration(
        self,
    ) -> None:
        @tool
        async def remember(text: str, notes: Injected[Store]) -> str:
            return text

        class Registers(Layer):
            async def on_run_start(self, ctx: RunContext[Any]) -> None:
                ctx.tools.register(remember)

        model = ScriptedModel(["never"])
        async with Session(Agent(model=model, middleware=[Registers()])) as session:
            with pytest.raises(InjectionError, match="needs the store 'notes'"):
                await session.run("go")
        assert model.calls == 0
        ToolRegistry().register(remember)  # an unbound registry checks at call time

    def test_a_context_and_its_registry_make_no_cycle(self) -> None:
        """A context is freed with its last reference, though its registry checks later
        registrations against it (a cycle would wait for the cyclic collector)."""
        gc.disable()
        try:
            ctx = RunContext.new(stores={"notes": MemoryStore()})
            ref = weakref.ref(ctx)
            del ctx
            assert ref() is None
        finally:
            gc.enable()

    def test_a_registration_is_checked_after_the_bound_context_is_gone(self) -> None:
        """A nested context outliving the root it was derived from still checks."""

        @tool
        async def remember(text: str, notes: Injected[Store]) -> str:
            return text

        child = RunContext.new().derive(thread_id="t")  # the root is dropped at once
        gc.collect()
        with pytest.raises(InjectionError, match="needs the store 'notes'"):
            child.tools.register(remember)

    async def test_a_context_that_lost_a_value_fails_at_call_time_without_naming_it(
        self,
    ) -> None:
        @tool
        async def whoami(private_data: Injected[AppData]) -> str:
            return private_data.user

        ctx = RunContext.new(data=AppData("ada"), tools=[whoami])
        child = ctx.derive(data=OtherData())
        with pytest.raises(InjectionError, match="cannot run in this context"):
            await whoami.invoke({}, child)
        with capture_events() as events:
            result = await run_tool_or_error_result(ToolCall("c1", "whoami"), child)
        assert result.is_error and "needs the app data as AppData" in result.content
        assert "private_data" not in result.content
        assert [e.kind for e in events] == ["tool.failed"]

    async def test_a_quoted_injected_hint_resolves_like_the_unquoted_one(self) -> None:
        """`ctx: Injected['RunContext']` injects the run context, not the app's data."""
        seen: dict[str, Any] = {}

        @tool
        async def quoted(
            q: str,
            ctx: Injected["RunContext[Any]"],  # noqa: UP037 (the quotes are the case)
            cfg: Injected["RunConfig"],  # noqa: UP037
        ) -> str:
            seen.update(ctx=ctx, cfg=cfg)
            return q

        ctx = RunContext.new(data=AppData("ada"), tools=[quoted])
        assert await quoted.invoke({"q": "hi"}, ctx) == "hi"
        assert seen["ctx"] is ctx
        assert seen["cfg"] is ctx.config
        assert [i.source for i in quoted.injections] == ["context", "config"]

    def test_an_unresolvable_forward_reference_fails_at_definition(self) -> None:
        """A quoted hint naming nothing importable is a SchemaError naming the parameter."""
        with pytest.raises(SchemaError, match="'ctx'.*NoSuchContext"):

            @tool
            async def broken(ctx: Injected["NoSuchContext"]) -> str:  # type: ignore[name-defined]  # noqa: F821, UP037
                return ""

    def test_injection_spelling_errors_fail_at_definition(self) -> None:
        with pytest.raises(SchemaError, match="Inject\\(store=...\\) needs a Store annotation"):

            @tool
            async def bad(x: Annotated[int, Inject(store="notes")]) -> str:
                return ""

        with pytest.raises(ValueError, match="non-empty string"):
            Inject(store="")


class TestFailuresBecomeResults:
    """Bad arguments and raising tools become error results; the run goes on."""

    async def test_bad_arguments_become_an_error_result_the_model_can_read(self) -> None:
        calls: list[int] = []

        @tool
        async def fetch(url: str, retries: int = 1) -> str:
            calls.append(retries)
            return "page"

        model = ScriptedModel(
            [
                reply("", call("fetch", url="u", retries="three")),
                reply("", call("fetch", url="u", retries=3)),
                "fetched",
            ]
        )
        async with Session(Agent(model=model, tools=[fetch])) as session:
            result = await session.run("go")
        first, second = results(result.messages)
        assert first.is_error
        assert first.content == (
            "Error (InvalidArguments): invalid arguments for tool 'fetch': "
            "'retries': expected an integer, got \"three\""
        )
        assert model.requests[1].messages[-1] == first  # the model read it and fixed the call
        assert (second.is_error, second.content) == (False, "page")
        assert calls == [3]
        failed = [e for e in result.events if e.kind == "tool.failed"]
        assert [(e.error_type, e.tool) for e in failed] == [("InvalidArguments", "fetch")]  # type: ignore[attr-defined]
        assert result.final_text == "fetched"

    @pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
    async def test_a_raising_tool_becomes_an_error_result_and_the_run_continues(
        self, sync: bool
    ) -> None:
        def explode(path: str) -> str:
            raise OSError(f"disk on fire while reading {path}")

        async def aexplode(path: str) -> str:
            return explode(path)

        read = tool(name="read")(explode if sync else aexplode)
        model = ScriptedModel([reply("", call("read", path="/etc/x")), "recovered"])
        async with Session(Agent(model=model, tools=[read])) as session:
            result = await session.run("go")
        (error,) = results(result.messages)
        assert error.is_error
        assert error.content == "Error (OSError): disk on fire while reading /etc/x"
        (failed,) = [e for e in result.events if e.kind == "tool.failed"]
        assert failed.error == "disk on fire while reading /etc/x"  # type: ignore[attr-defined]
        assert failed.error_type == "OSError"  # type: ignore[attr-defined]
        assert (result.status, result.final_text, result.model_calls) == (
            "completed",
            "recovered",
            2,
        )

    def test_tool_argument_error_lists_problems(self) -> None:
        error = ToolArgumentError("t", ["a", "b"])
        assert error.problems == ("a", "b")
        assert str(error) == "invalid arguments for tool 't': a; b"

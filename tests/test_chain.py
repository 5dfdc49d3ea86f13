"""The onion: composition order, frames, names, one-sided sugar and layer pub/sub."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    ToolCall,
    ToolResult,
    UserMessage,
    after_model,
    before_model,
    tool_layer,
)
from tinyctx.chain import ToolCallHandler, compose
from tinyctx.testing import ScriptedModel, run_layer, run_tool_layer

REQUEST = ModelRequest(messages=(UserMessage("hi"),))


class Recorder(Layer):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        self.log.append(f"in:{self.name}")
        response = await call_next(request, ctx)
        self.log.append(f"out:{self.name}")
        return response

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        self.log.append(f"tool-in:{self.name}")
        result = await call_next(call, ctx)
        self.log.append(f"tool-out:{self.name}")
        return result


def function_layer(name: str, log: list[str]) -> Any:
    async def layer(
        request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        log.append(f"in:{name}")
        response = await call_next(request, ctx)
        log.append(f"out:{name}")
        return response

    layer.__name__ = name
    return layer


async def core(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return ModelResponse(AssistantMessage(f"{len(request.messages)}"))


class TestComposition:
    """Index 0 is outermost: requests go in list order, responses come back reversed."""

    @given(kinds=st.lists(st.sampled_from(["class", "function"]), max_size=8))
    async def test_onion_order_for_any_layer_list(self, kinds: list[str]) -> None:
        log: list[str] = []
        layers = [
            Recorder(f"L{i}", log) if kind == "class" else function_layer(f"L{i}", log)
            for i, kind in enumerate(kinds)
        ]
        onion = compose(layers, core)
        await onion(REQUEST, RunContext.new())
        names = [f"L{i}" for i in range(len(kinds))]
        assert log == [f"in:{n}" for n in names] + [f"out:{n}" for n in reversed(names)]

    async def test_tool_onion_uses_wrap_tool_only(self) -> None:
        log: list[str] = []
        layers = [Recorder("A", log), function_layer("F", log), Recorder("B", log)]

        async def tool_core(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
            log.append("core")
            return ToolResult.for_call(call, "ok")

        onion = compose(layers, tool_core, hook="tool")
        result = await onion(ToolCall("c1", "x"), RunContext.new())
        assert result.content == "ok"
        assert log == ["tool-in:A", "tool-in:B", "core", "tool-out:B", "tool-out:A"]

    def test_a_layer_without_the_hook_adds_no_frame(self) -> None:
        class ModelOnly(Layer):
            async def wrap_model(
                self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
            ) -> ModelResponse:
                return await call_next(request, ctx)

        async def tool_core(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
            return ToolResult.for_call(call, "ok")

        assert compose([ModelOnly(), ModelOnly()], tool_core, hook="tool") is tool_core
        assert compose([], core) is core

    async def test_call_next_zero_or_many_times_with_evolved_request(self) -> None:
        class ShortCircuit(Layer):
            async def wrap_model(
                self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
            ) -> ModelResponse:
                return ModelResponse(AssistantMessage("cached"))

        class Twice(Layer):
            async def wrap_model(
                self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
            ) -> ModelResponse:
                first = await call_next(request, ctx)
                longer = request.evolve(messages=(*request.messages, UserMessage("again")))
                second = await call_next(longer, ctx.derive(tags=("retry",)))
                return ModelResponse(AssistantMessage(first.text + "," + second.text))

        assert (await run_layer(ShortCircuit(), REQUEST, next=core)).text == "cached"
        assert (await run_layer(Twice(), REQUEST, next=core)).text == "1,2"

    def test_compose_rejects_unknown_hook(self) -> None:
        with pytest.raises(ConfigError, match="hook='both'.*'model' or 'tool'"):
            compose([], core, hook="both")  # type: ignore[call-overload]

    async def test_frames_per_layer_are_one_call_plus_the_layer(self) -> None:
        depths: list[int] = []

        async def probe(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            frame, depth = sys._getframe(), 0
            while frame is not None:
                depth += 1
                frame = frame.f_back  # type: ignore[assignment]
            depths.append(depth)
            return ModelResponse(AssistantMessage(""))

        for n in (0, 4):
            await compose([function_layer(f"f{i}", []) for i in range(n)], probe)(
                REQUEST, RunContext.new()
            )
        # each layer adds exactly one coroutine frame on the await chain
        assert depths[1] - depths[0] == 4


class TestLayerNames:
    """Layer names are unique within an agent; duplicates fail at construction."""

    def test_duplicate_names_raise_config_error(self) -> None:
        log: list[str] = []
        with pytest.raises(ConfigError, match=r"middleware\[1\].name='A'.*middleware\[0\]"):
            Agent(model=ScriptedModel(), middleware=[Recorder("A", log), Recorder("A", log)])
        Agent(model=ScriptedModel(), middleware=[Recorder("A", log), Recorder("B", log)])

    def test_non_layers_are_rejected(self) -> None:
        def sync_layer(request: Any, ctx: Any, call_next: Any) -> Any:
            return None

        with pytest.raises(ConfigError, match="async function"):
            Agent(model=ScriptedModel(), middleware=[sync_layer])
        with pytest.raises(ConfigError, match=r"middleware\[0\]"):
            Agent(model=ScriptedModel(), middleware=[42])  # type: ignore[list-item]

    def test_class_name_is_the_default_name(self) -> None:
        class Guard(Layer):
            pass

        assert Guard().name == "Guard"


class TestSugar:
    """@before_model, @after_model and @tool_layer build one-sided layers."""

    async def test_before_model_rewrites_or_keeps(self) -> None:
        @before_model
        async def add_note(request: ModelRequest, ctx: RunContext[Any]) -> ModelRequest | None:
            return request.evolve(system_prompt="note")

        seen: list[ModelRequest] = []

        async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            seen.append(request)
            return ModelResponse(AssistantMessage("ok"))

        await run_layer(add_note, REQUEST, next=model)
        assert seen[0].system_prompt == "note"
        assert add_note.name == "add_note"

    async def test_after_model_replaces_or_keeps(self) -> None:
        @after_model
        async def shout(
            response: ModelResponse, request: ModelRequest, ctx: RunContext[Any]
        ) -> ModelResponse | None:
            return response.evolve(message=AssistantMessage(response.text.upper()))

        @after_model
        async def observe(
            response: ModelResponse, request: ModelRequest, ctx: RunContext[Any]
        ) -> None:
            return None

        assert (await run_layer(shout, REQUEST)).text == "OK"
        assert (await run_layer(observe, REQUEST)).text == "ok"

    async def test_tool_layer_wraps_tool_calls(self) -> None:
        @tool_layer
        async def tag(
            call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
        ) -> ToolResult:
            result = await call_next(call, ctx)
            return ToolResult.for_call(call, result.content + "!")

        assert (await run_tool_layer(tag, ToolCall("c", "t"))).content == "ok!"

    def test_sugar_requires_async_functions(self) -> None:
        with pytest.raises(TypeError, match="@before_model needs an async function"):
            before_model(lambda request, ctx: None)  # type: ignore[arg-type,return-value]


class TestPublish:
    """ctx.publish delivers to one named layer or broadcasts in layer order."""

    class Listener(Layer):
        def __init__(self, name: str, log: list[tuple[str, object]], fail: bool = False) -> None:
            self.name = name
            self.log = log
            self.fail = fail

        async def on_event(self, event: object, ctx: RunContext[Any]) -> None:
            self.log.append((self.name, event))
            if self.fail:
                raise RuntimeError(f"{self.name} failed")

    def _ctx(self, *layers: Layer) -> RunContext[Any]:
        agent = Agent(model=ScriptedModel(), middleware=list(layers))
        return RunContext.new()._with(bus=agent.bus)

    async def test_broadcast_in_layer_order_and_targeted(self) -> None:
        log: list[tuple[str, object]] = []
        ctx = self._ctx(self.Listener("a", log), Recorder("r", []), self.Listener("b", log))
        await ctx.publish("hello")
        assert log == [("a", "hello"), ("b", "hello")]
        await ctx.publish("only-b", target="b")
        assert log[-1] == ("b", "only-b")

    async def test_unknown_target_delivers_nothing(self) -> None:
        log: list[tuple[str, object]] = []
        ctx = self._ctx(self.Listener("a", log))
        with pytest.raises(ValueError, match="no layer named 'zzz'.*layers: a"):
            await ctx.publish("x", target="zzz")
        with pytest.raises(ValueError, match="does not implement on_event"):
            await self._ctx(Recorder("r", [])).publish("x", target="r")
        assert log == []

    async def test_ambiguous_target_delivers_nothing(self) -> None:
        from tinyctx.chain import LayerBus

        log: list[tuple[str, object]] = []
        bus = LayerBus([self.Listener("same", log), self.Listener("same", log)])
        with pytest.raises(ValueError, match="ambiguous"):
            await bus.publish("x", RunContext.new(), target="same")
        assert log == []

    async def test_handler_error_stops_broadcast(self) -> None:
        log: list[tuple[str, object]] = []
        ctx = self._ctx(self.Listener("a", log, fail=True), self.Listener("b", log))
        with pytest.raises(RuntimeError, match="a failed"):
            await ctx.publish("x")
        assert log == [("a", "x")]


class TestRequestEvolve:
    """evolve() converts and validates the fields that change, and only those."""

    def test_evolve_converts_changed_fields_and_keeps_the_rest(self) -> None:
        from tinyctx.tools import ToolSpec

        request = ModelRequest(messages=(UserMessage("a"),), metadata={"k": [1]})
        same = request.evolve()
        assert same is request
        changed = request.evolve(
            messages=[UserMessage("b")], settings={"t": [1, 2]}, tools=[ToolSpec("x")]
        )
        assert changed.messages == (UserMessage("b"),)
        assert changed.settings == {"t": (1, 2)}
        assert changed.tools == (ToolSpec("x"),)
        assert changed.metadata is request.metadata
        assert changed == request.evolve(messages=(UserMessage("b"),)).evolve(
            settings={"t": (1, 2)}, tools=(ToolSpec("x"),)
        )
        assert hash(changed) == hash(
            ModelRequest(
                messages=(UserMessage("b"),),
                settings={"t": [1, 2]},
                tools=(ToolSpec("x"),),
                metadata={"k": [1]},
            )
        )

    def test_evolve_rejects_bad_values_and_unknown_fields(self) -> None:
        request = ModelRequest(messages=())
        with pytest.raises(TypeError, match=r"messages\[0\] must be a Message"):
            request.evolve(messages=["not a message"])
        with pytest.raises(TypeError, match="system_prompt must be a str"):
            request.evolve(system_prompt=3)
        with pytest.raises(TypeError, match="unexpected fields: \\['nope'\\]"):
            request.evolve(nope=1)
        assert request.with_metadata({"a": 1}).metadata == {"a": 1}

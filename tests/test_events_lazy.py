"""Events are built only when something would see them, and are the same events when built
later (issue #39 gap 2); empty registries share their empty defaults safely (gap 3)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from attrs import frozen
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyctx import Agent, AssistantMessage, Session, ToolCall, tool
from tinyctx.context import RunContext
from tinyctx.events import Event, EventSink, RunFinished
from tinyctx.model import ModelResponse
from tinyctx.state import LayerStates, RunStates
from tinyctx.store_protocols import StoreRegistry
from tinyctx.testing import ScriptedModel, assert_events_form_tree
from tinyctx.tool_types import ServerTool, ToolRegistry
from tinyctx.usage import CostTracker, Price, UsageTracker

pytestmark = pytest.mark.anyio


@frozen
class Counted(Event):
    """An event that counts its constructions (a plain event: it only stores fields)."""

    size: int = 0


BUILT = [0]
_init = Counted.__init__


def _counting_init(self: Counted, *args: Any, **kwargs: Any) -> None:
    BUILT[0] += 1
    _init(self, *args, **kwargs)


Counted.__init__ = _counting_init  # type: ignore[method-assign]


@tool
def echo(text: str) -> str:
    """Say the text back."""
    return text


def _script(tool_calls: int) -> list[Any]:
    steps: list[Any] = [
        ModelResponse(AssistantMessage("", tool_calls=(ToolCall(f"c{i}", "echo", {"text": "x"}),)))
        for i in range(tool_calls)
    ]
    return [*steps, "done"]


def _shape(events: tuple[Event, ...]) -> list[tuple[str, dict[str, Any]]]:
    """What an event says, without its ids, timestamp or timing."""
    return [(e.kind, {k: v for k, v in e.payload().items() if k != "seconds"}) for e in events]


async def _run(tool_calls: int, *, watch: bool) -> tuple[Any, list[Event]]:
    agent = Agent(model=ScriptedModel(_script(tool_calls)), tools=[echo])
    seen: list[Event] = []
    sink = EventSink(logger=None)
    if watch:
        sink.subscribe(seen.append)
    async with Session(agent, events=sink) as session:
        result = await session.run("go")
    return result, seen


class TestBuiltOnlyWhenSeen:
    """An event nobody would see is not constructed; anything that listens gets it built."""

    def test_no_listener_builds_nothing(self) -> None:
        ctx = RunContext.new(events=EventSink(logger=None))
        BUILT[0] = 0
        ctx.emit(Counted, size=3)
        assert BUILT[0] == 0

    def test_a_subscriber_gets_it_built_once(self) -> None:
        ctx = RunContext.new(events=EventSink(logger=None))
        seen: list[Event] = []
        ctx.events.subscribe(seen.append)
        BUILT[0] = 0
        ctx.emit(Counted, size=3)
        assert BUILT[0] == 1
        (event,) = seen
        assert isinstance(event, Counted) and event.size == 3
        assert event.run_id == ctx.run_id and event.root_run_id == ctx.root_run_id

    def test_a_logger_that_logs_the_level_gets_it_built(self) -> None:
        lines: list[tuple[str, dict[str, Any]]] = []

        class Logger:
            def debug(self, kind: str, **fields: Any) -> None:
                lines.append((kind, fields))

        ctx = RunContext.new(events=EventSink(logger=Logger()))
        ctx.emit(Counted, size=5)
        assert [(kind, fields["size"]) for kind, fields in lines] == [("event", 5)]

    async def test_a_run_nobody_watches_builds_its_events_on_first_read(self) -> None:
        emitted: list[float] = []

        async def model(request: Any, ctx: RunContext[Any]) -> ModelResponse:
            emitted.append(time.time())
            ctx.emit(Counted, size=7)
            return ModelResponse(AssistantMessage("ok"))

        async with Session(Agent(model=model), events=EventSink(logger=None)) as session:
            BUILT[0] = 0
            result = await session.run("go")
            assert BUILT[0] == 0
            counted = [e for e in result.events if isinstance(e, Counted)]
            assert BUILT[0] == 1
            assert result.events is result.events  # built once
        (event,) = counted
        assert event.size == 7 and event.run_id == result.run_id
        assert emitted[0] <= event.timestamp <= emitted[0] + 1  # the emit time, not the read's
        assert_events_form_tree(result.events)


class TestSameEventsAsBefore:
    """Events built later equal the events a subscriber saw built at once."""

    @settings(max_examples=10, deadline=None)
    @given(tool_calls=st.integers(0, 4))
    def test_watched_and_unwatched_runs_tell_the_same(self, tool_calls: int) -> None:
        import anyio

        async def both() -> None:
            lazy, _ = await _run(tool_calls, watch=False)
            eager, seen = await _run(tool_calls, watch=True)
            assert _shape(lazy.events) == _shape(eager.events) == _shape(tuple(seen))
            assert [type(e) for e in lazy.events] == [type(e) for e in eager.events]
            assert isinstance(lazy.events[-1], RunFinished)
            assert lazy.events[-1].status == "completed"
            assert eager.events == tuple(seen)  # the very events the subscriber got
            assert_events_form_tree(lazy.events)

        anyio.run(both, backend="trio")

    async def test_a_subscriber_attached_mid_run_sees_every_event_from_then_on(self) -> None:
        seen: list[Event] = []
        holder: dict[str, Any] = {}

        @tool
        def attach() -> str:
            """Start watching the run's events."""
            holder["ctx"].events.subscribe(seen.append)
            return "watching"

        script = [
            ModelResponse(AssistantMessage("", tool_calls=(ToolCall("a", "attach", {}),))),
            ModelResponse(AssistantMessage("", tool_calls=(ToolCall("b", "echo", {"text": "y"}),))),
            "done",
        ]
        agent = Agent(model=ScriptedModel(script), tools=[attach, echo])
        async with Session(agent, events=EventSink(logger=None)) as session:
            holder["ctx"] = session.ctx
            result = await session.run("go")
        events = result.events
        assert seen, "the subscriber saw nothing"
        start = events.index(seen[0])
        assert events[start:] == tuple(seen)  # every event from its attaching on, in order
        assert [e.kind for e in events[:start]][:2] == ["run.started", "model.call"]
        assert_events_form_tree(events)


class TestSharedEmptyDefaults:
    """Registries that share an empty default never let one instance's write reach another."""

    def test_tool_registries(self) -> None:
        first, second = ToolRegistry(), ToolRegistry()
        first.register(echo)
        first.register_server_tool(ServerTool("web_search"))
        assert first.names == ("echo",) and len(first.server_tools) == 1
        assert second.names == () and second.server_tools == ()
        run = second.for_new_run()
        run.register(echo)
        assert run.names == ("echo",) and second.names == ()
        assert ToolRegistry().names == ()

    def test_layer_and_run_states(self) -> None:
        first, second = LayerStates(), LayerStates()

        class State:
            def to_json(self) -> Any:
                return {}

        first.get("layer", State)
        assert "layer" in first and "layer" not in second and not LayerStates()
        first.discard("layer")
        second.discard("nothing")
        assert not first
        runs, other = RunStates(), RunStates()
        runs.of("r1")
        assert "r1" in runs and "r1" not in other and other.pop("r1") is None
        assert runs.pop("r1") is not None and len(runs) == 0

    def test_prices_stores_and_usage(self) -> None:
        tracker = UsageTracker()
        priced = CostTracker(tracker, {"m": Price(1.0, 2.0)})
        assert dict(priced.prices) == {"m": Price(1.0, 2.0)}
        assert dict(CostTracker(UsageTracker()).prices) == {}
        assert len(StoreRegistry()) == 0 and len(StoreRegistry(None)) == 0
        assert UsageTracker().total() == tracker.total()

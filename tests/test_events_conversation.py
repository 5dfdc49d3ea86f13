"""Event sink delivery and structlog binding; conversation message events."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from tinyctx import (
    Agent,
    AssistantMessage,
    Event,
    EventSink,
    Message,
    PairingError,
    RunContext,
    Session,
    SystemMessage,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.conversation import Conversation
from tinyctx.events import ControlApplied, SubscriberFailed
from tinyctx.testing import ScriptedModel, assert_events_form_tree, capture_events


class TestEventSink:
    """Events reach subscribers in order and structlog with the run's ids bound."""

    @pytest.mark.usefixtures("all_log_levels")
    def test_emit_stamps_ids_and_logs_them(self) -> None:
        ctx = RunContext.new().derive(tags=("t1",))
        received: list[Event] = []
        ctx.events.subscribe(received.append)
        with capture_logs() as logs:
            ctx.emit(ControlApplied(control="interrupt", detail="review"))
        (event,) = received
        assert event.run_id == ctx.run_id
        assert event.parent_run_id == ctx.parent_run_id
        assert event.root_run_id == ctx.root_run_id
        assert event.thread_id == ctx.thread_id
        assert event.tags == ("t1",)
        assert event.payload() == {"control": "interrupt", "detail": "review"}
        (line,) = logs
        assert line["event"] == "control.applied"
        assert line["log_level"] == "info"
        assert line["run_id"] == ctx.run_id and line["root_run_id"] == ctx.root_run_id
        assert line["tags"] == ("t1",) and line["detail"] == "review"

    def test_logger_none_disables_logging(self) -> None:
        sink = EventSink(logger=None)
        with capture_logs() as logs:
            sink.emit(ControlApplied())
        assert logs == []

    def test_failing_subscriber_is_reported_not_raised(self) -> None:
        sink = EventSink(logger=None)
        seen: list[Event] = []

        def broken(event: Event) -> None:
            raise RuntimeError("ui crashed")

        sink.subscribe(broken)
        sink.subscribe(seen.append)
        sink.emit(ControlApplied())
        assert isinstance(seen[0], ControlApplied)
        assert isinstance(seen[1], SubscriberFailed)
        assert seen[1].error == "RuntimeError: ui crashed"
        strict = EventSink(logger=None, raise_errors=True)
        strict.subscribe(broken)
        with pytest.raises(RuntimeError, match="ui crashed"):
            strict.emit(ControlApplied())

    def test_unsubscribe_and_capture(self) -> None:
        sink = EventSink(logger=None)
        seen: list[Event] = []
        unsubscribe = sink.subscribe(seen.append)
        with capture_events() as captured:
            sink.emit(ControlApplied())
            unsubscribe()
            sink.emit(ControlApplied())
        assert len(seen) == 1
        assert len(captured) == 2

    async def test_events_of_a_session_form_one_tree(self) -> None:
        with capture_events() as events:
            async with Session(Agent(model=ScriptedModel(["a", "b"]))) as session:
                await session.run("1")
                await session.run("2")
        assert_events_form_tree(events)
        runs = {e.run_id for e in events}
        assert len(runs) == 2

    def test_tree_check_rejects_broken_trees(self) -> None:
        base = RunContext.new()
        child = base.derive()
        good = [
            ControlApplied().stamped(
                run_id=child.run_id,
                parent_run_id=child.parent_run_id,
                root_run_id=child.root_run_id,
                thread_id=None,
                tags=(),
                lineage=child.config.lineage,
            )
        ]
        assert_events_form_tree(good)
        orphan = good[0].stamped(
            run_id="x",
            parent_run_id="nowhere",
            root_run_id=base.run_id,
            thread_id=None,
            tags=(),
            lineage=(),
        )
        with pytest.raises(AssertionError, match="no lineage"):
            assert_events_form_tree([*good, orphan])
        other_root = good[0].stamped(
            run_id="y", parent_run_id=None, root_run_id="y", thread_id=None, tags=()
        )
        with pytest.raises(AssertionError, match="2 roots"):
            assert_events_form_tree([*good, other_root])


class TestConversation:
    """append notifies now; add/replace queue events flushed exactly once."""

    async def test_append_is_visible_before_subscribers_and_not_rolled_back(self) -> None:
        conversation = Conversation()
        seen: list[tuple[int, Message, Usage | None]] = []

        async def subscriber(message: Message, usage: Usage | None) -> None:
            seen.append((len(conversation), message, usage))
            raise OSError("disk full")

        conversation.subscribe(subscriber)
        with pytest.raises(OSError, match="disk full"):
            await conversation.append(UserMessage("hi"), Usage(1, 2))
        assert seen == [(1, UserMessage("hi"), Usage(1, 2))]
        assert conversation.messages == (UserMessage("hi"),)

    async def test_an_unsubscribed_listener_hears_nothing_more(self) -> None:
        """subscribe() returns the way out: after it the listener is not called again,
        the others still are, and calling it twice is harmless."""
        conversation = Conversation()
        first: list[Message] = []
        second: list[Message] = []

        async def one(message: Message, usage: Usage | None) -> None:
            first.append(message)

        async def two(message: Message, usage: Usage | None) -> None:
            second.append(message)

        leave = conversation.subscribe(one)
        conversation.subscribe(two)
        await conversation.append(UserMessage("a"))
        leave()
        leave()
        await conversation.append(UserMessage("b"))
        assert first == [UserMessage("a")]
        assert second == [UserMessage("a"), UserMessage("b")]

    def test_wrong_message_types_are_named(self) -> None:
        """append/add/replace take Messages only, and say which item was not one."""
        conversation = Conversation([UserMessage("kept")])
        with pytest.raises(TypeError, match="expected a Message, got str"):
            conversation.add("text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"messages\[1\] must be a Message, got dict"):
            conversation.replace([UserMessage("a"), {"role": "user"}])  # type: ignore[list-item]
        assert conversation.messages == (UserMessage("kept"),)

    def test_replace_refuses_a_history_that_breaks_pairing(self) -> None:
        """replace() checks the pairing rule and leaves the log alone on a violation."""
        conversation = Conversation([UserMessage("hi")])
        before = conversation.messages
        with pytest.raises(PairingError, match="index 1.*'nope'") as info:
            conversation.replace([UserMessage("hi"), ToolResult("nope", "dangling")])
        assert (info.value.index, info.value.tool_call_id) == (1, "nope")
        with pytest.raises(PairingError, match="'mid'"):
            conversation.replace(
                [AssistantMessage("", (ToolCall("mid", "t"),)), AssistantMessage("next")]
            )
        assert conversation.messages is before and conversation.queued_events == 0
        # calls still waiting for their results at the end are allowed (a run in progress)
        pending = [UserMessage("hi"), AssistantMessage("", (ToolCall("p", "t"),))]
        conversation.replace(pending, emit_new=False)
        assert conversation.messages == tuple(pending)

    async def test_exactly_once_flush_of_add_replace_and_add_message_event(self) -> None:
        conversation = Conversation([SystemMessage("s")])
        delivered: list[Message] = []

        async def subscriber(message: Message, usage: Usage | None) -> None:
            delivered.append(message)

        conversation.subscribe(subscriber)
        conversation.add(UserMessage("added"))
        conversation.add(UserMessage("first"), index=0)
        summary = SystemMessage("summary")
        conversation.replace([summary, UserMessage("added")], emit_new=True)
        conversation.replace(
            [summary, UserMessage("added"), AssistantMessage("restored")], emit_new=False
        )
        conversation.add_message_event(AssistantMessage("restored"))
        with pytest.raises(ValueError, match="not in the conversation"):
            conversation.add_message_event(UserMessage("ghost"))
        assert await conversation.flush() == 4
        assert await conversation.flush() == 0
        assert delivered == [
            UserMessage("added"),
            UserMessage("first"),
            summary,
            AssistantMessage("restored"),
        ]

    async def test_failed_flush_never_redelivers(self) -> None:
        conversation = Conversation()
        delivered: list[str] = []
        fail = [True]

        async def subscriber(message: Message, usage: Usage | None) -> None:
            if fail[0]:
                fail[0] = False
                raise OSError("once")
            delivered.append(message.text)

        conversation.subscribe(subscriber)
        conversation.add(UserMessage("a"))
        conversation.add(UserMessage("b"))
        with pytest.raises(OSError):
            await conversation.flush()
        await conversation.flush()
        assert delivered == ["b"]

    async def test_loop_flushes_before_each_model_request_and_at_run_end(self) -> None:
        delivered: list[str] = []
        seen_at_call: list[list[str]] = []

        async def persist(message: Message, usage: Usage | None) -> None:
            delivered.append(f"{message.role}:{message.text}")

        async def model(request: Any, ctx: RunContext[Any]) -> Any:
            from tinyctx import ModelResponse, ToolCall

            seen_at_call.append(list(delivered))
            # a layer-owned message added during the call is persisted before the next call
            ctx.conversation.add(SystemMessage(f"note{len(seen_at_call)}"))
            if len(seen_at_call) == 1:
                return ModelResponse(AssistantMessage("", (ToolCall("c1", "missing"),)))
            return ModelResponse(AssistantMessage("ok"))

        async with Session(Agent(model=model)) as session:
            session.ctx.conversation.subscribe(persist)
            await session.run("one")
            assert session.ctx.conversation.queued_events == 0
        assert seen_at_call[1][-1] == "system:note1"
        assert delivered == [
            "user:one",
            "assistant:",
            "tool:Error (UnknownTool): unknown tool 'missing'; available tools: none",
            "system:note1",
            "assistant:ok",
            "system:note2",
        ]

    def test_snapshot_is_cached_and_versioned(self) -> None:
        conversation = Conversation([UserMessage("a")])
        first = conversation.messages
        assert conversation.messages is first
        version = conversation.version
        conversation.add(UserMessage("b"))
        assert conversation.version == version + 1
        assert conversation.messages is not first
        assert len(conversation) == 2


def test_structlog_is_not_configured_by_the_library() -> None:
    import importlib

    import tinyctx

    before = structlog.get_config()
    importlib.reload(tinyctx)
    assert structlog.get_config() == before


@pytest.mark.usefixtures("all_log_levels")
def test_trace_events_reach_subscribers_but_are_never_logged() -> None:
    from tinyctx.events import ModelStreamDelta

    ctx = RunContext.new()
    seen: list[Event] = []
    ctx.events.subscribe(seen.append)
    with capture_logs() as logs:
        ctx.emit(ModelStreamDelta(text="Hel"))
    assert [e.text for e in seen] == ["Hel"]  # type: ignore[attr-defined]
    assert logs == []

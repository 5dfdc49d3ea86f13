"""Approvals: a reviewed call whose arguments cannot run goes back to the model, not to a person."""

from __future__ import annotations

from typing import Any

import pytest

from tinyctx import Agent, Approve, Interrupted, Session, ToolCall, ToolResult, tool
from tinyctx.middleware import Approvals
from tinyctx.middleware.approvals import ReviewRequested, review_calls
from tinyctx.testing import ScriptedModel, call, capture_events, reply


class _Box:
    """A deploy tool that records what ran."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

        @tool
        async def deploy(service: str, replicas: int = 1) -> str:
            """Deploy a service."""
            self.ran.append({"service": service, "replicas": replicas})
            return f"deployed {service} x{replicas}"

        self.tools = [deploy]


def _result(messages: Any, call_id: str) -> ToolResult:
    (found,) = [m for m in messages if isinstance(m, ToolResult) and m.tool_call_id == call_id]
    return found


class TestInvalidArgumentsBeforeReview:
    """The schema is checked before a reviewer is asked; what fails it is the model's to fix."""

    async def test_a_call_failing_the_schema_is_answered_with_the_validation_error(
        self,
    ) -> None:
        """No pause and no review request: the model reads InvalidArguments and retries,
        and its corrected call is the one put to review."""
        box = _Box()
        model = ScriptedModel(
            [
                reply("", call("deploy", id="bad", service="web", replicas="two")),
                reply("", call("deploy", id="good", service="web", replicas=2)),
                "done",
            ]
        )
        agent = Agent(model=model, tools=box.tools, middleware=[Approvals("deploy")])
        async with Session(agent) as session:
            with capture_events() as events, pytest.raises(Interrupted) as info:
                await session.run("ship")
            error = _result(session.conversation_messages, "bad")
            assert error.is_error
            assert "InvalidArguments" in error.text
            assert "replicas" in error.text
            (entry,) = review_calls(info.value.checkpoint.payload) or ()
            assert entry["id"] == "good"
            requested = [e.tool_call_ids for e in events if isinstance(e, ReviewRequested)]
            assert requested == [("good",)]
            result = await session.resume(decisions={"good": Approve()})
        assert result.final_text == "done"
        assert box.ran == [{"service": "web", "replicas": 2}]

    async def test_in_a_batch_only_the_runnable_calls_are_reviewed(self) -> None:
        """A valid and an invalid reviewed call: the pause lists the valid one; on resume
        the invalid one gets its validation error and never runs."""
        box = _Box()
        model = ScriptedModel(
            [
                reply(
                    "",
                    call("deploy", id="ok", service="api"),
                    call("deploy", id="no", replicas=3),
                ),
                "done",
            ]
        )
        agent = Agent(model=model, tools=box.tools, middleware=[Approvals("deploy")])
        async with Session(agent) as session:
            with pytest.raises(Interrupted) as info:
                await session.run("ship")
            ids = [e["id"] for e in review_calls(info.value.checkpoint.payload) or ()]
            assert ids == ["ok"]
            result = await session.resume(decisions={"ok": Approve()})
            error = _result(session.conversation_messages, "no")
        assert result.final_text == "done"
        assert error.is_error
        assert "service" in error.text
        assert box.ran == [{"service": "api", "replicas": 1}]

    async def test_arguments_that_are_not_json_are_not_reviewed(self) -> None:
        """Raw argument text that was not a JSON object goes back as InvalidArguments."""
        box = _Box()
        broken = ToolCall("raw", "deploy", invalid_arguments='{"service": "web"')
        model = ScriptedModel([reply("", broken), "sorry"])
        agent = Agent(model=model, tools=box.tools, middleware=[Approvals("deploy")])
        async with Session(agent) as session:
            result = await session.run("ship")
            error = _result(session.conversation_messages, "raw")
        assert result.final_text == "sorry"
        assert error.is_error
        assert "not a JSON object" in error.text
        assert box.ran == []

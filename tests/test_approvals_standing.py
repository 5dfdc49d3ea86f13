"""Approvals.remember/revoke: "always approve" or "always reject" for the rest of a thread."""

from __future__ import annotations

from typing import Any

import pytest

from tinyctx import Agent, Approve, ConfigError, Interrupted, Reject, Session, ToolResult, tool
from tinyctx.middleware import Approvals
from tinyctx.middleware.approvals import ReviewDecided
from tinyctx.stores import MemoryStore
from tinyctx.testing import ScriptedModel, call, capture_events, reply


class _Box:
    """A deploy tool that records what ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

        @tool
        async def deploy(service: str) -> str:
            """Deploy a service."""
            self.ran.append(service)
            return f"deployed {service}"

        self.tools = [deploy]


def _agent(box: _Box, model: ScriptedModel, layer: Approvals) -> Agent[Any]:
    return Agent(model=model, tools=box.tools, middleware=[layer])


class TestStandingDecisions:
    """A remembered decision holds across sessions of the thread until it is revoked."""

    async def test_always_approve_runs_later_calls_unreviewed(self) -> None:
        """Remembered in one session, it holds in the next one (stored with the thread)."""
        store, box, layer = MemoryStore(), _Box(), Approvals("deploy")
        model = ScriptedModel([reply("", call("deploy", id="d1", service="web")), "done"])
        agent = _agent(box, model, layer)
        async with Session(agent, thread_id="t", store=store) as session:
            rule = await layer.remember(session.ctx, "deploy", Approve())
        assert rule.decision == "approve"
        async with Session(agent, thread_id="t", store=store) as session:
            assert layer.standing(session.ctx) == (rule,)
            with capture_events() as events:
                result = await session.run("ship")
        assert result.final_text == "done"
        assert box.ran == ["web"]
        decided = [(e.tool_call_id, e.decision) for e in events if isinstance(e, ReviewDecided)]
        assert decided == [("d1", "approve")]

    async def test_a_rule_for_exact_arguments_wins_and_others_are_reviewed(self) -> None:
        """Reject deploy(service='prod') always; deploy(service='web') still pauses."""
        box, layer = _Box(), Approvals("deploy")
        model = ScriptedModel(
            [
                reply(
                    "",
                    call("deploy", id="p", service="prod"),
                    call("deploy", id="w", service="web"),
                ),
                "ok",
            ]
        )
        async with Session(_agent(box, model, layer)) as session:
            await layer.remember(
                session.ctx, "deploy", Reject("never prod"), arguments={"service": "prod"}
            )
            with pytest.raises(Interrupted) as info:
                await session.run("ship")
            ids = [c["id"] for c in info.value.checkpoint.payload["calls"]]
            assert ids == ["w"]
            await session.resume(decisions={"w": Approve()})
            results = {
                m.tool_call_id: m
                for m in session.conversation_messages
                if isinstance(m, ToolResult)
            }
        assert box.ran == ["web"]
        assert results["p"].is_error
        assert "never prod" in results["p"].text

    async def test_revoke_brings_the_review_back(self) -> None:
        """After revoke the next call pauses for review; revoking nothing is False."""
        store, box, layer = MemoryStore(), _Box(), Approvals("deploy")
        model = ScriptedModel([reply("", call("deploy", id="d1", service="web")), "done"])
        agent = _agent(box, model, layer)
        async with Session(agent, thread_id="r", store=store) as session:
            await layer.remember(session.ctx, "deploy", Approve())
            assert await layer.revoke(session.ctx, "deploy") is True
            assert await layer.revoke(session.ctx, "deploy") is False
        async with Session(agent, thread_id="r", store=store) as session:
            assert layer.standing(session.ctx) == ()
            with pytest.raises(Interrupted):
                await session.run("ship")
        assert box.ran == []

    async def test_bad_arguments_name_the_field(self) -> None:
        """A decision that cannot last, or a bad tool name, is a ConfigError naming it."""
        layer = Approvals("deploy")
        async with Session(_agent(_Box(), ScriptedModel([]), layer)) as session:
            with pytest.raises(ConfigError) as info:
                await layer.remember(session.ctx, "deploy", "yes")  # type: ignore[arg-type]
            assert info.value.field == "decision"
            with pytest.raises(ConfigError) as info:
                await layer.remember(session.ctx, "", Approve())
            assert info.value.field == "tool"
            assert layer.standing(session.ctx) == ()

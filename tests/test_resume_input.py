"""Session.resume(decisions=..., input=...): the user's new message after the decided calls."""

from __future__ import annotations

from typing import Any

import pytest

from tinyctx import (
    Agent,
    Approve,
    Interrupted,
    PairingError,
    Reject,
    Session,
    ToolResult,
    UserMessage,
    codec,
    tool,
)
from tinyctx.middleware import Approvals
from tinyctx.stores import MemoryStore
from tinyctx.testing import ScriptedModel, call, reply
from tinyctx.threads import Lease, ThreadWrite


class _Recording(MemoryStore):
    """A MemoryStore that keeps every write it applied."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[ThreadWrite] = []

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        version = await super().write(
            thread_id, change, expected_version=expected_version, lease=lease
        )
        self.writes.append(change)
        return version


@tool
async def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def _agent(model: ScriptedModel) -> Agent[Any]:
    return Agent(model=model, tools=[deploy], middleware=[Approvals("deploy")])


async def _paused(store: MemoryStore, model: ScriptedModel, thread: str) -> Interrupted:
    async with Session(_agent(model), thread_id=thread, store=store) as session:
        with pytest.raises(Interrupted) as info:
            await session.run("ship web")
    return info.value


class TestResumeWithInput:
    """The new message follows the decided calls, lands with them, and reaches the model."""

    async def test_input_follows_the_results_in_one_write(self) -> None:
        """The last decided result and the user's message are one stored write, in order."""
        store = _Recording()
        model = ScriptedModel([reply("", call("deploy", id="d1", service="web")), "ok, and db"])
        await _paused(store, model, "t")
        store.writes.clear()
        async with Session(_agent(model), thread_id="t", store=store) as session:
            result = await session.resume(decisions={"d1": Approve()}, input="now db too")
        assert result.final_text == "ok, and db"
        seen = model.requests[-1].messages
        assert isinstance(seen[-2], ToolResult)
        assert seen[-2].content == "deployed web"
        assert seen[-1] == UserMessage("now db too")
        appended = [
            [type(m).__name__ for m in codec.decode_messages(w.append)] for w in store.writes
        ]
        assert ["ToolResult", "UserMessage"] in appended
        assert not any(kinds == ["ToolResult"] for kinds in appended)
        record = await store.load_thread("t")
        assert codec.decode_messages(record.messages)[-2] == UserMessage("now db too")

    async def test_a_rejected_call_is_answered_before_the_input(self) -> None:
        """A rejection's result comes first; the input follows it; pairing holds."""
        store = MemoryStore()
        model = ScriptedModel([reply("", call("deploy", id="d1", service="web")), "fine"])
        await _paused(store, model, "r")
        async with Session(_agent(model), thread_id="r", store=store) as session:
            await session.resume(decisions={"d1": Reject("not today")}, input="then skip it")
        seen = model.requests[-1].messages
        assert isinstance(seen[-2], ToolResult)
        assert seen[-2].is_error or "not today" in seen[-2].text
        assert seen[-1] == UserMessage("then skip it")

    async def test_input_that_breaks_pairing_is_refused_and_the_pause_stays(self) -> None:
        """A tool result answering no call is a PairingError naming input[0]; still paused."""
        store = MemoryStore()
        model = ScriptedModel([reply("", call("deploy", id="d1", service="web")), "fine"])
        await _paused(store, model, "p")
        stray = ToolResult("nope", "x", "deploy")
        async with Session(_agent(model), thread_id="p", store=store) as session:
            with pytest.raises(PairingError, match=r"input\[0\]"):
                await session.resume(decisions={"d1": Approve()}, input=[stray])
            with pytest.raises(PairingError, match=r"input\[0\]"):
                await session.check_resume(decisions={"d1": Approve()}, input=[stray])
            assert session.paused is not None
            result = await session.resume(decisions={"d1": Approve()}, input="go")
        assert result.final_text == "fine"

    async def test_input_without_a_store_follows_the_results(self) -> None:
        """In memory too the conversation reads call, result, input, answer."""
        model = ScriptedModel([reply("", call("deploy", id="d1", service="web")), "done"])
        async with Session(_agent(model), thread_id="m") as session:
            with pytest.raises(Interrupted):
                await session.run("ship")
            result = await session.resume(decisions={"d1": Approve()}, input="thanks")
            tail = session.conversation_messages[-4:]
        assert result.final_text == "done"
        assert [type(m).__name__ for m in tail] == [
            "AssistantMessage",
            "ToolResult",
            "UserMessage",
            "AssistantMessage",
        ]
        assert tail[2] == UserMessage("thanks")

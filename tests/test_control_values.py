"""Control outcomes are checked when built: a value no store could read back (a number as
an interrupt's node or message, a payload past what JSON keeps) is an error there, never a
checkpoint that makes every later session on the thread fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tinyctx import (
    Agent,
    Interrupt,
    Interrupted,
    RunContext,
    Session,
    StopWithFinal,
    Suspend,
    ToolResult,
    tool,
)
from tinyctx.control import ControlSlot
from tinyctx.stores import SqliteStore
from tinyctx.testing import ScriptedModel, call, reply
from tinyctx.tools import Injected

NOT_TEXT: list[Any] = [5, 1.5, None, b"bytes", ["a"], {"a": 1}]


class TestBuilt:
    """Interrupt, Suspend and StopWithFinal refuse what a checkpoint could not keep."""

    @pytest.mark.parametrize("value", NOT_TEXT)
    def test_node_and_message_must_be_strings(self, value: Any) -> None:
        """A non-str node or message is a TypeError naming the class and the field."""
        with pytest.raises(TypeError, match=r"^Interrupt\.node must be a str"):
            Interrupt(value)
        with pytest.raises(TypeError, match=r"^Interrupt\.message must be a str"):
            Interrupt("review", value)
        with pytest.raises(TypeError, match=r"^Suspend\.message must be a str"):
            Suspend("review", value)
        with pytest.raises(TypeError, match=r"^StopWithFinal\.text must be a str"):
            StopWithFinal(value)

    @pytest.mark.parametrize(
        "payload",
        [10**4300, {"n": [-(10**5000)]}, float("nan"), {"x": float("inf")}, {1: "key"}],
        ids=["huge-int", "nested-huge-int", "nan", "inf", "int-key"],
    )
    def test_a_payload_that_would_not_read_back_is_refused(self, payload: Any) -> None:
        """An integer past 4300 digits, a non-finite float, a non-str key: refused when built."""
        with pytest.raises(TypeError, match=r"^Interrupt\.payload"):
            Interrupt("review", payload=payload)
        with pytest.raises(TypeError, match=r"^Suspend\.state"):
            Suspend("review", state=payload)

    def test_what_reads_back_is_kept(self) -> None:
        """Text with lone surrogates, big (but convertible) integers, nesting: accepted."""
        interrupt = Interrupt("review\ud800", "why \udfff", payload={"n": 10**4299, "l": [[1]]})
        assert interrupt.payload["n"] == 10**4299
        slot = ControlSlot()
        slot.request(interrupt)
        assert slot.take() is interrupt


class TestThreadsStayOpen:
    """A tool that asks for a malformed outcome gets an error result; the thread reopens."""

    @pytest.mark.parametrize("kind", ["interrupt", "suspend"])
    async def test_a_non_string_message_never_reaches_the_store(
        self, kind: str, tmp_path: Path
    ) -> None:
        """The outcome fails where it is built, in the tool; the run and the thread go on."""

        @tool
        async def review(ctx: Injected[RunContext[Any]]) -> str:
            """Ask a human."""
            if kind == "suspend":
                raise Suspend("review", 5)  # type: ignore[arg-type]
            ctx.control.request(Interrupt("review", 5))  # type: ignore[arg-type]
            return "asked"

        model = ScriptedModel([reply("", call("review", id="c1")), reply("went on")] * 2)
        agent = Agent(model, tools=[review])
        async with SqliteStore(tmp_path / "t.db") as store:
            async with Session(agent, thread_id="t", store=store) as session:
                result = await session.run("please review")
            assert result.final_text == "went on"
            (answer,) = [m for m in result.messages if isinstance(m, ToolResult)]
            assert answer.is_error and "message must be a str" in answer.text
            async with Session(agent, thread_id="t", store=store) as again:
                assert again.paused is None
                assert (await again.run("and again")).final_text == "went on"

    async def test_a_well_formed_interrupt_still_pauses_and_resumes(self, tmp_path: Path) -> None:
        """The checks leave a good interrupt alone: stored, reopened, resumed."""

        @tool
        async def review(ctx: Injected[RunContext[Any]]) -> str:
            """Ask a human."""
            ctx.control.request(Interrupt("review", "ok?", payload={"n": 2**70}))
            return "asked"

        model = ScriptedModel([reply("", call("review", id="c1")), reply("resumed")])
        agent = Agent(model, tools=[review])
        async with SqliteStore(tmp_path / "t.db") as store:
            async with Session(agent, thread_id="t", store=store) as session:
                with pytest.raises(Interrupted):
                    await session.run("please review")
            async with Session(agent, thread_id="t", store=store) as again:
                assert again.paused is not None
                assert again.paused.payload == {"n": 2**70}
                assert (await again.resume()).final_text == "resumed"

"""Layers apply to MCP tools exactly as to local ones (a real stdio server, tests/mcp_server.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tinyctx import (
    Agent,
    Approve,
    Edit,
    EventSink,
    ImagePart,
    Interrupted,
    LimitExceeded,
    Session,
    ToolResult,
)
from tinyctx.mcp import MCPServerStdio, MCPTools
from tinyctx.messages import check_pairing
from tinyctx.middleware import Approvals, CallLimits, ClearOldImages, ToolResultBudget, ToolRetry
from tinyctx.ordering import OrderingError
from tinyctx.otel import OtelExporter
from tinyctx.testing import ScriptedModel, call, reply

SERVER = str(Path(__file__).with_name("mcp_server.py"))
LIMIT = 60


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "server.log"


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[Any]:
    with (tmp_path / "stderr.txt").open("w", encoding="utf-8") as f:
        yield f


@pytest.fixture
async def server(log: Path, errlog: Any) -> AsyncIterator[MCPServerStdio]:
    with anyio.fail_after(LIMIT):
        async with MCPServerStdio(
            sys.executable,
            [SERVER, "stdio"],
            name="t",
            env={"MCP_TEST_LOG": str(log)},
            errlog=errlog,
            connect_timeout=20,
        ) as opened:
            yield opened


def results(messages: tuple[Any, ...]) -> list[ToolResult]:
    return [m for m in messages if isinstance(m, ToolResult)]


def records(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [
        line for line in log.read_text(encoding="utf-8").splitlines() if line.startswith("record")
    ]


class TestApprovals:
    """A reviewed MCP call pauses the run and runs once, as approved or edited."""

    async def test_an_approved_call_runs_once_on_resume(
        self, server: MCPServerStdio, log: Path
    ) -> None:
        """Nothing reaches the server before the review; the approved call runs once."""
        model = ScriptedModel([reply("", call("record", id="r1", note="a")), "done"])
        agent = Agent(model, middleware=[MCPTools(server), Approvals("record")])
        with anyio.fail_after(LIMIT):
            async with Session(agent) as session:
                with pytest.raises(Interrupted) as paused:
                    await session.run("go")
                assert records(log) == []
                result = await session.resume(paused.value.checkpoint, decisions={"r1": Approve()})
                check_pairing(session.conversation_messages, allow_pending=False)
        assert [r.content for r in results(result.messages)] == ["recorded a"]
        assert len(records(log)) == 1

    async def test_an_edit_is_checked_against_the_servers_schema(
        self, server: MCPServerStdio, log: Path
    ) -> None:
        """Edited arguments off the MCP tool's schema are refused before anything runs;
        valid ones run."""
        model = ScriptedModel([reply("", call("record", id="r1", note="a")), "done"])
        agent = Agent(model, middleware=[MCPTools(server), Approvals("record")])
        with anyio.fail_after(LIMIT):
            async with Session(agent) as session:
                with pytest.raises(Interrupted) as paused:
                    await session.run("go")
                checkpoint = paused.value.checkpoint
                with pytest.raises(Exception, match="note"):
                    await session.resume(checkpoint, decisions={"r1": Edit({"note": 3})})
                result = await session.resume(checkpoint, decisions={"r1": Edit({"note": "b"})})
        assert [r.content for r in results(result.messages)] == ["recorded b"]

    def test_mcp_tools_must_sit_outside_approvals(self) -> None:
        """A stack with Approvals before MCPTools is refused when the agent is built."""
        unopened = MCPServerStdio(sys.executable, [SERVER, "stdio"], name="t")
        with pytest.raises(OrderingError, match="Approvals"):
            Agent(ScriptedModel(), middleware=[Approvals("record"), MCPTools(unopened)])


class TestLimitsRetriesAndBudgets:
    """Call limits, retries and the result budget treat MCP calls like any other."""

    async def test_call_limits_count_mcp_calls(self, server: MCPServerStdio) -> None:
        """A tool-call limit stops a run of MCP calls at the limit."""
        model = ScriptedModel([reply("", call("echo", text="1"), call("echo", text="2"))])
        agent = Agent(model, middleware=[MCPTools(server), CallLimits(tool_calls=1)])
        with anyio.fail_after(LIMIT):
            async with Session(agent) as session:
                with pytest.raises(LimitExceeded):
                    await session.run("go")
                check_pairing(session.conversation_messages, allow_pending=False)

    async def test_retries_answer_a_failing_mcp_tool(self, server: MCPServerStdio) -> None:
        """ToolRetry retries an isError answer, then gives the model the error."""
        model = ScriptedModel([reply("", call("fail", message="x")), "done"])
        with anyio.fail_after(LIMIT):
            async with Session(
                Agent(model, middleware=[MCPTools(server), ToolRetry(attempts=2, backoff=0)])
            ) as session:
                result = await session.run("go")
        (failed,) = results(result.messages)
        assert failed.is_error and "MCPToolError" in failed.content

    async def test_the_result_budget_cuts_a_long_mcp_result(self, server: MCPServerStdio) -> None:
        """A result over budget_bytes is cut before it enters history."""
        model = ScriptedModel([reply("", call("echo", text="é" * 4000)), "done"])
        agent = Agent(model, middleware=[MCPTools(server), ToolResultBudget(budget_bytes=1000)])
        with anyio.fail_after(LIMIT):
            async with Session(agent) as session:
                result = await session.run("go")
        (cut,) = results(result.messages)
        assert len(cut.content.encode()) <= 1000

    async def test_old_mcp_images_are_cleared(self, server: MCPServerStdio) -> None:
        """An image from an MCP tool is cleared like any other once newer ones pile up."""
        model = ScriptedModel(
            [reply("", call("picture", width=800, height=600)), reply("", call("picture")), "done"]
        )
        agent = Agent(model, middleware=[MCPTools(server), ClearOldImages(1)])
        with anyio.fail_after(LIMIT):
            async with Session(agent) as session:
                await session.run("go")
        last = model.requests[-1].messages
        images = [
            p
            for m in results(last)
            if isinstance(m.content, tuple)
            for p in m.content
            if isinstance(p, ImagePart)
        ]
        assert len(images) == 1


class TestTracing:
    """An MCP call's execute_tool span carries the GenAI conventions' MCP attributes."""

    async def test_execute_tool_spans_have_mcp_attributes(self, server: MCPServerStdio) -> None:
        """mcp.method.name, mcp.protocol.version and network.transport; an isError answer
        sets error.type to tool_error and the span's status to ERROR."""
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        exporter = OtelExporter(tracer_provider=provider)
        model = ScriptedModel([reply("", call("add", a=1, b=2), call("fail", message="no")), "ok"])
        agent = Agent(model, middleware=[MCPTools(server)])
        with anyio.fail_after(LIMIT):
            async with Session(agent, events=EventSink(subscribers=[exporter])) as session:
                await session.run("go")
        spans = {
            s.name: s for s in memory.get_finished_spans() if s.name.startswith("execute_tool")
        }
        added = dict(spans["execute_tool add"].attributes or {})
        assert added["mcp.method.name"] == "tools/call"
        assert added["gen_ai.tool.name"] == "add"
        assert added["network.transport"] == "pipe"
        assert added["mcp.protocol.version"] == server.protocol_version
        assert "error.type" not in added
        failed = spans["execute_tool fail"]
        assert dict(failed.attributes or {})["error.type"] == "tool_error"
        assert failed.status.status_code.name == "ERROR"


WORKER = Path(__file__).with_name("mcp_worker.py")


@pytest.mark.slow  # two processes and a server per run
class TestDurableApprovals:
    """A resumed run in another process reconnects to the server and runs the approved
    MCP call once."""

    @pytest.mark.parametrize("backend", ["trio", "asyncio"])
    def test_process_b_runs_what_process_a_paused(self, tmp_path: Path, backend: str) -> None:
        """A pauses at the review of an MCP call and exits; B opens the server again,
        approves, and the call runs exactly once."""
        db, log = str(tmp_path / "thread.db"), tmp_path / "server.log"

        def phase(name: str) -> str:
            done = subprocess.run(
                [sys.executable, str(WORKER), name, db, str(log), backend],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert "paused ['record']" in phase("pause")
        assert records(log) == []
        assert "resumed completed done: recorded once" in phase("resume")
        (ran,) = records(log)
        assert ran.startswith("record once")

"""Tools that need the run's context run as Temporal activities with a serialized
context: a tool taking ``RunContext``, ``Injected`` application data and a named store,
and the tools of a real MCP server (``tests/mcp_server.py``, written with the ``mcp``
SDK), under Temporal's time-skipping test server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen
from temporalio.testing import WorkflowEnvironment

from tests.engine_app import time_skipping_env
from tinyctx import Agent, AssistantMessage, SqliteStore, ToolCall, ToolResult, tool
from tinyctx.context import RunContext
from tinyctx.engines.temporal import TemporalEngine
from tinyctx.injection import Injected
from tinyctx.mcp import MCPServerStdio, MCPTools
from tinyctx.model import ModelRequest, ModelResponse
from tinyctx.store_protocols import Store
from tinyctx.stores import MemoryStore

env = time_skipping_env  # the Temporal test server fixture
SERVER = str(Path(__file__).with_name("mcp_server.py"))


@pytest.fixture
def anyio_backend() -> str:
    """Temporal's client and worker run on asyncio."""
    return "asyncio"


@frozen
class AppData:
    """The application data a tool gets injected."""

    user: str


def _agent(server: MCPServerStdio) -> Agent:
    """A model that calls the MCP server's ``record``, then ``remember`` with what it
    answered, then says both results."""

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        results = [m for m in request.messages if isinstance(m, ToolResult)]
        if not results:
            call = ToolCall("c0", "record", {"note": "n1"})
        elif len(results) == 1:
            call = ToolCall("c1", "remember", {"fact": str(results[0].content)})
        else:
            return ModelResponse(AssistantMessage(" | ".join(str(r.content) for r in results)))
        return ModelResponse(AssistantMessage("", tool_calls=(call,)))

    @tool
    async def remember(
        fact: str, ctx: Injected[RunContext[Any]], app: Injected[AppData], notes: Injected[Store]
    ) -> str:
        """Keep a fact in the notes store (uses the run's context, app data and a store)."""
        await notes.put("facts", ctx.thread_id or "", fact)
        return f"{app.user} keeps {fact!r} for run {ctx.config.run_id}"

    return Agent(model, tools=[remember], middleware=(MCPTools(server),), name="keeper")


class TestContextToolsAsActivities:
    """Request-scoped and MCP tools run in activities with the run's serialized context."""

    async def test_mcp_and_injected_tools(self, tmp_path: Path, env: WorkflowEnvironment) -> None:
        """The MCP tool runs once on the worker's connection; the injected tool sees the
        run's ids, the engine's data and its named store; both are activities."""
        log = tmp_path / "mcp.log"
        notes = MemoryStore()
        store = SqliteStore(tmp_path / "threads.db")
        with (tmp_path / "mcp.err").open("w") as errlog:
            server = MCPServerStdio(
                sys.executable,
                [SERVER, "stdio"],
                env={"MCP_TEST_LOG": str(log)},
                errlog=errlog,
                name="notes",
                connect_timeout=20.0,
            )
            async with server:
                engine = TemporalEngine(
                    _agent(server),
                    store,
                    name="ctx-tools",
                    task_queue="ctx-tools",
                    data=AppData("ada"),
                    stores={"notes": notes},
                )
                async with engine.worker(env.client):
                    result = await engine.run(env.client, "th", "go", request_id="r")
        assert result.final_text == (
            f"recorded n1 | ada keeps 'recorded n1' for run {result.run_id}"
        )
        assert [line.split(" pid=")[0] for line in log.read_text().splitlines()] == ["record n1"]
        assert await notes.get("facts", "th") == "recorded n1"
        history = await env.client.get_workflow_handle(result.workflow_id).fetch_history()
        scheduled = [
            e.activity_task_scheduled_event_attributes
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        names = [a.activity_type.name for a in scheduled]
        assert "tinyctx.tool:record" in names and "tinyctx.tool:remember" in names
        await store.aclose()

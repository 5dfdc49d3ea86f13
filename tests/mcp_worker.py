"""The two processes of the MCP approval test (not a test module).

``python tests/mcp_worker.py pause DB LOG BACKEND`` runs to the review of an MCP tool call
(the server's ``record``) and exits with the run paused in the SQLite file;
``python tests/mcp_worker.py resume DB LOG BACKEND`` is a new interpreter that opens the
MCP server again, approves the stored pause and runs it to the end. The server appends
each ``record`` it runs to LOG, so the test counts how many times the call ran.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio

from tinyctx import (
    Agent,
    Approve,
    AssistantMessage,
    Interrupted,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
    SqliteStore,
    ToolCall,
    ToolResult,
)
from tinyctx.mcp import MCPServerStdio, MCPTools
from tinyctx.middleware import Approvals

SERVER = str(Path(__file__).with_name("mcp_server.py"))


async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    """Asks for one ``record`` call, then answers with what it returned."""
    last = request.messages[-1]
    if isinstance(last, ToolResult):
        return ModelResponse(AssistantMessage(f"done: {last.text}"))
    return ModelResponse(AssistantMessage("", (ToolCall("rec-1", "record", {"note": "once"}),)))


async def main(command: str, db: str, log: str) -> None:
    store = SqliteStore(db)
    server = MCPServerStdio(
        sys.executable, [SERVER, "stdio"], name="notes", env={"MCP_TEST_LOG": log}
    )
    agent = Agent(model, middleware=[MCPTools(server), Approvals("record")])
    with anyio.fail_after(60):
        async with server, Session(agent, thread_id="mcp-thread", store=store) as session:
            if command == "pause":
                try:
                    await session.run("note it down")
                except Interrupted as paused:
                    print(f"paused {[c.name for c in paused.checkpoint.pending]}")
            else:
                assert session.paused is not None, "process B found no paused run"
                ids = [c.id for c in session.paused.pending]
                result = await session.resume(decisions={i: Approve() for i in ids})
                print(f"resumed {result.status} {result.final_text}")
    await store.aclose()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:4], backend=sys.argv[4])

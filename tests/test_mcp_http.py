"""Tools from an MCP server over streamable HTTP on a loopback port (tests/mcp_server.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.loopback import TRIO_ASYNCGEN_WARNING
from tests.ports import reserved_port
from tinyctx import Agent, ImagePart, Session, ToolResult
from tinyctx.mcp import MCPCall, MCPConnectError, MCPServerHTTP, MCPTools
from tinyctx.testing import ScriptedModel, call, capture_events, reply

# trio reports the SDK's HTTP streams (httpx2) it collects unexhausted; nothing leaks
pytestmark = pytest.mark.filterwarnings(TRIO_ASYNCGEN_WARNING)

SERVER = str(Path(__file__).with_name("mcp_server.py"))
LIMIT = 60


class HttpServer:
    """The test server in its own process, listening on 127.0.0.1:``port``."""

    def __init__(self, port: int, stderr: Any) -> None:
        self.port = port
        self.stderr = stderr
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, SERVER, "http", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the HTTP test server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the HTTP test server did not listen within 30s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    with (tmp_path / "stderr.txt").open("w", encoding="utf-8") as stderr:
        server = HttpServer(reserved_port(), stderr)
        server.start()
        try:
            yield server
        finally:
            server.stop()


def results(messages: tuple[Any, ...]) -> list[ToolResult]:
    return [m for m in messages if isinstance(m, ToolResult)]


class TestStreamableHttp:
    """The same tools, results and lifecycle over HTTP as over stdio."""

    async def test_tools_run_over_http(self, http_server: HttpServer) -> None:
        """Tools are listed and called; an image result is an ImagePart; the call reports
        the HTTP session and the server's address for its span."""
        model = ScriptedModel([reply("", call("add", a=20, b=22), call("picture")), "done"])
        with anyio.fail_after(LIMIT), capture_events(MCPCall) as calls:
            async with MCPServerHTTP(http_server.url, name="web") as web:
                async with Session(Agent(model, middleware=[MCPTools(web)])) as session:
                    result = await session.run("go")
        added, picture = results(result.messages)
        assert added.content == "42"
        assert isinstance(picture.content[0], ImagePart)
        attributes = dict(calls[0].attributes)  # type: ignore[attr-defined]
        assert attributes["network.transport"] == "tcp"
        assert attributes["network.protocol.name"] == "http"
        assert attributes["server.address"] == "127.0.0.1"
        assert attributes["server.port"] == http_server.port
        assert attributes["mcp.session.id"]

    async def test_a_restarted_server_is_reconnected(self, http_server: HttpServer) -> None:
        """A call to a server that went away gets an error result and the run goes on; once
        the server is back the connection is opened again and calls run."""
        model = ScriptedModel(
            [
                reply("", call("echo", text="before")),
                reply("", call("echo", text="while down")),
                reply("", call("echo", text="after")),
                "done",
            ]
        )
        restarted = anyio.Event()

        async def restart(request: Any, ctx: Any, call_next: Any) -> Any:
            # around the model calls: down before the second call, up again before the third
            if model.calls == 1:
                await anyio.to_thread.run_sync(http_server.stop)
            elif model.calls == 2:
                await anyio.to_thread.run_sync(http_server.start)
                restarted.set()
            return await call_next(request, ctx)

        with anyio.fail_after(LIMIT):
            async with MCPServerHTTP(http_server.url, name="web", backoff=0.05) as web:
                agent = Agent(model, middleware=[MCPTools(web), restart])
                async with Session(agent) as session:
                    result = await session.run("go")
        before, down, after = results(result.messages)
        assert before.content == "before"
        assert down.is_error and "web" in down.content
        assert restarted.is_set()
        assert after.content == "after"

    async def test_list_changed_over_http(self, http_server: HttpServer) -> None:
        """A tool the server adds during a call is offered over HTTP too, from a later
        model call on."""
        model = ScriptedModel(
            [
                reply("", call("grow")),
                reply("", call("echo", text="x")),
                reply("", call("double", x=4)),
                "done",
            ]
        )
        with anyio.fail_after(LIMIT):
            async with MCPServerHTTP(http_server.url, name="web") as web:
                async with Session(Agent(model, middleware=[MCPTools(web)])) as session:
                    result = await session.run("go")
        assert "double" not in {s.name for s in model.requests[0].tools}
        assert results(result.messages)[-1].content == "8"

    async def test_nothing_listening_fails_at_open(self) -> None:
        """A URL where no server listens fails `async with` with MCPConnectError naming
        the server."""
        nowhere = MCPServerHTTP(f"http://127.0.0.1:{reserved_port()}/mcp", name="nowhere")
        with anyio.fail_after(LIMIT), pytest.raises(MCPConnectError, match="'nowhere'"):
            async with nowhere:
                pass  # pragma: no cover

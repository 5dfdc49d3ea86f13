"""MCP servers the MCP tests start (not a test module), written with the SDK's own server API.

``python tests/mcp_server.py stdio`` serves the tools below over stdio;
``python tests/mcp_server.py http PORT`` serves them over streamable HTTP on 127.0.0.1;
``python tests/mcp_server.py malformed`` serves (with the low-level server) one good tool
and tools whose input schemas are malformed.

The tools: ``add``, ``echo``, ``picture`` (an image, an embedded text resource and text),
``fail`` (answers ``isError``), ``crash`` (the process exits mid-call), ``hang`` (never
answers; writes ``cancelled`` to ``$MCP_TEST_LOG`` when the client cancels it), ``grow``
(adds the tool ``double`` and says the tool list changed), ``shrink`` (removes ``echo``,
likewise) and ``record`` (appends its
note to ``$MCP_TEST_LOG``: the side effect a test counts). A resource ``note://greeting``
and a prompt ``review``.
"""

from __future__ import annotations

import base64
import os
import sys
import zlib
from pathlib import Path
from typing import Any

import anyio
import mcp.types as mt
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def _png(width: int = 3, height: int = 2) -> str:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return len(body).to_bytes(4, "big") + kind + body + crc.to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    raw = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    return base64.b64encode(raw).decode("ascii")


def _log(line: str) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if path:
        with Path(path).open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def full_server() -> Any:
    app = MCPServer("tinyctx-test")

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @app.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return text

    @app.tool()
    def picture(width: int = 3, height: int = 2) -> list[mt.ContentBlock]:
        """A picture, a note about it and a caption."""
        note = mt.TextResourceContents(uri="note://picture", mime_type="text/plain", text="red")
        return [
            mt.ImageContent(data=_png(width, height), mime_type="image/png"),
            mt.EmbeddedResource(resource=note),
            mt.TextContent(text="a red picture"),
        ]

    @app.tool()
    def fail(message: str) -> str:
        """Always fails with the message."""
        raise ToolError(message)

    @app.tool()
    def crash() -> str:
        """The server process dies while answering."""
        os._exit(3)

    @app.tool()
    async def hang() -> str:
        """Never answers."""
        _log("hanging")
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            _log("cancelled")
            raise
        return "never"  # pragma: no cover

    @app.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool 'double' and tell the client."""

        def double(x: int) -> int:
            """Twice x."""
            return 2 * x

        app.add_tool(double, name="double")
        await ctx.session.send_tool_list_changed()
        return "grown"

    @app.tool()
    async def shrink(ctx: Context) -> str:
        """Remove the tool 'echo' and tell the client."""
        app.remove_tool("echo")
        await ctx.session.send_tool_list_changed()
        return "shrunk"

    @app.tool()
    def record(note: str) -> str:
        """Write the note down (once per call)."""
        _log(f"record {note} pid={os.getpid()}")
        return f"recorded {note}"

    @app.resource("note://greeting", mime_type="text/plain")
    def greeting() -> str:
        return "hello from the server"

    @app.prompt()
    def review(code: str) -> str:
        """Ask for a review of the code."""
        return f"Please review: {code}"

    return app


def malformed_server() -> Any:
    tools = [
        mt.Tool(
            name="good",
            description="A well-formed tool.",
            input_schema={"type": "object", "properties": {"x": {"type": "integer"}}},
        ),
        mt.Tool(
            name="bad_type",
            description="Its property's type is not a JSON Schema type.",
            input_schema={"type": "object", "properties": {"x": {"type": "strin"}}},
        ),
        mt.Tool(
            name="bad_minimum",
            description="Its minimum is not a number.",
            input_schema={"type": "object", "properties": {"x": {"minimum": "a"}}},
        ),
    ]

    async def list_tools(ctx: Any, params: Any) -> mt.ListToolsResult:
        return mt.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: mt.CallToolRequestParams) -> mt.CallToolResult:
        return mt.CallToolResult(content=[mt.TextContent(text=f"{params.name} ran")])

    return Server("malformed", on_list_tools=list_tools, on_call_tool=call_tool)


async def _serve_lowlevel(server: Any) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main(argv: list[str]) -> None:
    mode = argv[0] if argv else "stdio"
    if mode == "stdio":
        full_server().run()
    elif mode == "http":
        port = int(argv[1])
        anyio.run(lambda: full_server().run_streamable_http_async(host="127.0.0.1", port=port))
    elif mode == "malformed":
        anyio.run(_serve_lowlevel, malformed_server())
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

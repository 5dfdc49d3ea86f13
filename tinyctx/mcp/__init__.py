"""Tools (and resources and prompts) from MCP servers, on the official ``mcp`` SDK.

Install with ``pip install 'tinyctx[mcp]'``. Open each server in the application's own
``async with`` (a task group it owns keeps the connection, reconnecting with backoff),
and give the agent :class:`MCPTools`::

    async with MCPServerStdio("python", ["server.py"], name="files") as files:
        agent = Agent(model, middleware=[MCPTools(files)])
        async with Session(agent) as session:
            await session.run("...")

Both transports run on trio and on asyncio. See ``docs/mcp.md``.
"""

from __future__ import annotations

try:
    import mcp as _mcp  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise ModuleNotFoundError(
        "tinyctx.mcp needs the MCP SDK: pip install 'tinyctx[mcp]'", name=exc.name
    ) from exc

from typing import Any

from ..context import RunContext
from ..messages import AssistantMessage, Message, UserMessage
from ..parts import Part
from ._connection import MCPConnectError, MCPConnection, MCPServerError
from ._content import content_to_parts, parts_or_text, resource_to_parts
from ._events import MCPCall, MCPConnected, MCPDisconnected, MCPToolsChanged, MCPToolSkipped
from ._layer import MCPToolConflict, MCPTools, mcp_servers
from ._tool import MCPTool, MCPToolError
from ._transports import MCPServerHTTP, MCPServerStdio

__all__ = [
    "MCPTools",
    "MCPConnection",
    "MCPServerStdio",
    "MCPServerHTTP",
    "MCPTool",
    "MCPToolError",
    "MCPToolConflict",
    "MCPConnectError",
    "MCPServerError",
    "MCPCall",
    "MCPConnected",
    "MCPDisconnected",
    "MCPToolSkipped",
    "MCPToolsChanged",
    "mcp_servers",
    "read_resource",
    "get_prompt",
    "content_to_parts",
]


async def read_resource(
    server: MCPConnection, uri: str, ctx: RunContext[Any] | None = None
) -> tuple[Part, ...]:
    """Resource ``uri`` of ``server`` as content parts (text as a text/plain document
    titled with its URI, images as images), e.g. for a layer that adds it to a request."""
    result = await server.read_resource(uri, ctx)
    return tuple(resource_to_parts(contents) for contents in result.contents)


async def get_prompt(
    server: MCPConnection,
    name: str,
    arguments: dict[str, str] | None = None,
    ctx: RunContext[Any] | None = None,
) -> tuple[Message, ...]:
    """Prompt ``name`` of ``server`` as tinyctx messages (user and assistant), ready to
    be sent as a run's input or added to a request."""
    result = await server.get_prompt(name, arguments, ctx)
    messages: list[Message] = []
    for message in result.messages:
        content = parts_or_text(content_to_parts([message.content])) or "(empty)"
        if message.role == "assistant":
            messages.append(
                AssistantMessage(
                    content if isinstance(content, str) else "\n".join(_describe(content))
                )
            )
        else:
            messages.append(UserMessage(content))
    return tuple(messages)


def _describe(parts: tuple[Part, ...]) -> list[str]:
    from ..parts import describe_part

    return [describe_part(p) for p in parts]

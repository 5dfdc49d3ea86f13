"""The layer that offers MCP servers' tools to a run, and reaches them from a context."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..chain import Layer, ModelCall, ToolCallHandler
from ..config import each, implements
from ..context import RunContext
from ..errors import ConfigError, TinyCtxError, ToolError
from ..messages import ToolCall, ToolResult
from ..model import ModelRequest, ModelResponse
from ..ordering import Outside
from ._connection import MCPConnectError, MCPConnection, MCPServerError
from ._events import MCPCall, MCPToolsChanged
from ._tool import MCPTool

__all__ = ["MCPTools", "MCPToolConflict", "mcp_servers"]

_NAMESPACE = "tinyctx.mcp.servers"
_SERVER = implements(
    MCPConnection, allowed="an MCPServerStdio, MCPServerHTTP or other MCPConnection"
)
_SOME_SERVERS = each(_SERVER, empty=False, allowed="at least one MCP server")


class MCPToolConflict(TinyCtxError, ValueError):
    """Two tools would share a name in one run (two servers' tools, or a server's tool and
    one of the agent's): nothing is overridden; prefix or filter a server."""


def mcp_servers(ctx: RunContext[Any]) -> Mapping[str, MCPConnection]:
    """The MCP servers of the run ``ctx`` belongs to, by name, for a layer or a tool that
    reads their resources or prompts (empty outside a run with :class:`MCPTools`)."""
    servers: Mapping[str, MCPConnection] = ctx.cache.namespace(_NAMESPACE)
    return servers


class MCPTools(Layer):
    """Offer the tools of MCP servers to every run of the agent, request-scoped.

    ``Agent(model, middleware=[MCPTools(server, other)])`` with the servers opened by
    the application (``async with server:``). When a run starts (or resumes) the
    servers' tools are registered in the run's registry (``ctx.tools``), with their
    schemas as the servers gave them; before each model call, a server that said its
    tool list changed is listed again and the run's tools are replaced then, so a list
    never changes in the middle of a model call. Two tools of one name are refused with
    :class:`MCPToolConflict`, naming both.

    Tools run through the tool onion like local ones (approvals, limits, retries, the
    result budget); each call to a server emits :class:`~tinyctx.mcp.MCPCall`, which
    :class:`~tinyctx.otel.OtelExporter` turns into the MCP attributes of its
    ``execute_tool`` span. Put it before :class:`~tinyctx.middleware.Approvals` (it
    must be, when both are in a stack) so a reviewer's edit is checked against the
    MCP tool's schema.
    """

    constraints = (
        Outside(
            "Approvals",  # by name: tinyctx's modules never import the layer library
            reason="a resume's edited arguments are checked against the MCP tools, which "
            "must be registered first",
        ),
    )

    def __init__(self, *servers: MCPConnection, name: str = "MCPTools") -> None:
        seen: dict[str, int] = {}
        for index, server in enumerate(servers):
            _SERVER.check(server, f"servers[{index}]", "MCPTools")  # the failing one named
            if server.name in seen:
                raise ConfigError(
                    f"servers[{index}].name",
                    server.name,
                    f"a name unique among the servers (servers[{seen[server.name]}] has it)",
                    owner="MCPTools",
                )
            seen[server.name] = index
        _SOME_SERVERS.check(servers, "servers", "MCPTools")
        self.servers = tuple(servers)
        self.name = name  # Layer checks it

    # -- keeping the run's registry in step ------------------------------------------------

    def _wanted(self) -> dict[str, MCPTool]:
        wanted: dict[str, MCPTool] = {}
        for server in self.servers:
            for tool in server.tools:
                other = wanted.get(tool.name)
                if other is not None:
                    raise MCPToolConflict(
                        f"tool name {tool.name!r} is offered by MCP servers {other.server.name!r} "
                        f"and {server.name!r}; give one a prefix= or leave the tool out with "
                        "include= / exclude="
                    )
                wanted[tool.name] = tool
        return wanted

    def sync(self, ctx: RunContext[Any]) -> bool:
        """Make the run's registry hold exactly the servers' current tools; True when it
        changed. Raises :class:`MCPToolConflict` (and changes nothing) on a clash."""
        namespace = ctx.cache.namespace(_NAMESPACE)
        for server in self.servers:
            namespace.setdefault(server.name, server)
        registry = ctx.tools
        ours = set(self.servers)
        registered = {t.name: t for t in registry if isinstance(t, MCPTool) and t.server in ours}
        wanted = self._wanted()
        if len(registered) == len(wanted) and all(
            registered.get(n) is t for n, t in wanted.items()
        ):
            return False
        for tool_name, tool in wanted.items():
            if tool_name in registry and tool_name not in registered:
                existing = registry.get(tool_name)
                raise MCPToolConflict(
                    f"tool name {tool_name!r} of MCP server {tool.server.name!r} is already "
                    f"taken by {existing!r} in this run; give the server a prefix= or leave "
                    "the tool out with include= / exclude="
                )
        for tool_name in registered:
            registry.unregister(tool_name)
        for tool in wanted.values():
            registry.register(tool)
        ctx.emit(
            MCPToolsChanged,
            added=tuple(n for n in wanted if registered.get(n) is not wanted[n]),
            removed=tuple(n for n in registered if n not in wanted),
        )
        return True

    def _check_open(self) -> None:
        for server in self.servers:
            if not server.opened:
                raise MCPConnectError(
                    f"MCP server {server.name!r} is not open: enter it (`async with server:`) "
                    "around the sessions that use it"
                )

    async def on_resume(self, ctx: RunContext[Any], checkpoint: Any, decisions: Any) -> bool:
        self._check_open()
        self.sync(ctx)  # before a reviewer's decisions are checked against the tools
        return False

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        self._check_open()
        self.sync(ctx)

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        for server in self.servers:
            if server.tools_stale and server.connected:
                try:
                    await server.refresh_tools()
                except (MCPServerError, MCPConnectError):
                    # the connection is going: keep the tools it had (their calls fail
                    # as errors until it is back), and list them again next time
                    server.mark_stale()
        if self.sync(ctx):
            request = request.evolve(tools=ctx.tools.specs())
        return await call_next(request, ctx)

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        tool = ctx.tools.get(call.name)
        if not isinstance(tool, MCPTool):
            return await call_next(call, ctx)
        try:
            result = await call_next(call, ctx)
        except ToolError as exc:
            if exc.error_type != "InvalidArguments":  # refused here: nothing was sent
                kind = "tool_error" if exc.error_type == "MCPToolError" else exc.error_type
                _report(ctx, tool, call, is_error=True, error=kind)
            raise
        _report(ctx, tool, call, is_error=result.is_error, error="")
        return result


def _report(
    ctx: RunContext[Any], tool: MCPTool, call: ToolCall, *, is_error: bool, error: str
) -> None:
    server = tool.server
    ctx.emit(
        MCPCall,
        server=server.name,
        tool=tool.remote_name,
        tool_call_id=call.id,
        transport=server.transport,
        protocol_version=server.protocol_version or "",
        session_id=server.session_id or "",
        is_error=is_error,
        error_type=error,
        attributes=server.span_attribute_items(),
    )

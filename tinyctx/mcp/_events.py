"""Events of MCP connections and of the layer that offers their tools."""

from __future__ import annotations

from typing import ClassVar

from attrs import frozen

from ..events import Event, EventLevel

__all__ = ["MCPConnected", "MCPDisconnected", "MCPToolSkipped", "MCPToolsChanged", "MCPCall"]


@frozen
class MCPConnected(Event):
    """A connection to an MCP server is up and its tools are listed; ``attempt`` counts
    the tries it took since the last connection was up (1: the first try worked)."""

    kind: ClassVar[str] = "mcp.connected"
    level: ClassVar[EventLevel] = "info"
    server: str = ""
    transport: str = ""
    protocol_version: str = ""
    tools: tuple[str, ...] = ()
    attempt: int = 1


@frozen
class MCPDisconnected(Event):
    """A connection to an MCP server was lost (or an attempt failed); the next attempt
    is in ``retry_in`` seconds."""

    kind: ClassVar[str] = "mcp.disconnected"
    level: ClassVar[EventLevel] = "warning"
    server: str = ""
    error: str = ""
    retry_in: float = 0.0


@frozen
class MCPToolSkipped(Event):
    """A tool the server lists is not offered to the model, and why (a malformed input
    schema, a name too long)."""

    kind: ClassVar[str] = "mcp.tool_skipped"
    level: ClassVar[EventLevel] = "warning"
    server: str = ""
    tool: str = ""
    reason: str = ""


@frozen
class MCPToolsChanged(Event):
    """A run's MCP tools were registered or replaced (a server's list changed), between
    two model calls."""

    kind: ClassVar[str] = "mcp.tools_changed"
    level: ClassVar[EventLevel] = "debug"
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


@frozen
class MCPCall(Event):
    """A tool call went to an MCP server: what the tracing layer puts on its
    ``execute_tool`` span (the GenAI conventions' MCP attributes)."""

    kind: ClassVar[str] = "mcp.call"
    level: ClassVar[EventLevel] = "debug"
    server: str = ""
    tool: str = ""
    tool_call_id: str = ""
    method: str = "tools/call"
    transport: str = ""
    protocol_version: str = ""
    session_id: str = ""
    is_error: bool = False
    error_type: str = ""
    """``tool_error`` when the server answered ``isError``, else the failure's type
    (``MCPServerError`` for a lost connection); empty when the call succeeded."""
    attributes: tuple[tuple[str, str | int], ...] = ()
    """The connection's span attributes (``network.transport``, ``mcp.session.id``...)."""

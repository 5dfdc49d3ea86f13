"""Tools the model can call, and the request-scoped registry a run resolves them from.

The kernel's :class:`Tool` is the plain form: a name, a description, a JSON Schema and an
``async handler(arguments, ctx)`` returning a string or a :class:`ToolResult`. What the
model sees is only the :class:`ToolSpec`; runtime values never reach it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from attrs import field, frozen
from attrs.validators import instance_of

from .frozen import EMPTY, FrozenDict, frozen_mapping

if TYPE_CHECKING:
    from .context import RunContext
    from .messages import ToolResult

__all__ = ["Tool", "ToolSpec", "ServerTool", "ToolRegistry", "ToolHandler"]

ToolHandler = Callable[[Mapping[str, Any], "RunContext[Any]"], Awaitable["str | ToolResult"]]

_EMPTY_OBJECT_SCHEMA: FrozenDict[str, Any] = frozen_mapping(
    {"type": "object", "properties": {}, "additionalProperties": False}
)


def _tool_name(instance: object, attribute: Any, value: Any) -> None:
    if not isinstance(value, str) or not value or len(value) > 128:
        raise ValueError(
            f"tool name must be a non-empty string of at most 128 chars, got {value!r}"
        )


@frozen(cache_hash=True)
class ToolSpec:
    """The model-visible part of a tool: name, description and parameter schema."""

    name: str = field(validator=_tool_name)
    description: str = field(default="", validator=instance_of(str))
    parameters: FrozenDict[str, Any] = field(default=_EMPTY_OBJECT_SCHEMA, converter=frozen_mapping)


@frozen
class Tool:
    """A local tool: ``await handler(arguments, ctx)`` returns a string or a ToolResult."""

    name: str = field(validator=_tool_name)
    description: str = field(default="", validator=instance_of(str))
    parameters: FrozenDict[str, Any] = field(default=_EMPTY_OBJECT_SCHEMA, converter=frozen_mapping)
    handler: ToolHandler | None = field(default=None, eq=False, repr=False, kw_only=True)
    spec: ToolSpec = field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.handler is None:
            raise ValueError(f"Tool {self.name!r}: handler is required")
        object.__setattr__(self, "spec", ToolSpec(self.name, self.description, self.parameters))

    async def invoke(self, arguments: Mapping[str, Any], ctx: RunContext[Any]) -> str | ToolResult:
        handler = self.handler
        assert handler is not None
        return await handler(arguments, ctx)


@frozen
class ServerTool:
    """A provider-hosted tool (web search, code interpreter): sent to the model, never run here.

    ``configuration`` is deep-copied and frozen, so a definition reused across sessions
    cannot be changed behind a registry's back.
    """

    type: str = field(validator=_tool_name)
    configuration: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)


class ToolRegistry:
    """The tools of one run: the agent's tools plus any a layer registers for this run only.

    Registering never touches the agent or another run. Names must be unambiguous across
    both levels; server tools are unique by ``type`` and never reach the local executor.
    """

    __slots__ = ("_base", "_base_server", "_local", "_server")

    def __init__(self, base: Iterable[Tool] = (), server_tools: Iterable[ServerTool] = ()) -> None:
        self._base: dict[str, Tool] = {}
        for tool in base:
            self._add(self._base, tool, where="agent tools")
        self._local: dict[str, Tool] = {}
        self._server: dict[str, ServerTool] = {}
        for server_tool in server_tools:
            self.register_server_tool(server_tool)
        self._base_server, self._server = self._server, {}

    @staticmethod
    def _add(into: dict[str, Tool], tool: Tool, *, where: str) -> None:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a Tool, got {type(tool).__name__}")
        existing = into.get(tool.name)
        if existing is not None:
            raise ValueError(
                f"tool name {tool.name!r} is ambiguous: {existing!r} is already in {where}, "
                f"cannot also register {tool!r}"
            )
        into[tool.name] = tool

    def register(self, tool: Tool) -> None:
        """Add ``tool`` for this run only; an existing name raises ValueError naming both."""
        existing = self._base.get(tool.name)
        if existing is not None:
            raise ValueError(
                f"tool name {tool.name!r} is ambiguous: the agent already has {existing!r}, "
                f"cannot also register {tool!r}"
            )
        self._add(self._local, tool, where="this run's tools")

    def register_server_tool(self, tool: ServerTool) -> None:
        """Add a provider-hosted tool; its ``type`` must be unique within the run."""
        if not isinstance(tool, ServerTool):
            raise TypeError(f"expected a ServerTool, got {type(tool).__name__}")
        if tool.type in self._server or tool.type in self._base_server:
            raise ValueError(
                f"server tool type {tool.type!r} is already registered for this run; two "
                "configurations under one type would make provider behaviour order-dependent"
            )
        # frozen_mapping deep-copies any mutable configuration into immutable form
        self._server[tool.type] = ServerTool(tool.type, tool.configuration)

    def get(self, name: str) -> Tool | None:
        return self._local.get(name) or self._base.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._local or name in self._base

    def __iter__(self) -> Iterator[Tool]:
        yield from self._base.values()
        yield from self._local.values()

    def __len__(self) -> int:
        return len(self._base) + len(self._local)

    @property
    def names(self) -> tuple[str, ...]:
        return (*self._base, *self._local)

    @property
    def server_tools(self) -> tuple[ServerTool, ...]:
        return (*self._base_server.values(), *self._server.values())

    def specs(self) -> tuple[ToolSpec, ...]:
        """What the model sees: every local tool's spec, agent tools first."""
        return tuple(tool.spec for tool in self)

    def for_new_run(self) -> ToolRegistry:
        """A registry with the same agent-level tools and nothing registered for a run."""
        fresh = ToolRegistry.__new__(ToolRegistry)
        fresh._base = self._base
        fresh._base_server = self._base_server
        fresh._local = {}
        fresh._server = {}
        return fresh

"""The plain tool (a name, a description, a JSON Schema, a handler), what the model sees
of it (:class:`ToolSpec`), server tools, and the request-scoped registry a run resolves
calls from. Nothing here depends on the run context at import time, so the context and
the model request import it freely."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from attrs import field, frozen
from attrs.validators import instance_of

from .errors import ResumeError
from .frozen import EMPTY, FrozenDict, clone_with, frozen_mapping
from .messages import ToolResult
from .parts import Part
from .schema import (
    ToolArgumentError,
)

if TYPE_CHECKING:
    from .context import RunContext
    from .decisions import Decision

__all__ = ["ServerTool", "Tool", "ToolHandler", "ToolOutput", "ToolRegistry", "ToolSpec"]


ToolOutput: TypeAlias = "str | ToolResult | tuple[Part, ...]"
"""What a tool returns: text, a full result, or content parts (images, documents)."""
ToolHandler = Callable[[Mapping[str, Any], "RunContext[Any]"], Awaitable[ToolOutput]]

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
    """A local tool: ``await handler(arguments, ctx)`` returns a string or a ToolResult.

    Args:
        name: The tool's name, as the model calls it (1 to 128 characters).
        description: What the tool does, for the model.
        parameters: The JSON Schema of its arguments (an empty object by default).
        handler: ``async (arguments, ctx)`` returning the tool's output.
    """

    name: str = field(validator=_tool_name)
    description: str = field(default="", validator=instance_of(str))
    parameters: FrozenDict[str, Any] = field(default=_EMPTY_OBJECT_SCHEMA, converter=frozen_mapping)
    handler: ToolHandler | None = field(default=None, eq=False, repr=False, kw_only=True)
    spec: ToolSpec = field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.handler is None:
            raise ValueError(f"Tool {self.name!r}: handler is required")
        object.__setattr__(self, "spec", ToolSpec(self.name, self.description, self.parameters))

    async def invoke(self, arguments: Mapping[str, Any], ctx: RunContext[Any]) -> ToolOutput:
        handler = self.handler
        assert handler is not None
        return await handler(arguments, ctx)

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Raise :class:`ToolArgumentError` when ``arguments`` do not fit ``parameters``.

        A plain tool checks the schema's top level: required properties present, no
        unknown property when ``additionalProperties`` is false, and each property's JSON
        ``type`` (a :class:`FunctionTool` checks everything its signature says).
        """
        problems = _top_level_problems(self.parameters, arguments)
        if problems:
            raise ToolArgumentError(self.name, problems)

    def check_context(self, ctx: RunContext[Any]) -> None:
        """Raise :class:`InjectionError` if this tool cannot run in ``ctx``.

        A plain tool needs nothing; a :class:`FunctionTool` checks its injections.
        """

    async def check_resume(
        self, state: Any, decisions: Mapping[str, Decision], ctx: RunContext[Any]
    ) -> None:
        """Raise :class:`~tinyctx.ResumeError` when a resume's ``decisions`` cannot resume
        this tool's suspended call (:class:`~tinyctx.Suspend`; ``state`` is what it gave),
        before anything runs. A plain tool takes no decisions; a tool that suspends for a
        review (a sub-agent's) checks them here.
        """
        if decisions:
            raise ResumeError(
                [
                    f"decisions were given for {sorted(decisions)}, but the run is paused at "
                    f"a call of tool {self.name!r}, which takes none"
                ]
            )


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, (list, tuple)),
    "object": lambda v: isinstance(v, Mapping),
}


def _top_level_problems(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    problems: list[str] = []
    for name in schema.get("required", ()):
        if name not in arguments:
            problems.append(f"missing required argument {name!r}")
    for name, value in arguments.items():
        prop = properties.get(name)
        if prop is None:
            if schema.get("additionalProperties", True) is False:
                takes = ", ".join(properties) or "no arguments"
                problems.append(f"unexpected argument {name!r} (this tool takes: {takes})")
            continue
        wanted = prop.get("type") if isinstance(prop, Mapping) else None
        kinds = (wanted,) if isinstance(wanted, str) else tuple(wanted or ())
        checks = [_JSON_TYPES[k] for k in kinds if k in _JSON_TYPES]
        if checks and not any(check(value) for check in checks):
            problems.append(f"{name!r}: expected {' or '.join(kinds)}, got {value!r}")
    return problems


@frozen
class ServerTool:
    """A provider-hosted tool (web search, code interpreter): sent to the model, never run here.

    ``configuration`` is deep-copied and frozen, so a definition reused across sessions
    cannot be changed behind a registry's back.
    """

    type: str = field(validator=_tool_name)
    configuration: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)


_NONE: dict[str, Any] = {}
"""The empty level every registry shares until it registers something (never written)."""
_NO_FIXED: tuple[tuple[ToolSpec, ...], tuple[ServerTool, ...]] = ((), ())
"""The agent level of a registry without agent tools (one object for all of them)."""


class ToolRegistry:
    """The tools of one run: the agent's tools plus any a layer registers for this run only.

    Registering never touches the agent or another run. Names must be unambiguous across
    both levels; server tools are unique by ``type`` and never reach the local executor.
    """

    __slots__ = ("_base", "_base_server", "_context", "_fixed", "_local", "_server")

    def __init__(self, base: Iterable[Tool] = (), server_tools: Iterable[ServerTool] = ()) -> None:
        self._context: RunContext[Any] | None = None
        # an empty level shares one empty dict (written only after it is replaced)
        agent_tools: dict[str, Tool] = {}
        for tool in base:
            self._add(agent_tools, tool, where="agent tools")
        self._base: dict[str, Tool] = agent_tools or _NONE
        self._local: dict[str, Tool] = _NONE
        self._base_server: dict[str, ServerTool] = _NONE
        self._server: dict[str, ServerTool] = _NONE
        for server_tool in server_tools:
            self.register_server_tool(server_tool)
        self._base_server, self._server = self._server, _NONE
        # what the model sees of the agent level, made once: it never changes after this
        self._fixed = (
            (tuple(tool.spec for tool in self._base.values()), tuple(self._base_server.values()))
            if self._base or self._base_server
            else _NO_FIXED
        )

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

    def bind(self, ctx: RunContext[Any]) -> None:
        """Check every tool against ``ctx`` now, and every tool registered later too.

        Sessions and ``RunContext.new`` bind their registry, so a tool asking for a store
        or app data the context lacks fails when the session is created, not mid-run.
        Raises :class:`InjectionError`; the registry stays unbound on failure.
        """
        for tool in self:
            tool.check_context(ctx)
        # kept to check later registrations: the context without its registry, since the
        # context holds this registry, and a cycle would keep a closed session's whole
        # conversation alive until the cyclic collector came by
        self._context = clone_with(ctx, {"tools": ToolRegistry()})

    def register(self, tool: Tool) -> None:
        """Add ``tool`` for this run only; an existing name raises ValueError naming both,
        a tool the bound context cannot satisfy raises :class:`InjectionError`."""
        if not isinstance(tool, Tool):
            raise TypeError(f"expected a Tool, got {type(tool).__name__}")
        existing = self._base.get(tool.name)
        if existing is not None:
            raise ValueError(
                f"tool name {tool.name!r} is ambiguous: the agent already has {existing!r}, "
                f"cannot also register {tool!r}"
            )
        if tool.name not in self._local and self._context is not None:
            tool.check_context(self._context)
        if self._local is _NONE:
            self._local = {}
        self._add(self._local, tool, where="this run's tools")

    def unregister(self, name: str) -> Tool:
        """Remove and return a tool registered for this run (:meth:`register`), so a layer
        can replace the tools it registered (an MCP server's changed tool list). The
        agent's own tools cannot be removed; any other name raises KeyError naming it."""
        tool = self._local.pop(name, None)
        if tool is None:
            where = "an agent tool" if name in self._base else "not registered"
            raise KeyError(f"cannot unregister tool {name!r}: it is {where} for this run")
        return tool

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
        if self._server is _NONE:
            self._server = {}
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
        fixed = self._fixed[1]
        return fixed if self._server is _NONE else (*fixed, *self._server.values())

    def specs(self) -> tuple[ToolSpec, ...]:
        """What the model sees: every local tool's spec, agent tools first."""
        fixed = self._fixed[0]
        if self._local is _NONE:
            return fixed  # the same tuple every run: nothing registered for this one
        return (*fixed, *(tool.spec for tool in self._local.values()))

    def for_new_run(self) -> ToolRegistry:
        """A registry with the same agent-level tools and nothing registered for a run."""
        fresh = ToolRegistry.__new__(ToolRegistry)
        fresh._context = self._context
        fresh._base = self._base
        fresh._base_server = self._base_server
        fresh._fixed = self._fixed
        fresh._local = _NONE
        fresh._server = _NONE
        return fresh

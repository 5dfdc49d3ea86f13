"""A tool an MCP server offers, as a tinyctx :class:`~tinyctx.Tool`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import mcp.types as mt
from attrs import field, frozen
from jsonschema import exceptions as schema_exceptions
from jsonschema import validators

from ..context import RunContext
from ..errors import TinyCtxError
from ..parts import Part
from ..schema import ToolArgumentError
from ..tools import Tool, ToolHandler
from ._content import result_text
from ._schema import fast_check, plain_arguments

if TYPE_CHECKING:
    from ._connection import MCPConnection

__all__ = ["MCPTool", "MCPToolError", "build_tool"]

_MAX_NAME = 128
_MAX_PROBLEMS = 8


class MCPToolError(TinyCtxError):
    """The server answered a call with ``isError``: the tool failed, and says how.

    Raised inside the tool, so the loop makes it an error result the model reads
    (``Error (MCPToolError): <the server's text>``) and tool layers (retries) see a
    :class:`~tinyctx.ToolError`, as for a local tool that raised."""

    def __init__(self, server: str, tool: str, text: str) -> None:
        self.server = server
        self.tool = tool
        self.text = text
        super().__init__(text or f"tool {tool!r} of MCP server {server!r} failed")


def _problem(error: schema_exceptions.ValidationError) -> str:
    path = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    where = f"'arguments{path}'" if path else "arguments"
    return f"{where}: {error.message}"


@frozen(repr=False)
class MCPTool(Tool):
    """A tool of an MCP server: the model sees the server's name (prefixed when the
    connection has a prefix), description and input schema as the server gave them.

    ``invoke`` checks the arguments against that schema (JSON Schema, the draft the
    schema names or 2020-12), then calls the tool on the server. A bad argument raises
    :class:`~tinyctx.tools.ToolArgumentError`, exactly as for an ``@tool`` function.
    """

    handler: ToolHandler | None = field(init=False, default=None, eq=False, repr=False)
    server: MCPConnection = field(kw_only=True, eq=False)
    remote_name: str = field(kw_only=True)
    generation: int = field(kw_only=True, default=0, eq=False)
    validator: Any = field(kw_only=True, eq=False, repr=False)
    fast: Callable[[dict[str, Any]], bool] | None = field(
        kw_only=True, default=None, eq=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "handler", self.invoke)
        super().__attrs_post_init__()

    def __repr__(self) -> str:
        return f"<MCP tool {self.name!r} of server {self.server.name!r}>"

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Raise :class:`~tinyctx.tools.ToolArgumentError` unless ``arguments`` fit the schema."""
        self._checked(plain_arguments(arguments))

    def _checked(self, plain: dict[str, Any]) -> dict[str, Any]:
        fast = self.fast
        if fast is not None and fast(plain):
            return plain
        validator = self.validator
        if not validator.is_valid(plain):
            errors = sorted(validator.iter_errors(plain), key=lambda e: list(e.absolute_path))
            problems = [_problem(e) for e in errors[:_MAX_PROBLEMS]]
            raise ToolArgumentError(self.name, problems)
        return plain

    async def invoke(
        self, arguments: Mapping[str, Any], ctx: RunContext[Any]
    ) -> str | tuple[Part, ...]:
        plain = self._checked(plain_arguments(arguments))
        result = await self.server.call_tool(self.remote_name, plain, ctx)
        output = result_text(result)
        if result.is_error:
            text = output if isinstance(output, str) else "\n".join(_texts(output))
            raise MCPToolError(self.server.name, self.remote_name, text)
        return output


def _texts(parts: tuple[Part, ...]) -> list[str]:
    from ..parts import describe_part

    return [describe_part(p) for p in parts]


def build_tool(server: MCPConnection, remote: mt.Tool, generation: int) -> MCPTool | str:
    """The tinyctx tool for ``remote``, or why it cannot be offered (a malformed schema,
    a name too long)."""
    name = server.exposed_name(remote.name)
    if not name or len(name) > _MAX_NAME:
        return f"its name {name!r} is not 1 to {_MAX_NAME} characters"
    schema = remote.input_schema
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        return f"its input schema must be a JSON Schema object with type 'object', got {schema!r}"
    try:
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        cls.check_schema(schema)
    except schema_exceptions.SchemaError as exc:
        return f"its input schema is not valid JSON Schema: {exc.message}"
    except Exception as exc:  # an unknown $schema, a schema jsonschema cannot read
        return f"its input schema cannot be read: {type(exc).__name__}: {exc}"
    return MCPTool(
        name,
        remote.description or "",
        schema,
        server=server,
        remote_name=remote.name,
        generation=generation,
        validator=cls(schema),
        fast=fast_check(schema),
    )

"""Tools the model can call, and the request-scoped registry a run resolves them from.

The kernel's :class:`Tool` is the plain form: a name, a description, a JSON Schema and an
``async handler(arguments, ctx)`` returning a string or a :class:`ToolResult`. What the
model sees is only the :class:`ToolSpec`; runtime values never reach it.

:func:`tool` builds a :class:`FunctionTool` from a function's signature and docstring.
Parameters typed ``Injected[T]`` (the run context, the app's ``data``, a named store, the
cancellation token, the event sink, ...) are filled from the context at call time and are
never part of the schema; a registry bound to a context refuses a tool whose injections
the context cannot satisfy, at registration.
"""

from __future__ import annotations

import functools
import inspect
import json
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, TypeVar, overload

import anyio.to_thread
from attrs import field, frozen
from attrs.validators import instance_of

from .cancel import CancellationToken
from .docstrings import parse_docstring
from .errors import ResumeError, TinyCtxError
from .events import EventSink
from .frozen import EMPTY, FrozenDict, clone_with, frozen_mapping
from .messages import ToolResult
from .parts import PART_TYPES, Part
from .schema import (
    ArgumentsSchema,
    Param,
    RuntimeMarker,
    SchemaError,
    ToolArgumentError,
    is_typeddict,
    to_json_value,
)
from .store_protocols import Store, StoreRegistry

if TYPE_CHECKING:
    from .context import RunContext
    from .decisions import Decision

__all__ = [
    "Tool",
    "ToolSpec",
    "ServerTool",
    "ToolRegistry",
    "ToolHandler",
    "FunctionTool",
    "tool",
    "Inject",
    "Injected",
    "Injection",
    "InjectionError",
    "ToolArgumentError",
    "SchemaError",
    "injection_for",
]

T = TypeVar("T")

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


class ToolRegistry:
    """The tools of one run: the agent's tools plus any a layer registers for this run only.

    Registering never touches the agent or another run. Names must be unambiguous across
    both levels; server tools are unique by ``type`` and never reach the local executor.
    """

    __slots__ = ("_base", "_base_server", "_context", "_local", "_server")

    def __init__(self, base: Iterable[Tool] = (), server_tools: Iterable[ServerTool] = ()) -> None:
        self._context: RunContext[Any] | None = None
        self._base: dict[str, Tool] = {}
        for tool in base:
            self._add(self._base, tool, where="agent tools")
        self._local: dict[str, Tool] = {}
        self._base_server: dict[str, ServerTool] = {}
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
        fresh._context = self._context
        fresh._base = self._base
        fresh._base_server = self._base_server
        fresh._local = {}
        fresh._server = {}
        return fresh


# ---------------------------------------------------------------------------------------
# runtime injection


class InjectionError(TinyCtxError, ValueError):
    """A tool asks for a runtime value its context cannot give (a missing store, app data
    of another type). Raised when the tool is registered or its session is created."""

    def __init__(self, message: str, *, tool: str, parameter: str | None = None) -> None:
        self.tool = tool
        self.parameter = parameter
        super().__init__(message)


@frozen
class Inject(RuntimeMarker):
    """``Annotated`` metadata: fill this parameter from the run context at call time.

    ``Injected[T]`` is ``Annotated[T, Inject()]``. Spell a store name explicitly with
    ``Annotated[Store, Inject(store="notes")]``; ``notes: Injected[Store]`` uses the
    parameter's name as the store's name.
    """

    store: str | None = field(default=None)

    @store.validator
    def _check_store(self, attribute: Any, value: Any) -> None:
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"Inject(store=...) must be a non-empty string, got {value!r}")


Injected = Annotated[T, Inject()]
"""A parameter filled from the run context at call time, invisible to the model.

By type: ``RunContext`` (the context itself), ``RunConfig``, ``CancellationToken``,
``EventSink``, ``StoreRegistry``, ``Conversation``, a ``Store`` (the store named like the
parameter, or ``Inject(store=...)``); any other type is the app's ``data``. ``T | None``
injects None when a store is missing instead of refusing the tool.
"""

Source = Literal[
    "context", "config", "cancellation", "events", "stores", "conversation", "store", "data"
]

_NONE_TYPE = type(None)


def _type_name(tp: Any) -> str:
    name = getattr(tp, "__name__", None)
    if isinstance(name, str) and typing.get_origin(tp) is None:
        return name
    return repr(tp).replace("typing.", "")


def _instance_check(tp: Any) -> Callable[[object], bool] | None:
    """A runtime check for ``tp``, or None when it cannot be checked (Any, protocols...)."""
    if tp is Any or tp is object:
        return None
    if tp is None or tp is _NONE_TYPE:
        return lambda value: value is None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _instance_check(args[0])
    if origin is typing.Union or origin is types.UnionType:
        checks = [_instance_check(a) for a in args]
        if any(c is None for c in checks):
            return None
        return lambda value: any(c(value) for c in checks if c is not None)
    target = origin if isinstance(origin, type) else tp
    if not isinstance(target, type):
        return None
    if is_typeddict(target):
        target = dict
    if getattr(target, "_is_protocol", False) and not getattr(
        target, "_is_runtime_protocol", False
    ):
        return None
    return lambda value: isinstance(value, target)


def _is_store_type(tp: type) -> bool:
    try:
        return tp is Store or issubclass(tp, Store)
    except TypeError:
        return False


_UNAVAILABLE: Any = object()


@frozen
class Injection:
    """One injected parameter: where its value comes from and how it is checked."""

    parameter: str
    source: Source
    annotation: Any = field(eq=False)
    store: str | None = None
    optional: bool = False
    check: Callable[[object], bool] | None = field(default=None, eq=False, repr=False)

    def fetch(self, ctx: RunContext[Any]) -> Any:
        """The value from ``ctx``, or ``_UNAVAILABLE`` (then :meth:`problem` says why)."""
        source = self.source
        if source == "store":
            store = ctx.stores.get(self.store) if self.store is not None else None
            if store is None:
                return None if self.optional else _UNAVAILABLE
            if self.check is not None and not self.check(store):
                return _UNAVAILABLE
            return store
        if source == "data" or source == "context":
            check = self.check
            if check is not None:
                data = ctx.data
                if not (data is None and self.optional) and not check(data):
                    return _UNAVAILABLE
            return ctx if source == "context" else ctx.data
        if source == "config":
            return ctx.config
        if source == "cancellation":
            return ctx.cancellation
        if source == "events":
            return ctx.events
        if source == "stores":
            return ctx.stores
        return ctx.conversation

    def problem(self, ctx: RunContext[Any]) -> str | None:
        """Why ``ctx`` cannot give this value, or None when it can."""
        if self.fetch(ctx) is not _UNAVAILABLE:
            return None
        if self.source == "store":
            name = self.store
            assert name is not None
            if name not in ctx.stores:
                known = ", ".join(sorted(ctx.stores)) or "none"
                return f"needs the store {name!r}, but the context's stores are: {known}"
            return (
                f"needs the store {name!r} to be {_type_name(self.annotation)}, "
                f"it is {type(ctx.stores[name]).__name__}"
            )
        data = ctx.data
        return (
            f"needs the app data as {_type_name(self.annotation)}, but the "
            f"context's data is {type(data).__name__ if data is not None else 'None'}"
        )


def _split_marker(annotation: Any) -> tuple[Inject | None, Any, bool]:
    """``(marker, inner type, optional)`` for an injected annotation; marker None if not."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        markers = [m for m in args[1:] if isinstance(m, Inject)]
        if not markers:
            return None, annotation, False
        inner, optional = _strip_none(args[0])
        return markers[0], inner, optional
    if origin is typing.Union or origin is types.UnionType:
        rest = [a for a in args if a is not _NONE_TYPE]
        if len(rest) == 1 and len(args) == 2:
            marker, inner, _ = _split_marker(rest[0])
            if marker is not None:
                return marker, inner, True
    return None, annotation, False


def _has_forward_ref(tp: Any) -> bool:
    if isinstance(tp, (str, typing.ForwardRef)):
        return True
    args = typing.get_args(tp)
    if typing.get_origin(tp) is Annotated:
        args = args[:1]  # the metadata is not a type
    return any(_has_forward_ref(a) for a in args)


def _resolve_hint(annotation: Any, fn: Callable[..., Any], where: str) -> Any:
    """``annotation`` with quoted forward references (``Injected['RunContext']``) resolved
    in ``fn``'s module, as the unquoted hint would be; a SchemaError naming ``where`` when
    one cannot be resolved."""
    if not _has_forward_ref(annotation):
        return annotation
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    target = inspect.unwrap(target)
    globalns = getattr(target, "__globals__", None)
    if globalns is None:
        globalns = getattr(inspect.getmodule(target), "__dict__", {})

    def holder() -> None: ...

    holder.__annotations__ = {"hint": annotation}
    try:
        return typing.get_type_hints(holder, globalns=globalns, include_extras=True)["hint"]
    except Exception as exc:
        raise SchemaError(
            f"{where}: cannot resolve the forward reference in {annotation!r} "
            f"({type(exc).__name__}: {exc}); a quoted type must be importable from the "
            "function's module"
        ) from None


def _strip_none(tp: Any) -> tuple[Any, bool]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if (origin is typing.Union or origin is types.UnionType) and _NONE_TYPE in args:
        rest = tuple(a for a in args if a is not _NONE_TYPE)
        return (rest[0] if len(rest) == 1 else typing.Union[rest]), True  # noqa: UP007
    return tp, False


def injection_for(parameter: str, annotation: Any) -> Injection | None:
    """The :class:`Injection` for a parameter annotated ``Injected[...]``, else None."""
    marker, inner, optional = _split_marker(annotation)
    if marker is None:
        return None
    # context, conversation and model import this module
    from .context import RunConfig, RunContext
    from .conversation import Conversation

    origin = typing.get_origin(inner)
    base = origin if isinstance(origin, type) else inner
    by_type: tuple[tuple[type, Source], ...] = (
        (RunContext, "context"),
        (RunConfig, "config"),
        (CancellationToken, "cancellation"),
        (EventSink, "events"),
        (StoreRegistry, "stores"),
        (Conversation, "conversation"),
    )
    if isinstance(base, type):
        if marker.store is not None or _is_store_type(base):
            if not _is_store_type(base):
                raise SchemaError(
                    f"parameter {parameter!r}: Inject(store=...) needs a Store annotation, "
                    f"got {_type_name(inner)}"
                )
            return Injection(
                parameter,
                "store",
                inner,
                store=marker.store or parameter,
                optional=optional,
                # a StoreRegistry only holds Stores: the (slow) protocol check is needless
                check=None if inner is Store else _instance_check(inner),
            )
        for kind, source in by_type:
            if issubclass(base, kind):
                check = None
                if source == "context" and typing.get_args(inner):
                    check = _instance_check(typing.get_args(inner)[0])
                return Injection(parameter, source, inner, optional=optional, check=check)
    if marker.store is not None:
        raise SchemaError(f"parameter {parameter!r}: Inject(store=...) needs a Store annotation")
    return Injection(parameter, "data", inner, optional=optional, check=_instance_check(inner))


# ---------------------------------------------------------------------------------------
# @tool


def _is_async_callable(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def _as_parts(value: Any) -> tuple[Part, ...] | None:
    """A tool's return value as content parts: a part, or a non-empty list/tuple of parts."""
    if isinstance(value, PART_TYPES):
        return (value,)
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(item, PART_TYPES) for item in value)
    ):
        return tuple(value)
    return None


def _result_text(value: Any) -> str:
    return json.dumps(to_json_value(value, fallback=str), ensure_ascii=False)


@frozen(repr=False)
class FunctionTool(Tool):
    """A tool built by :func:`tool` from a function.

    ``invoke`` validates the model's arguments against the signature (a bad argument
    raises :class:`ToolArgumentError`, which the loop turns into an error result the model
    can read), fills the injected parameters from the context, runs the function (a plain
    function in a worker thread unless ``in_thread=False``) and turns a result that is not
    a string or a ToolResult into JSON text. Calling the tool object calls the function.
    """

    handler: ToolHandler | None = field(init=False, default=None, eq=False, repr=False)
    fn: Callable[..., Any] = field(kw_only=True, eq=False)
    arguments: ArgumentsSchema = field(kw_only=True, eq=False)
    injections: tuple[Injection, ...] = field(kw_only=True, default=())
    positional_only: tuple[tuple[str, Any], ...] = field(kw_only=True, default=(), eq=False)
    is_async: bool = field(kw_only=True, default=True)
    in_thread: bool = field(kw_only=True, default=True)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "handler", self.invoke)
        super().__attrs_post_init__()

    def __repr__(self) -> str:
        fn = self.fn
        where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"
        return f"<tool {self.name!r} from {where}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Raise :class:`ToolArgumentError` unless the signature accepts ``arguments``."""
        self.arguments.validate(arguments, tool=self.name)

    def check_context(self, ctx: RunContext[Any]) -> None:
        for injection in self.injections:
            problem = injection.problem(ctx)
            if problem is not None:
                raise InjectionError(
                    f"tool {self.name!r}: parameter {injection.parameter!r} "
                    f"(Injected[{_type_name(injection.annotation)}]) {problem}",
                    tool=self.name,
                    parameter=injection.parameter,
                )

    async def invoke(self, arguments: Mapping[str, Any], ctx: RunContext[Any]) -> ToolOutput:
        values = self.arguments.validate(arguments, tool=self.name)
        for injection in self.injections:
            value = injection.fetch(ctx)
            if value is _UNAVAILABLE:
                # the message names the missing value, never the parameter: it reaches the model
                raise InjectionError(
                    f"tool {self.name!r} cannot run in this context: it {injection.problem(ctx)}",
                    tool=self.name,
                )
            values[injection.parameter] = value
        positional = self.positional_only
        args = [values.pop(name, default) for name, default in positional] if positional else ()
        fn = self.fn
        if self.is_async:
            result = await fn(*args, **values)
        else:
            if self.in_thread:
                result = await anyio.to_thread.run_sync(functools.partial(fn, *args, **values))
            else:
                result = fn(*args, **values)
            if inspect.isawaitable(result):  # a plain function that returned a coroutine
                result = await result
        if isinstance(result, (str, ToolResult)):
            return result
        parts = _as_parts(result)
        if parts is not None:
            return parts
        return _result_text(result)


def _function_tool(
    fn: Callable[..., Any], name: str | None, description: str | None, in_thread: bool
) -> FunctionTool:
    if not callable(fn):
        raise TypeError(f"@tool needs a function, got {type(fn).__name__}")
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(f"@tool cannot wrap the generator function {fn!r}; return a value")
    target = fn.func if isinstance(fn, functools.partial) else fn
    if name is None:
        name = getattr(target, "__name__", None)
        if not isinstance(name, str) or name == "<lambda>":
            raise TypeError(f"@tool cannot name {fn!r}; pass @tool(name=...)")
    try:
        signature = inspect.signature(fn, eval_str=True)
    except (NameError, SyntaxError) as exc:
        raise SchemaError(
            f"tool {name!r}: cannot resolve its type hints ({exc}); types used in a tool's "
            "signature must be importable from the function's module"
        ) from exc
    doc = parse_docstring(getattr(target, "__doc__", None) if callable(target) else None)
    params: list[Param] = []
    injections: list[Injection] = []
    positional: list[tuple[str, Any]] = []
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise SchemaError(
                f"tool {name!r}: parameter {p.name!r}: *args and **kwargs cannot be described "
                "to a model; name every parameter"
            )
        annotation = Any if p.annotation is p.empty else p.annotation
        annotation = _resolve_hint(annotation, fn, f"tool {name!r}: parameter {p.name!r}")
        try:
            injection = injection_for(p.name, annotation)
        except SchemaError as exc:
            raise SchemaError(f"tool {name!r}: {exc}") from None
        if p.kind is p.POSITIONAL_ONLY:
            positional.append((p.name, p.default))
        if injection is not None:
            injections.append(injection)
        else:
            params.append(Param(p.name, annotation, p.default, doc.params.get(p.name)))
    arguments = ArgumentsSchema(name, params)
    return FunctionTool(
        name,
        doc.description if description is None else description,
        arguments.schema,
        fn=fn,
        arguments=arguments,
        injections=tuple(injections),
        positional_only=tuple(positional),
        is_async=_is_async_callable(fn),
        in_thread=in_thread,
    )


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None, in_thread: bool = True
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = True,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a function into a :class:`FunctionTool`: ``@tool`` or ``@tool(name=...)``.

    The name defaults to the function's, the description to its docstring's main text;
    each parameter's description comes from ``Annotated[T, "..."]`` or the docstring's
    ``Args:`` section (Google, NumPy and Sphinx styles). The JSON Schema (draft 2020-12)
    follows the type hints; parameters without a default are required. ``Injected[...]``
    parameters are filled at call time and never shown to the model.

    A plain (sync) function runs in a worker thread (``anyio.to_thread.run_sync``) so it
    cannot block the event loop; ``in_thread=False`` runs it inline, for functions too
    cheap to be worth a thread hop. A worker thread is not cancelled mid-call: the run
    waits for it. Errors about the signature (an unsupported type, ``*args``) are raised
    here, when the tool is defined.
    """
    if isinstance(fn, str):
        raise TypeError(f"@tool({fn!r}): pass the name as a keyword, @tool(name={fn!r})")

    def build(f: Callable[..., Any]) -> FunctionTool:
        return _function_tool(f, name, description, in_thread)

    return build(fn) if fn is not None else build

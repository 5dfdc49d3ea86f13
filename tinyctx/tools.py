"""Tools the model can call, and the request-scoped registry a run resolves them from.

The kernel's :class:`Tool` is the plain form: a name, a description, a JSON Schema and an
``async handler(arguments, ctx)`` returning a string or a :class:`ToolResult`. What the
model sees is only the :class:`ToolSpec`; runtime values never reach it.

:func:`tool` builds a :class:`FunctionTool` from a function's signature and docstring.
Parameters typed ``Injected[T]`` (the run context, the app's ``data``, a named store, the
cancellation token, the event sink, ...) are filled from the context at call time and are
never part of the schema; a registry bound to a context refuses a tool whose injections
the context cannot satisfy, at registration.

The plain tool and the registry live in :mod:`tinyctx.tool_types`, injection in
:mod:`tinyctx.injection`; this module re-exports both.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

import anyio.to_thread
from attrs import field, frozen

from .docstrings import parse_docstring
from .injection import (
    UNAVAILABLE,
    Inject,
    Injected,
    Injection,
    InjectionError,
    Source,
    injection_for,
    resolve_hint,
    type_name,
)
from .messages import ToolResult
from .parts import PART_TYPES, Part
from .schema import (
    ArgumentsSchema,
    Param,
    SchemaError,
    ToolArgumentError,
    to_json_value,
)
from .tool_types import ServerTool, Tool, ToolHandler, ToolOutput, ToolRegistry, ToolSpec

if TYPE_CHECKING:
    from .context import RunContext

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
    "Source",
]


T = TypeVar("T")


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

    Args:
        name: The tool's name, as the model calls it.
        description: What the tool does, for the model.
        parameters: The JSON Schema of its arguments (from the signature).
        fn: The function.
        arguments: The compiled check of the function's arguments.
        injections: The parameters filled from the context.
        positional_only: Positional-only parameters and their defaults.
        is_async: Whether ``fn`` is a coroutine function.
        in_thread: Run a plain function in a worker thread.
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
                    f"(Injected[{type_name(injection.annotation)}]) {problem}",
                    tool=self.name,
                    parameter=injection.parameter,
                )

    async def invoke(self, arguments: Mapping[str, Any], ctx: RunContext[Any]) -> ToolOutput:
        values = self.arguments.validate(arguments, tool=self.name)
        for injection in self.injections:
            value = injection.fetch(ctx)
            if value is UNAVAILABLE:
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
        annotation = resolve_hint(annotation, fn, f"tool {name!r}: parameter {p.name!r}")
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

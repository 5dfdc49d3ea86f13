"""Runtime injection: parameters typed ``Injected[T]`` filled from the run context at
call time, never part of the schema."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from attrs import field, frozen

from .cancel import CancellationToken
from .context import RunConfig, RunContext
from .conversation import Conversation
from .errors import TinyCtxError
from .events import EventSink
from .schema import (
    RuntimeMarker,
    SchemaError,
    is_typeddict,
)
from .store_protocols import Store, StoreRegistry

if TYPE_CHECKING:
    pass

__all__ = ["Inject", "Injected", "Injection", "InjectionError", "injection_for"]


T = TypeVar("T")


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


def type_name(tp: Any) -> str:
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


UNAVAILABLE: Any = object()


@frozen
class Injection:
    """One injected parameter: where its value comes from and how it is checked.

    Args:
        parameter: The parameter's name.
        source: Where its value comes from (the context, its config, a store, the data...).
        annotation: The parameter's type.
        store: The store's name when ``source`` is ``"store"``.
        optional: Whether None is given when the value is missing.
        check: Whether a value fits ``annotation``, or None when anything does.
    """

    parameter: str
    source: Source
    annotation: Any = field(eq=False)
    store: str | None = None
    optional: bool = False
    check: Callable[[object], bool] | None = field(default=None, eq=False, repr=False)

    def fetch(self, ctx: RunContext[Any]) -> Any:
        """The value from ``ctx``, or ``UNAVAILABLE`` (then :meth:`problem` says why)."""
        source = self.source
        if source == "store":
            store = ctx.stores.get(self.store) if self.store is not None else None
            if store is None:
                return None if self.optional else UNAVAILABLE
            if self.check is not None and not self.check(store):
                return UNAVAILABLE
            return store
        if source == "data" or source == "context":
            check = self.check
            if check is not None:
                data = ctx.data
                if not (data is None and self.optional) and not check(data):
                    return UNAVAILABLE
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
        if self.fetch(ctx) is not UNAVAILABLE:
            return None
        if self.source == "store":
            name = self.store
            assert name is not None
            if name not in ctx.stores:
                known = ", ".join(sorted(ctx.stores)) or "none"
                return f"needs the store {name!r}, but the context's stores are: {known}"
            return (
                f"needs the store {name!r} to be {type_name(self.annotation)}, "
                f"it is {type(ctx.stores[name]).__name__}"
            )
        data = ctx.data
        return (
            f"needs the app data as {type_name(self.annotation)}, but the "
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


def resolve_hint(annotation: Any, fn: Callable[..., Any], where: str) -> Any:
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
                    f"got {type_name(inner)}"
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

"""The onion: layers composed once around a core handler.

A layer is ``async def layer(request, ctx, call_next) -> response`` or a :class:`Layer`
subclass implementing ``wrap_model`` and/or ``wrap_tool``. Index 0 is outermost. The onion
is built once (when the agent is built); a layer without a hook adds no frame to that
onion, and each frame is one plain function call plus the layer's own coroutine.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, overload

from .config import function, one_of, text
from .errors import ConfigError
from .messages import ToolCall, ToolResult
from .model import ModelRequest, ModelResponse

if TYPE_CHECKING:
    from .checkpoint import Checkpoint, RunResult
    from .context import RunContext
    from .decisions import Decision
    from .ordering import Constraint

__all__ = [
    "Layer",
    "LayerLike",
    "ModelCall",
    "ToolCallHandler",
    "ModelLayerFn",
    "compose",
    "layer_name",
    "check_layer_names",
    "has_hook",
    "before_model",
    "after_model",
    "tool_layer",
    "LayerBus",
]

ModelCall: TypeAlias = Callable[[ModelRequest, "RunContext[Any]"], Awaitable[ModelResponse]]
ToolCallHandler: TypeAlias = Callable[[ToolCall, "RunContext[Any]"], Awaitable[ToolResult]]
ModelLayerFn: TypeAlias = Callable[
    [ModelRequest, "RunContext[Any]", ModelCall], Awaitable[ModelResponse]
]

Hook = Literal["model", "tool"]


class Layer:
    """Base for class layers. Override ``wrap_model``, ``wrap_tool`` or both.

    ``name`` defaults to the class name and must be unique within an agent; set it on the
    instance to stack two layers of one class. Per-session state belongs in
    ``ctx.state_for(self, factory)``, never on ``self``: an agent is shared by sessions.
    """

    name: str = ""
    constraints: tuple[Constraint, ...] = ()
    """Where this layer must sit relative to others (:mod:`tinyctx.ordering`); ``Agent``
    checks them when it is built."""
    ordering_neutral: bool = False
    """True for observers that change nothing (tracing, probes): others' rules ignore them."""
    idempotent: bool = False
    """True when applying the layer to its own output changes nothing more (the conformance
    kit checks it)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__
        else:
            _LAYER_NAME.check(cls.__dict__["name"], "name", cls.__name__)

    def __setattr__(self, key: str, value: Any) -> None:
        # ``name`` is the key the layer's state is stored under: checked for every layer
        if key == "name":
            _LAYER_NAME.check(value, "name", type(self).__name__)
        object.__setattr__(self, key, value)

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await call_next(request, ctx)

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        return await call_next(call, ctx)

    async def on_event(self, event: object, ctx: RunContext[Any]) -> None:
        """Receive an event from ``ctx.publish``. The default ignores it."""

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        """Called when a run starts or resumes, before its first model request, in layer
        order. Register request-scoped tools here (``ctx.tools.register``)."""

    async def on_resume(
        self, ctx: RunContext[Any], checkpoint: Checkpoint, decisions: Mapping[str, Decision]
    ) -> bool:
        """Called when ``Session.resume`` continues an interrupted run, in layer order, before
        anything of the run happens (before ``on_run_start``, before any tool runs), with the
        decisions given to ``resume`` (empty when none) and the run's context.

        Check the resume input here and keep what the run needs (``ctx.state_for``); raise
        (``ResumeError``) to refuse it: nothing runs and the session stays paused on the
        same checkpoint, so a hook must not change the conversation. Return True when this
        layer took the decisions; decisions no layer takes are refused. The default takes
        nothing."""
        return False

    async def on_run_end(
        self, ctx: RunContext[Any], result: RunResult | None, error: BaseException | None
    ) -> None:
        """Called when a run ends however it ends, in reverse layer order: ``result`` on a
        final answer or a stop, ``error`` on cancellation, an interrupt, a limit or a failure.
        Start background work here with ``ctx.spawn``; an error raised here propagates."""

    def on_checkpoint(self, checkpoint: Checkpoint, ctx: RunContext[Any]) -> Checkpoint:
        """Called in layer order when a run pauses: return what the checkpoint may keep.

        A checkpoint outlives the run (it is stored, sent to another worker), so a layer
        that hides data from the model redacts it here, e.g. fields its context-view policy
        excluded. Return ``checkpoint`` itself (the default) or ``checkpoint.evolve(...)``.
        """
        return checkpoint

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


_LAYER_NAME = text(allowed="a non-empty string (the key the layer's state is stored under)")
_LAYER_LIKE = function(allowed="a Layer instance or an async function")

LayerLike: TypeAlias = "Layer | ModelLayerFn"


def layer_name(layer: LayerLike) -> str:
    if isinstance(layer, Layer):
        return layer.name or type(layer).__name__
    return getattr(layer, "__name__", type(layer).__name__)


_HOOK_METHODS = {
    "model": "wrap_model",
    "tool": "wrap_tool",
    "event": "on_event",
    "run_start": "on_run_start",
    "run_end": "on_run_end",
    "resume": "on_resume",
    "checkpoint": "on_checkpoint",
}


def has_hook(
    layer: LayerLike,
    hook: Hook | Literal["event", "run_start", "run_end", "resume", "checkpoint"],
) -> bool:
    """Whether ``layer`` implements ``hook`` (an onion, published events, run lifecycle)."""
    if isinstance(layer, Layer):
        attr = _HOOK_METHODS[hook]
        return getattr(type(layer), attr) is not getattr(Layer, attr)
    return hook == "model" and callable(layer)


def check_layer_names(layers: Sequence[LayerLike]) -> None:
    """Raise ConfigError when two layers share a name or an entry is not a layer."""
    seen: dict[str, int] = {}
    for index, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            _LAYER_LIKE.check(layer, f"middleware[{index}]", "Agent")
            call = type(layer).__call__ if not inspect.isfunction(layer) else layer
            if not inspect.iscoroutinefunction(layer) and not inspect.iscoroutinefunction(call):
                raise ConfigError(
                    f"middleware[{index}]",
                    layer,
                    "an async function (request, ctx, call_next) or a Layer instance",
                    owner="Agent",
                )
        name = layer_name(layer)
        if name in seen:
            raise ConfigError(
                f"middleware[{index}].name",
                name,
                f"a name unique within the agent (middleware[{seen[name]}] is already named "
                f"{name!r}; set .name on one of them)",
                owner="Agent",
            )
        seen[name] = index


def _link(hook_fn: Callable[[Any, Any, Any], Awaitable[Any]], call_next: Any) -> Any:
    # returns the layer's coroutine instead of awaiting it: one frame per layer, not two
    def call(request: Any, ctx: Any) -> Awaitable[Any]:
        return hook_fn(request, ctx, call_next)

    return call


_HOOK = one_of(("model", "tool"), allowed="'model' or 'tool'")


@overload
def compose(
    layers: Iterable[LayerLike],
    handler: ModelCall,
    *,
    hook: Literal["model"] = "model",
    rule: Any = None,
) -> ModelCall: ...
@overload
def compose(
    layers: Iterable[LayerLike],
    handler: ToolCallHandler,
    *,
    hook: Literal["tool"],
    rule: None = None,
) -> ToolCallHandler: ...
def compose(
    layers: Iterable[LayerLike], handler: Any, *, hook: Hook = "model", rule: Any = None
) -> Any:
    """Build the onion once: ``layers[0]`` is outermost, ``handler`` is the core.

    Requests travel in list order and responses come back in reverse. A layer may call
    ``call_next`` zero, one or many times, with an evolved request or a derived context.
    ``rule`` (a :class:`~tinyctx.request_rules.RequestRule`, model onions only) checks
    the request each layer passes inward, naming the layer that made an invalid one.
    """
    _HOOK.check(hook, "hook", "compose")
    hooked = [layer for layer in layers if has_hook(layer, hook)]
    fn = handler
    if rule is not None and hooked:
        fn = rule.guard(fn, layer_name(hooked[-1]))
    for index in range(len(hooked) - 1, -1, -1):
        layer = hooked[index]
        bound: Any
        if isinstance(layer, Layer):
            bound = layer.wrap_model if hook == "model" else layer.wrap_tool
        else:
            bound = layer
        fn = _link(bound, fn)
        if rule is not None and index > 0:
            fn = rule.guard(fn, layer_name(hooked[index - 1]))
    return fn


# ---------------------------------------------------------------------------------------
# sugar for one-sided layers

RequestHook = Callable[[ModelRequest, "RunContext[Any]"], Awaitable[ModelRequest | None]]
ResponseHook = Callable[
    [ModelResponse, ModelRequest, "RunContext[Any]"], Awaitable[ModelResponse | None]
]
ToolLayerFn = Callable[[ToolCall, "RunContext[Any]", ToolCallHandler], Awaitable[ToolResult]]


class _BeforeModel(Layer):
    def __init__(self, fn: RequestHook, name: str) -> None:
        self._fn = fn
        self.name = name

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        changed = await self._fn(request, ctx)
        return await call_next(request if changed is None else changed, ctx)


class _AfterModel(Layer):
    def __init__(self, fn: ResponseHook, name: str) -> None:
        self._fn = fn
        self.name = name

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        changed = await self._fn(response, request, ctx)
        return response if changed is None else changed


class _ToolLayer(Layer):
    def __init__(self, fn: ToolLayerFn, name: str) -> None:
        self._fn = fn
        self.name = name

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        return await self._fn(call, ctx, call_next)


def _require_async(fn: Callable[..., Any], what: str) -> None:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@{what} needs an async function, got {fn!r}")


def before_model(fn: RequestHook) -> Layer:
    """``async def f(request, ctx) -> ModelRequest | None``: rewrite the request (None keeps it)."""
    _require_async(fn, "before_model")
    return _BeforeModel(fn, getattr(fn, "__name__", "before_model"))


def after_model(fn: ResponseHook) -> Layer:
    """``async def f(response, request, ctx) -> ModelResponse | None``: inspect or replace it."""
    _require_async(fn, "after_model")
    return _AfterModel(fn, getattr(fn, "__name__", "after_model"))


def tool_layer(fn: ToolLayerFn) -> Layer:
    """``async def f(call, ctx, call_next) -> ToolResult``: a function layer on the tool onion."""
    _require_async(fn, "tool_layer")
    return _ToolLayer(fn, getattr(fn, "__name__", "tool_layer"))


# ---------------------------------------------------------------------------------------
# publish / subscribe between layers


class LayerBus:
    """Delivers ``ctx.publish`` events to the agent's layers, by name or broadcast."""

    __slots__ = ("_by_name", "_handlers")

    def __init__(self, layers: Sequence[LayerLike]) -> None:
        self._by_name: dict[str, list[Layer]] = {}
        self._handlers: list[Layer] = []
        for layer in layers:
            if isinstance(layer, Layer):
                self._by_name.setdefault(layer_name(layer), []).append(layer)
                if has_hook(layer, "event"):
                    self._handlers.append(layer)

    async def publish(
        self, event: object, ctx: RunContext[Any], *, target: str | None = None
    ) -> None:
        if target is None:
            for layer in self._handlers:
                await layer.on_event(event, ctx)
            return
        matches = self._by_name.get(target, [])
        if not matches:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise ValueError(f"publish: no layer named {target!r} (layers: {known})")
        if len(matches) > 1:
            raise ValueError(f"publish: target {target!r} is ambiguous ({len(matches)} layers)")
        layer = matches[0]
        if not has_hook(layer, "event"):
            raise ValueError(f"publish: layer {target!r} does not implement on_event")
        await layer.on_event(event, ctx)

"""What a Session runs: an agent's model, tools and middleware, both onions composed.

:class:`~tinyctx.agent.Agent` adds what opens a session of its own (``run``,
``run_sync``, ``evolve``); a Session takes any :class:`AgentCore`, so it needs nothing of
the module that defines them (that module imports the session).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from typing import Any

from attrs import field, frozen

from .chain import (
    Layer,
    LayerBus,
    LayerLike,
    ModelCall,
    ToolCallHandler,
    check_layer_names,
    compose,
    has_hook,
)
from .context import RunContext
from .frozen import EMPTY, FrozenDict, frozen_mapping
from .model import ModelHandler, ModelRequest, ModelResponse
from .ordering import check_ordering
from .request_rules import RequestRule, supports_prefill
from .tool_handler import run_tool_or_raise
from .tools import ServerTool, Tool, ToolRegistry

__all__ = ["AgentCore"]


def _tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(value)


def _model_handler(model: ModelHandler | str) -> ModelHandler:
    if isinstance(model, str):
        from .models_by_name import resolve_model

        return resolve_model(model)
    return model


@frozen(eq=False)
class AgentCore:
    """A model, its tools and its middleware, both onions composed once: what a
    :class:`~tinyctx.session.Session` runs. :class:`~tinyctx.agent.Agent` is the one
    to construct (its docstring says what each field means)."""

    model: ModelHandler = field(converter=_model_handler)
    tools: tuple[Tool, ...] = field(default=(), converter=_tuple)
    middleware: tuple[LayerLike, ...] = field(default=(), converter=_tuple)
    system_prompt: str | None = None
    model_name: str | None = None
    settings: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)
    server_tools: tuple[ServerTool, ...] = field(default=(), converter=_tuple)
    name: str = "agent"
    check_requests: bool = field(default=True, kw_only=True)
    """Refuse a request a layer emptied or left ending in an assistant message the model
    cannot continue (:mod:`tinyctx.request_rules`); False sends whatever the layers make."""
    run_start_hooks: tuple[Layer, ...] = field(init=False, repr=False)
    run_end_hooks: tuple[Layer, ...] = field(init=False, repr=False)
    resume_hooks: tuple[Layer, ...] = field(init=False, repr=False)
    checkpoint_hooks: tuple[Layer, ...] = field(init=False, repr=False)
    model_onion: ModelCall = field(init=False, repr=False)
    request_rule: RequestRule = field(init=False, repr=False)
    tool_onion: ToolCallHandler = field(init=False, repr=False)
    bus: LayerBus = field(init=False, repr=False)
    registry: ToolRegistry = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.model_name is None:
            from .models_by_name import name_of

            object.__setattr__(self, "model_name", name_of(self.model))
        if not callable(self.model):
            raise TypeError("Agent.model must be an async callable (request, ctx) -> ModelResponse")
        check_layer_names(self.middleware)
        check_ordering(self.middleware)
        object.__setattr__(self, "registry", ToolRegistry(self.tools, self.server_tools))
        rule = RequestRule(supports_prefill(self.model))
        object.__setattr__(self, "request_rule", rule)
        object.__setattr__(
            self,
            "model_onion",
            compose(
                self.middleware,
                _committed_first(self.model),
                rule=rule if self.check_requests else None,
            ),
        )
        object.__setattr__(
            self, "tool_onion", compose(self.middleware, run_tool_or_raise, hook="tool")
        )
        object.__setattr__(self, "bus", LayerBus(self.middleware))
        layers = [m for m in self.middleware if isinstance(m, Layer)]
        starts = tuple(m for m in layers if has_hook(m, "run_start"))
        ends = tuple(m for m in reversed(layers) if has_hook(m, "run_end"))
        object.__setattr__(self, "run_start_hooks", starts)
        object.__setattr__(self, "run_end_hooks", ends)
        resumes = tuple(m for m in layers if has_hook(m, "resume"))
        object.__setattr__(self, "resume_hooks", resumes)
        hooks = tuple(m for m in layers if has_hook(m, "checkpoint"))
        object.__setattr__(self, "checkpoint_hooks", hooks)


def _committed_first(model: ModelHandler) -> ModelHandler:
    """The onion's core: what the conversation committed on the way in (a persistent
    compaction, a relief) is made durable (:meth:`RunContext.commit`), then the model is
    called; a store that cannot take the write fails the call before the model runs."""

    async def commit_then_call(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        assert ctx.commit_source is not None
        await ctx.commit_source(ctx)
        return await model(request, ctx)

    def call_model(
        request: ModelRequest, ctx: RunContext[Any]
    ) -> Coroutine[Any, Any, ModelResponse]:
        # nothing to commit (no store): the model's own awaitable, no frame around it
        if ctx.commit_source is None:
            return model(request, ctx)
        return commit_then_call(request, ctx)

    return call_model

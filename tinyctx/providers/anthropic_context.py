"""Anthropic's server-side context editing (``clear_tool_uses_20250919``) as a layer.

``AnthropicContextEditing(trigger_tokens=100_000, keep_tool_uses=3)`` in the middleware of
an agent whose model is an :class:`~tinyctx.providers.anthropic.AnthropicModel` asks the
API to clear old tool results from what the model reads, once the prompt passes
``trigger_tokens``: each wrapped call carries the ``context_management`` edit and the
``context-management-2025-06-27`` beta header (through the adapter's ``extra_body`` and
``extra_headers`` settings, merged with the request's: give other betas in
``Agent.settings``, since an adapter-level ``anthropic-beta`` header is replaced). The
thread itself is unchanged (the server edits its copy on every call), so a fallback to
another provider still has every result.

What the server cleared comes back with the response; the layer reports it as an event
(:class:`ProviderContextEdited`, kind ``compaction.provider_edit``: tool uses cleared,
input tokens freed), which the OTel exporter records on the call's chat span. A budget
guard measures the full thread: give it a trigger above ``trigger_tokens``, so it acts
only where the provider's clearing would not be enough.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

from attrs import frozen

from ..chain import Layer, ModelCall
from ..context import RunContext
from ..errors import ConfigError
from ..events import Event, EventLevel
from ..model import ModelRequest, ModelResponse

__all__ = ["AnthropicContextEditing", "ProviderContextEdited", "CONTEXT_MANAGEMENT_BETA"]

CONTEXT_MANAGEMENT_BETA: Final = "context-management-2025-06-27"
CLEAR_TOOL_USES: Final = "clear_tool_uses_20250919"
_OWNER: Final = "AnthropicContextEditing"


@frozen
class ProviderContextEdited(Event):
    """The provider edited what the model read of this call (the thread is unchanged)."""

    kind: ClassVar[str] = "compaction.provider_edit"
    level: ClassVar[EventLevel] = "info"
    provider: str = "anthropic"
    layer: str = _OWNER
    edit: str = ""
    cleared_tool_uses: int = 0
    freed_tokens: int = 0

    def describe(self) -> str:
        return (
            f"{self.kind}({self.provider} {self.edit}: {self.cleared_tool_uses} tool uses, "
            f"freed={self.freed_tokens})"
        )


def _positive(value: object, field: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(field, value, f"an integer >= {minimum}", owner=_OWNER)
    return value


def _applied(raw: object) -> list[Mapping[str, Any]]:
    """The applied edits a response reports (its ``context_management``), as plain dicts."""
    management = getattr(raw, "context_management", None)
    if management is None:
        extra = getattr(raw, "model_extra", None) or {}
        management = extra.get("context_management")
    to_dict = getattr(management, "to_dict", None)
    if callable(to_dict):
        management = to_dict()
    edits = management.get("applied_edits") if isinstance(management, Mapping) else None
    return [edit for edit in edits or () if isinstance(edit, Mapping)]


class AnthropicContextEditing(Layer):
    """Turns on Anthropic's server-side clearing of old tool results for the calls it
    wraps (see the module docstring)."""

    def __init__(
        self,
        *,
        trigger_tokens: int = 100_000,
        keep_tool_uses: int = 3,
        clear_at_least: int | None = None,
        exclude_tools: Iterable[str] = (),
        clear_tool_inputs: bool = False,
    ) -> None:
        edit: dict[str, Any] = {
            "type": CLEAR_TOOL_USES,
            "trigger": {
                "type": "input_tokens",
                "value": _positive(trigger_tokens, "trigger_tokens"),
            },
            "keep": {
                "type": "tool_uses",
                "value": _positive(keep_tool_uses, "keep_tool_uses", minimum=0),
            },
        }
        if clear_at_least is not None:
            edit["clear_at_least"] = {
                "type": "input_tokens",
                "value": _positive(clear_at_least, "clear_at_least"),
            }
        excluded = [exclude_tools] if isinstance(exclude_tools, str) else list(exclude_tools)
        if not all(isinstance(name, str) and name for name in excluded):
            raise ConfigError("exclude_tools", exclude_tools, "tool names (strings)", owner=_OWNER)
        if excluded:
            edit["exclude_tools"] = excluded
        if not isinstance(clear_tool_inputs, bool):
            raise ConfigError("clear_tool_inputs", clear_tool_inputs, "True or False", owner=_OWNER)
        if clear_tool_inputs:
            edit["clear_tool_inputs"] = True
        self.edit = edit

    def settings_for(self, request: ModelRequest) -> dict[str, Any]:
        """``request.settings`` with the edit in ``extra_body`` and the beta header added."""
        settings = dict(request.settings)
        body = dict(settings.get("extra_body") or {})
        management = dict(body.get("context_management") or {})
        management["edits"] = [*(management.get("edits") or ()), self.edit]
        body["context_management"] = management
        headers = dict(settings.get("extra_headers") or {})
        betas = [b for b in str(headers.get("anthropic-beta", "")).split(",") if b.strip()]
        if CONTEXT_MANAGEMENT_BETA not in betas:
            betas.append(CONTEXT_MANAGEMENT_BETA)
        headers["anthropic-beta"] = ",".join(betas)
        settings["extra_body"] = body
        settings["extra_headers"] = headers
        return settings

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request.evolve(settings=self.settings_for(request)), ctx)
        for edit in _applied(response.raw):
            cleared = edit.get("cleared_tool_uses")
            freed = edit.get("cleared_input_tokens")
            ctx.emit(
                ProviderContextEdited,
                edit=str(edit.get("type", "")),
                cleared_tool_uses=cleared if isinstance(cleared, int) else 0,
                freed_tokens=freed if isinstance(freed, int) else 0,
            )
        return response

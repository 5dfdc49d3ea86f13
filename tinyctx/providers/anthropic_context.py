"""Anthropic's server-side context editing (``clear_tool_uses_20250919``) as a layer.

``AnthropicContextEditing(trigger_tokens=100_000, keep_tool_uses=3)`` in the middleware of
an agent whose model is an :class:`~tinyctx.providers.anthropic.AnthropicModel` asks the
API to clear old tool results from what the model reads, once the prompt passes
``trigger_tokens``: each wrapped call carries the ``context_management`` edit and the
``context-management-2025-06-27`` beta header (in ``request.metadata``, which only the
Anthropic adapter reads: it merges them into ``extra_body`` and the ``anthropic-beta``
header of the call, after the adapter's and the request's settings, so a fallback to
another provider sends neither). The thread itself is unchanged (the server edits its copy
on every call), so a fallback to another provider still has every result.

What the server cleared comes back with the response; the layer reports it as an event
(:class:`ProviderContextEdited`, kind ``compaction.provider_edit``: tool uses cleared,
input tokens freed), which the OTel exporter records on the call's chat span. The layer
sits outside the budget guard and declares its rule on the requests it passes in
(:mod:`tinyctx.providers.clearing`): the guard subtracts what the rule will clear from its
estimate, so it compacts only where the provider's clearing is not enough.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

from attrs import frozen

from ..chain import Layer, ModelCall
from ..config import each, flag, integer, text
from ..context import RunContext
from ..events import Event, EventLevel
from ..frozen import thaw
from ..model import ModelRequest, ModelResponse
from ..ordering import Outside
from .clearing import ClearToolUses, declare

__all__ = [
    "AnthropicContextEditing",
    "ProviderContextEdited",
    "CONTEXT_MANAGEMENT_BETA",
    "with_context_edit",
    "request_edit",
    "add_context_edits",
]

CONTEXT_MANAGEMENT_BETA: Final = "context-management-2025-06-27"
CLEAR_TOOL_USES: Final = "clear_tool_uses_20250919"
CONTEXT_EDITS: Final = "tinyctx.anthropic.context_edits"
"""The ``request.metadata`` key of the context edits an Anthropic call asks for."""
_OWNER: Final = "AnthropicContextEditing"
_TOOL_NAMES = each(text(), allowed="tool names (strings)")


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
    estimated: bool = False
    """A local estimate of the provider's documented rule (``tinyctx replay``)."""

    def describe(self) -> str:
        what = "estimate: " if self.estimated else ""
        return (
            f"{self.kind}({what}{self.provider} {self.edit}: {self.cleared_tool_uses} tool "
            f"uses, freed={self.freed_tokens})"
        )


def with_context_edit(
    params: Mapping[str, Any], edit: Mapping[str, Any], beta: str
) -> dict[str, Any]:
    """``params`` with ``edit`` appended to ``extra_body.context_management.edits`` and
    ``beta`` added to the ``anthropic-beta`` header (the caller's values kept)."""
    merged = dict(params)
    body = dict(merged.get("extra_body") or {})
    management = dict(body.get("context_management") or {})
    management["edits"] = [*(management.get("edits") or ()), thaw(edit)]
    body["context_management"] = management
    headers = dict(merged.get("extra_headers") or {})
    betas = [b for b in str(headers.get("anthropic-beta", "")).split(",") if b.strip()]
    if beta not in betas:
        betas.append(beta)
    headers["anthropic-beta"] = ",".join(betas)
    merged["extra_body"] = body
    merged["extra_headers"] = headers
    return merged


def request_edit(request: ModelRequest, edit: Mapping[str, Any], beta: str) -> ModelRequest:
    """``request`` asking an Anthropic model for the context edit ``edit`` (under beta
    ``beta``). It travels in ``request.metadata``, which only
    :class:`~tinyctx.providers.anthropic.AnthropicModel` reads: a fallback to another
    provider gets the request without it."""
    edits = request.metadata.get(CONTEXT_EDITS, ())
    return request.with_metadata({CONTEXT_EDITS: (*edits, (edit, beta))})


def add_context_edits(params: dict[str, Any], request: ModelRequest) -> None:
    """Merge the context edits ``request`` asks for into the ``messages.create`` keyword
    arguments ``params``, in place (the adapter's part of :func:`request_edit`)."""
    for edit, beta in request.metadata.get(CONTEXT_EDITS, ()):
        params.update(with_context_edit(params, edit, beta))


def _positive(value: object, field: str, *, minimum: int = 1) -> int:
    return integer(minimum=minimum).check(value, field, _OWNER)


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

    constraints = (Outside("BudgetGuard", reason="the guard reads the rule it declares"),)

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
        excluded = [exclude_tools] if isinstance(exclude_tools, str) else exclude_tools
        excluded = list(_TOOL_NAMES.check(excluded, "exclude_tools", _OWNER))
        if excluded:
            edit["exclude_tools"] = excluded
        flag().check(clear_tool_inputs, "clear_tool_inputs", _OWNER)
        if clear_tool_inputs:
            edit["clear_tool_inputs"] = True
        self.edit = edit
        self.rule = ClearToolUses(
            trigger=trigger_tokens,
            keep=keep_tool_uses,
            clear_at_least=clear_at_least,
            exclude_tools=frozenset(excluded),
            clear_tool_inputs=clear_tool_inputs,
        )

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        edited = request_edit(declare(request, self.rule), self.edit, CONTEXT_MANAGEMENT_BETA)
        response = await call_next(edited, ctx)
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

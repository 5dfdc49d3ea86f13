"""Requests that cannot be valid are refused at the kernel, naming the layer that made them.

The model onion of an :class:`~tinyctx.Agent` checks the request each layer passes inward:

- a request with no messages (every provider refuses one; a layer dropped everything);
- a request ending in an assistant message when the model does not support **prefill**
  (an assistant turn the model continues). A model handler declares it with a
  ``supports_prefill`` attribute: :class:`~tinyctx.providers.anthropic.AnthropicModel`
  does (Anthropic continues a trailing assistant message), the OpenAI and Gemini adapters
  do not; a handler without the attribute is taken to support it (a fake, a router).

Such a request raises :class:`InvalidModelRequest` naming the layer that passed it on,
before any inner layer or the model runs. A request the agent loop itself built that way
(a run without input on a thread whose last message is the model's answer) is left to
the model: only what a layer changed is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final

from .errors import TinyCtxError
from .messages import AssistantMessage
from .model import ModelRequest

__all__ = ["InvalidModelRequest", "RequestRule", "request_flaws", "supports_prefill"]

EMPTY: Final = "empty"
ENDS_WITH_ASSISTANT: Final = "ends_with_assistant"

_PROBLEMS: Final = {
    EMPTY: "the request has no messages (every provider refuses an empty request)",
    ENDS_WITH_ASSISTANT: (
        "the request ends with an assistant message and the model does not support prefill "
        "(supports_prefill is false): end it with a user message or a tool result"
    ),
}

# the flaws of the request the agent loop itself built for this model call (not a layer's)
_KERNEL_FLAWS: ContextVar[frozenset[str]] = ContextVar("tinyctx_kernel_flaws", default=frozenset())


class InvalidModelRequest(TinyCtxError, ValueError):
    """A layer passed on a model request no model can take; nothing inner ran.

    ``layer`` names the layer, ``problem`` is ``"empty"`` or ``"ends_with_assistant"``.
    """

    def __init__(self, layer: str, problem: str) -> None:
        self.layer = layer
        self.problem = problem
        super().__init__(
            f"layer {layer!r} passed on an invalid model request: {_PROBLEMS[problem]}"
        )


def supports_prefill(model: object) -> bool:
    """Whether ``model`` continues a trailing assistant message (``supports_prefill``,
    True when the handler does not say)."""
    return bool(getattr(model, "supports_prefill", True))


def request_flaws(request: ModelRequest, prefill: bool) -> frozenset[str]:
    """What makes ``request`` invalid for a model with or without prefill (empty: nothing)."""
    messages = request.messages
    if not messages:
        return frozenset((EMPTY,))
    if not prefill and type(messages[-1]) is AssistantMessage:
        return frozenset((ENDS_WITH_ASSISTANT,))
    return frozenset()


class RequestRule:
    """The check the model onion runs on each layer's outgoing request (see the module)."""

    __slots__ = ("prefill",)

    def __init__(self, prefill: bool) -> None:
        self.prefill = prefill

    def guard(
        self, call: Callable[[Any, Any], Awaitable[Any]], sender: str
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        """``call`` behind the check of what ``sender`` (a layer's name) passes it."""
        prefill = self.prefill

        def checked(request: Any, ctx: Any) -> Awaitable[Any]:
            messages = request.messages
            if not messages or (not prefill and type(messages[-1]) is AssistantMessage):
                new = request_flaws(request, prefill) - _KERNEL_FLAWS.get()
                if new:
                    raise InvalidModelRequest(sender, min(new))
            return call(request, ctx)

        return checked

    def kernel_request(self, request: ModelRequest) -> Callable[[], None]:
        """Note the flaws of the loop's own request for this call; returns the undo."""
        messages = request.messages
        if messages and (self.prefill or type(messages[-1]) is not AssistantMessage):
            flaws = _NO_FLAWS  # what request_flaws says of it, without building a set
        else:
            flaws = request_flaws(request, self.prefill)
        if not flaws:
            if _KERNEL_FLAWS.get():
                token = _KERNEL_FLAWS.set(frozenset())
                return lambda: _KERNEL_FLAWS.reset(token)
            return _nothing
        token = _KERNEL_FLAWS.set(flaws)
        return lambda: _KERNEL_FLAWS.reset(token)


_NO_FLAWS: frozenset[str] = frozenset()


def _nothing() -> None:
    return None

"""What flows through the model onion: ModelRequest in, ModelResponse out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
from attrs import field, frozen
from attrs.validators import instance_of, optional

from .control import Interrupt, StopWithFinal
from .frozen import EMPTY, FrozenDict, frozen_mapping
from .messages import AssistantMessage, Message, check_messages
from .tool_types import ServerTool, ToolSpec

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["ModelRequest", "ModelResponse", "Usage", "CallInfo", "ModelHandler"]


def _messages_tuple(value: Iterable[Message]) -> tuple[Message, ...]:
    messages = value if type(value) is tuple else tuple(value)
    check_messages(messages)
    return messages


def _tools_tuple(value: Iterable[ToolSpec]) -> tuple[ToolSpec, ...]:
    return value if type(value) is tuple else tuple(value)


def _server_tools_tuple(value: Iterable[ServerTool]) -> tuple[ServerTool, ...]:
    return value if type(value) is tuple else tuple(value)


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"Usage.{attribute.name} must be >= 0, got {value}")


@frozen
class Usage:
    """Tokens one model call used; ``context_window`` is the window the provider reported.

    ``input_tokens`` is the whole prompt, of which ``cached_tokens`` were read from the
    provider's cache; ``output_tokens`` is everything generated, of which
    ``reasoning_tokens`` were the model's reasoning (thinking) it did not show.
    """

    input_tokens: int = field(default=0, validator=_non_negative)
    output_tokens: int = field(default=0, validator=_non_negative)
    cached_tokens: int = field(default=0, validator=_non_negative)
    context_window: int | None = field(default=None, kw_only=True)
    reasoning_tokens: int = field(default=0, kw_only=True, validator=_non_negative)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_tokens + other.cached_tokens,
            context_window=other.context_window or self.context_window,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )

    def __sub__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            max(0, self.input_tokens - other.input_tokens),
            max(0, self.output_tokens - other.output_tokens),
            max(0, self.cached_tokens - other.cached_tokens),
            context_window=self.context_window,
            reasoning_tokens=max(0, self.reasoning_tokens - other.reasoning_tokens),
        )


@frozen
class ModelRequest:
    """One call to a model. Layers change it with :meth:`evolve`, never in place.

    ``system_prompt`` is kept apart from ``messages`` (providers send it separately);
    ``metadata`` carries values for layers and carriers, never sent as chat content.
    """

    messages: tuple[Message, ...] = field(converter=_messages_tuple)
    tools: tuple[ToolSpec, ...] = field(default=(), converter=_tools_tuple)
    system_prompt: str | None = field(default=None, validator=optional(instance_of(str)))
    model: str | None = None
    settings: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)
    metadata: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)
    server_tools: tuple[ServerTool, ...] = field(default=(), converter=_server_tools_tuple)

    def evolve(self, **changes: Any) -> ModelRequest:
        """A copy with ``changes`` applied; converters and validators run on what changed.

        Unchanged fields are already-validated immutable values, so changing one field
        costs the same for 10 messages as for 10,000 (``attrs.evolve`` would re-check every
        message of the history on every call).
        """
        if not changes:
            return self
        new = object.__new__(ModelRequest)
        for name in _REQUEST_FIELDS:
            if name in changes:
                value = changes.pop(name)
                convert = _REQUEST_CONVERTERS.get(name)
                if convert is not None:
                    value = convert(value)
            else:
                value = getattr(self, name)
            object.__setattr__(new, name, value)
        if changes:
            raise TypeError(f"ModelRequest.evolve() got unexpected fields: {sorted(changes)}")
        if new.system_prompt is not None and not isinstance(new.system_prompt, str):
            raise TypeError(
                f"system_prompt must be a str or None, got {type(new.system_prompt).__name__}"
            )
        return new

    def with_metadata(self, values: Mapping[str, Any]) -> ModelRequest:
        """A copy whose metadata adds (or overrides) ``values``."""
        return self.evolve(metadata=self.metadata | frozen_mapping(values))


_REQUEST_FIELDS = tuple(a.name for a in attrs.fields(ModelRequest))
_REQUEST_CONVERTERS: dict[str, Any] = {
    "messages": _messages_tuple,
    "tools": _tools_tuple,
    "settings": frozen_mapping,
    "metadata": frozen_mapping,
    "server_tools": _server_tools_tuple,
}


def _reasons(value: Iterable[str]) -> tuple[str, ...]:
    reasons = value if type(value) is tuple else tuple(value)
    for reason in reasons:
        if not isinstance(reason, str):
            raise TypeError(f"CallInfo.finish_reasons must hold str, got {type(reason).__name__}")
    return reasons


@frozen
class CallInfo:
    """What a provider adapter knows about one call, for tracing (the GenAI semantic
    conventions' attributes): who was asked (``provider``, ``server_address`` and
    ``server_port``), for what (``request_model``, ``temperature``, ``max_tokens``) and
    what came back (``response_id``, ``finish_reasons``, one per choice)."""

    provider: str | None = None
    request_model: str | None = None
    server_address: str | None = None
    server_port: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    response_id: str | None = None
    finish_reasons: tuple[str, ...] = field(default=(), converter=_reasons)

    def evolve(self, **changes: Any) -> CallInfo:
        return attrs.evolve(self, **changes)


@frozen
class ModelResponse:
    """The model's answer. ``control`` is an outcome a layer surfaced as a value;
    ``info`` is what the adapter knows about the call (see :class:`CallInfo`)."""

    message: AssistantMessage = field(validator=instance_of(AssistantMessage))
    usage: Usage | None = None
    control: StopWithFinal | Interrupt | None = None
    model: str | None = None
    raw: Any = field(default=None, eq=False, repr=False)
    info: CallInfo | None = field(default=None, kw_only=True, eq=False)

    def evolve(self, **changes: Any) -> ModelResponse:
        return attrs.evolve(self, **changes)

    @classmethod
    def from_control(cls, control: StopWithFinal | Interrupt) -> ModelResponse:
        """The answer of a model call that was not made because ``control`` ends the step.

        It carries only the outcome (an empty message, no usage): the loop appends nothing
        for it and applies the outcome (see :attr:`control_only`).
        """
        if not isinstance(control, (StopWithFinal, Interrupt)):
            raise TypeError(
                f"control must be StopWithFinal or Interrupt, got {type(control).__name__}"
            )
        return cls(AssistantMessage(""), control=control)

    @property
    def control_only(self) -> bool:
        """True for a response that is only a control outcome: no text, no tool calls.

        The loop does not append such a message, count it as a model call, or record
        usage for it; it only applies the outcome.
        """
        message = self.message
        return self.control is not None and not message.content and not message.tool_calls

    @property
    def text(self) -> str:
        return self.message.content


class ModelHandler(Protocol):
    """The core handler at the centre of the model onion."""

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any], /) -> ModelResponse: ...

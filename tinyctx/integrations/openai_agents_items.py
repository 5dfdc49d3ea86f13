"""OpenAI Agents SDK input items <-> tinyctx messages, both ways and lossless.

The SDK speaks Responses API items, which tinyctx's Responses adapter already reads and
writes (:mod:`tinyctx.providers._responses_items`): a run of output items (reasoning,
the assistant message, function calls, hosted tool calls) is one assistant message that
keeps its items in ``metadata["openai_responses"]``; a user, system or developer message
item is one message, a ``function_call_output`` one tool result.

On top of that, each input item keeps what it says beyond its message in
``metadata["openai_agents"]`` (its ``id``, ``status``, a ``developer`` role, the absence
of ``"type"`` in an easy input message, a content part list), written back while it still
says what the message says: ``to_agents_items(from_agents_items(items)) == items``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..formats._common import FormatError, core
from ..frozen import freeze, thaw
from ..messages import AssistantMessage, Message, ToolResult
from ..providers._responses_items import from_responses_input, to_responses_input

__all__ = ["OPENAI_AGENTS", "from_agents_items", "to_agents_items", "plain_item"]

OPENAI_AGENTS: Final = "openai_agents"
"""The metadata namespace of what an input item says beyond its message."""
_ITEM: Final = "item"
_INPUT_KINDS: Final = frozenset({"message", "function_call_output"})
_INPUT_ROLES: Final = frozenset({"user", "system", "developer"})


def plain_item(item: object, index: int = 0) -> dict[str, Any]:
    """An item as a plain dict (the SDK hands dicts, or pydantic models of the openai SDK)."""
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        dumped = dump(exclude_unset=True, mode="json")
        if isinstance(dumped, dict):
            return dumped
    raise FormatError(
        f"an item must be a dict or an openai model, got {type(item).__name__}",
        format=OPENAI_AGENTS,
        index=index,
    )


def _is_input(item: Mapping[str, Any]) -> bool:
    kind = item.get("type", "message")
    if kind == "function_call_output":
        return True
    return kind == "message" and item.get("role") in _INPUT_ROLES


def _reads(item: Mapping[str, Any], message: Message, names: Mapping[str, str]) -> bool:
    """Whether ``item`` alone says ``message`` (its content and role)."""
    try:
        if isinstance(message, ToolResult):
            call = {
                "type": "function_call",
                "call_id": message.tool_call_id,
                "name": names.get(message.tool_call_id) or message.name or "tool",
                "arguments": "{}",
            }
            read = from_responses_input([call, dict(item)])[1]
            return core(read).evolve(name=message.name) == core(message)
        (read,) = from_responses_input([dict(item)])
    except (FormatError, ValueError, TypeError):
        return False
    return core(read) == core(message)


def from_agents_items(items: Sequence[Any]) -> tuple[Message, ...]:
    """Agents SDK input items as tinyctx messages (a function call output that answers no
    earlier call is a :class:`FormatError` naming its index)."""
    plain = [plain_item(item, index) for index, item in enumerate(items)]
    messages = list(from_responses_input(plain))
    inputs = [item for item in plain if _is_input(item)]
    names: dict[str, str] = {}
    out: list[Message] = []
    position = 0
    for message in messages:
        if isinstance(message, AssistantMessage):
            names.update((c.id, c.name) for c in message.tool_calls)
            out.append(message)
            continue
        item = inputs[position]
        position += 1
        generated = to_responses_input([message])
        if isinstance(message, ToolResult):
            generated = generated[-1:]
        if generated == [item]:
            out.append(message)
            continue
        kept = dict(item)
        text_key = "output" if isinstance(message, ToolResult) else "content"
        if isinstance(kept.get(text_key), str) and kept[text_key] == message.text:
            del kept[text_key]  # the message holds it
        metadata = dict(message.metadata)
        metadata[OPENAI_AGENTS] = freeze({_ITEM: kept})
        out.append(message.evolve(metadata=metadata))
    return tuple(out)


def _input_item(message: Message, names: Mapping[str, str]) -> dict[str, Any]:
    own = message.metadata.get(OPENAI_AGENTS, None)
    kept = own.get(_ITEM) if isinstance(own, Mapping) else None
    generated = to_responses_input([message])[-1]
    if not isinstance(kept, Mapping):
        return generated
    item: dict[str, Any] = thaw(kept)
    text_key = "output" if isinstance(message, ToolResult) else "content"
    if text_key not in item:
        item[text_key] = generated[text_key]
    if _reads(item, message, names):
        return item
    item[text_key] = generated[text_key]  # a layer changed the content: the new one
    return item if _reads(item, message, names) else generated


def to_agents_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """tinyctx messages as Agents SDK input items (what the SDK sends the model; tinyctx's
    own metadata stays local)."""
    items: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        if isinstance(message, AssistantMessage):
            names.update((c.id, c.name) for c in message.tool_calls)
            items += to_responses_input([message])
        else:
            items.append(_input_item(message, names))
    return items

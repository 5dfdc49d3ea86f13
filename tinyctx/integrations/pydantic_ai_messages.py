"""pydantic-ai ``ModelMessage``s <-> tinyctx messages, both ways and lossless.

A ``ModelRequest`` is one tinyctx message per part: ``SystemPromptPart`` a system message,
``UserPromptPart`` a user message, ``ToolReturnPart`` a tool result (an outcome other than
``success`` is ``is_error``), a ``RetryPromptPart`` that answers a call a tool result with
``is_error`` (one that answers none a user message), any other request part a user
message. A ``ModelResponse`` is one assistant message: its text parts joined and its
``ToolCallPart``s as calls.

Each message keeps what it came from in ``metadata["pydantic_ai"]``: the part as
pydantic-ai dumps it (timestamps, ids, ``part_kind``, provider details; a text content is
not copied: the message holds it), the request's own fields on the request's first
part, and for a response the whole response (thinking, native tool parts, usage, model
name). Writing back uses what was kept while it still says what the message says, and
builds the part from the message otherwise, so ``to_pydantic_ai(from_pydantic_ai(m)) == m``
and a layer's edit (a cleared tool result, a summary) is written as a real part.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelResponse as PAResponse

from ..formats._common import (
    EXTENSION_KEY,
    FormatError,
    arguments_json,
    check_read_pairing,
    core,
    parse_arguments,
    restore_call_ids,
    unique_call_ids,
)
from ..frozen import freeze, thaw
from ..messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from ..model import Usage
from ._memo import ConversionMemo, copy_of

__all__ = ["PYDANTIC_AI", "from_pydantic_ai", "to_pydantic_ai", "usage_from_pydantic_ai"]

PYDANTIC_AI: Final = "pydantic_ai"
"""The metadata namespace of what a tinyctx message keeps of its pydantic-ai origin."""

_PART: Final = "part"
_REQUEST: Final = "request"
_RESPONSE: Final = "response"


def _text(content: object) -> str:
    """A part's content as text: a string itself, anything else as compact JSON."""
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _user_text(content: object) -> str:
    """A user prompt's text: its strings, and each media item named by its kind."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return _text(content)
    pieces = []
    for item in content:
        if isinstance(item, str):
            pieces.append(item)
        elif isinstance(item, Mapping):
            pieces.append(f"[{item.get('kind', 'content')}: {item.get('url') or ''}]".rstrip())
    return "\n".join(pieces)


def _read_part(part: Mapping[str, Any], index: int) -> Message:
    """The tinyctx message one request part says (no metadata)."""
    kind = part.get("part_kind")
    content = part.get("content")
    call_id = part.get("tool_call_id")
    name = part.get("tool_name") or ""
    if kind == "system-prompt":
        return SystemMessage(_text(content))
    if kind == "tool-return" and isinstance(call_id, str) and call_id:
        outcome = part.get("outcome")
        return ToolResult(call_id, _text(content), name, outcome not in (None, "success"))
    if kind == "retry-prompt" and isinstance(call_id, str) and call_id and name:
        return ToolResult(call_id, _text(content), name, True)
    if kind == "user-prompt":
        return UserMessage(_user_text(content))
    if content is None:
        raise FormatError(
            f"cannot read a {kind!r} request part without content", format=PYDANTIC_AI, index=index
        )
    return UserMessage(_text(content))


def _says(parts: Sequence[Mapping[str, Any]], index: int) -> AssistantMessage:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts:
        kind = part.get("part_kind")
        if kind == "text":
            texts.append(str(part.get("content") or ""))
        elif kind == "tool-call":
            arguments, invalid = parse_arguments(part.get("args") or "")
            calls.append(
                ToolCall(
                    str(part.get("tool_call_id")),
                    str(part.get("tool_name")),
                    arguments,
                    invalid_arguments=invalid,
                )
            )
    try:
        return AssistantMessage("".join(texts), calls)
    except (TypeError, ValueError) as exc:
        raise FormatError(str(exc), format=PYDANTIC_AI, index=index) from exc


def _kept(message: Message) -> Mapping[str, Any]:
    own = message.metadata.get(PYDANTIC_AI, None)
    return own if isinstance(own, Mapping) else {}


def _with_kept(message: Message, kept: dict[str, Any]) -> Message:
    metadata = dict(message.metadata)
    metadata[PYDANTIC_AI] = freeze(kept)
    return message.evolve(metadata=metadata)


def _pop_extension(raw: dict[str, Any]) -> dict[str, Any]:
    """Take tinyctx's own fields of each part (``metadata["tinyctx"]``) out of a dumped
    request or response: ``{position: {"essential"?, "metadata"?}}``."""
    metadata = raw.get("metadata")
    if not isinstance(metadata, dict) or EXTENSION_KEY not in metadata:
        return {}
    carried = metadata.pop(EXTENSION_KEY)
    if not metadata:
        raw["metadata"] = None
    return carried if isinstance(carried, dict) else {}


def _carry_in(message: Message, carried: object) -> Message:
    if not isinstance(carried, Mapping):
        return message
    changes: dict[str, Any] = {}
    if carried.get("essential") is False:
        changes["essential"] = False
    if isinstance(carried.get("metadata"), Mapping):
        changes["metadata"] = carried["metadata"]
    return message.evolve(**changes) if changes else message


def _carry_out(message: Message) -> dict[str, Any] | None:
    """What the message has that pydantic-ai has no field for, or None."""
    carried: dict[str, Any] = {}
    if not message.essential:
        carried["essential"] = False
    own = {k: v for k, v in message.metadata.items() if k != PYDANTIC_AI}
    if own:
        carried["metadata"] = thaw(own)
    return carried or None


def _put_extension(unit: dict[str, Any], position: int, carried: dict[str, Any] | None) -> None:
    if carried is None:
        return
    metadata = unit.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
    metadata.setdefault(EXTENSION_KEY, {})[str(position)] = carried
    unit["metadata"] = metadata


def _dump(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    dumped: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return dumped


_READ: ConversionMemo[tuple[Message, ...]] = ConversionMemo()
"""Each pydantic-ai message's reading (its parts' messages), while it lives and still
equals the copy taken when it was read."""

_WRITTEN: ConversionMemo[ModelMessage] = ConversionMemo()
"""The pydantic-ai message written for a tinyctx message (an assistant message, or the
first of a request's messages), with a copy of it and the messages it was made from: the
same object again while it equals its copy and is made from the same messages."""


def from_pydantic_ai(messages: Sequence[ModelMessage]) -> tuple[Message, ...]:
    """pydantic-ai messages as tinyctx messages (see the module docstring). A tool return
    that answers no earlier call is a :class:`FormatError` naming its index."""
    out: list[Message] = []
    origins: list[int] = []
    for index, message in enumerate(messages):
        known = _READ.get(message)
        if known is not None and known[0] == message:
            read = known[1]
        else:
            (raw,) = _dump([message])
            read = _read_message(raw, index)
            snapshot = copy_of(message)
            if snapshot is not None:
                _READ.put(message, snapshot, read)
        out += read
        origins += [index] * len(read)
    renamed = unique_call_ids(out)
    check_read_pairing(renamed, origins, fmt=PYDANTIC_AI)
    return tuple(renamed)


def _read_message(raw: dict[str, Any], index: int) -> tuple[Message, ...]:
    """The tinyctx messages one dumped pydantic-ai message says."""
    carried = _pop_extension(raw)
    if raw.get("kind") == "response":
        message: Message = _says(raw.get("parts") or [], index)
        message = _carry_in(message, carried.get("0"))
        return (_with_kept(message, {_RESPONSE: raw}),)
    header = {k: v for k, v in raw.items() if k != "parts"}
    out: list[Message] = []
    for position, part in enumerate(raw.get("parts") or []):
        message = _carry_in(_read_part(part, index), carried.get(str(position)))
        kept_part = dict(part)
        if isinstance(part.get("content"), str) and part["content"] == message.text:
            del kept_part["content"]  # the message holds it
        kept: dict[str, Any] = {_PART: kept_part}
        if position == 0:
            kept[_REQUEST] = header
        out.append(_with_kept(message, kept))
    return tuple(out)


def _part_of(message: Message, index: int) -> dict[str, Any]:
    kept = _kept(message).get(_PART)
    part: dict[str, Any] = thaw(kept) if isinstance(kept, Mapping) else {}
    if part and "content" in part:  # a non-text content, kept while it still says the text
        if _read_part(part, index) == core(message):
            return part
        del part["content"]
    if part and _read_part({**part, "content": message.text}, index) == core(message):
        return {**part, "content": message.text}
    if isinstance(message, SystemMessage):
        return {"part_kind": "system-prompt", "content": message.content}
    if isinstance(message, ToolResult):
        outcome = "failed" if message.is_error else "success"
        return {
            "part_kind": "tool-return",
            "tool_name": message.name or "tool",
            "tool_call_id": message.tool_call_id,
            "content": message.describe(),
            "outcome": outcome,
        }
    return {"part_kind": "user-prompt", "content": message.describe()}


def _response_of(message: AssistantMessage, index: int) -> dict[str, Any]:
    kept = _kept(message).get(_RESPONSE)
    response: dict[str, Any] = thaw(kept) if isinstance(kept, Mapping) else {"kind": "response"}
    parts = response.get("parts") or []
    if kept is not None and _says(parts, index) == core(message):
        return response
    others = [p for p in parts if p.get("part_kind") not in ("text", "tool-call")]
    new: list[dict[str, Any]] = [*others]
    if message.content:
        new.append({"part_kind": "text", "content": message.content})
    new += [
        {
            "part_kind": "tool-call",
            "tool_name": call.name,
            "tool_call_id": call.id,
            "args": arguments_json(call, fmt=PYDANTIC_AI, index=index),
        }
        for call in message.tool_calls
    ]
    response["parts"] = new
    return response


def to_pydantic_ai(messages: Sequence[Message]) -> list[ModelMessage]:
    """tinyctx messages as pydantic-ai messages: consecutive non-assistant messages are the
    parts of one ``ModelRequest`` (a new one starts where a message began one), each
    assistant message one ``ModelResponse``."""
    converted: list[ModelMessage] = []
    for index, group in _groups(restore_call_ids(messages)):
        known = _WRITTEN.get(group[0])
        if known is not None and _still(known[0], known[1], group):
            converted.append(known[1])
            continue
        (written,) = ModelMessagesTypeAdapter.validate_python([_unit_of(group, index)])
        copied = copy_of(written)
        if copied is not None:
            _WRITTEN.put(group[0], (group, copied), written)
        converted.append(written)
    return converted


def _still(
    kept: tuple[tuple[Message, ...], ModelMessage], written: ModelMessage, group: Sequence[Message]
) -> bool:
    """Whether ``written`` was made from exactly ``group`` and equals its copy then."""
    made_from, snapshot = kept
    return (
        len(made_from) == len(group)
        and all(a is b for a, b in zip(made_from, group, strict=True))
        and written == snapshot
    )


def _groups(messages: Sequence[Message]) -> list[tuple[int, tuple[Message, ...]]]:
    """``(index of the first, messages)`` of each pydantic-ai message to write: an
    assistant message alone, else the run of messages one request holds."""
    groups: list[tuple[int, list[Message]]] = []
    open_request = False
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            groups.append((index, [message]))
            open_request = False
        elif not open_request or isinstance(_kept(message).get(_REQUEST), Mapping):
            groups.append((index, [message]))
            open_request = True
        else:
            groups[-1][1].append(message)
    return [(index, tuple(group)) for index, group in groups]


def _unit_of(group: tuple[Message, ...], index: int) -> dict[str, Any]:
    """The dumped pydantic-ai message that says ``group`` (from :func:`_groups`)."""
    first = group[0]
    if isinstance(first, AssistantMessage):
        response = _response_of(first, index)
        _put_extension(response, 0, _carry_out(first))
        return response
    header = _kept(first).get(_REQUEST)
    request: dict[str, Any] = thaw(header) if isinstance(header, Mapping) else {"kind": "request"}
    request["parts"] = []
    for offset, message in enumerate(group):
        _put_extension(request, offset, _carry_out(message))
        request["parts"].append(_part_of(message, index + offset))
    return request


def usage_from_pydantic_ai(response: PAResponse) -> Usage:
    """A ``ModelResponse``'s usage as tinyctx :class:`~tinyctx.Usage`."""
    usage = response.usage
    return Usage(
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        reasoning_tokens=usage.output_reasoning_tokens,
    )

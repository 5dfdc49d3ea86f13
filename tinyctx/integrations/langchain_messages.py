"""LangChain messages <-> tinyctx messages, both ways and lossless.

One LangChain message is one tinyctx message: ``SystemMessage`` (and a ``ChatMessage`` of
role system), ``HumanMessage`` (and other chat roles), ``AIMessage`` with ``tool_calls``
and ``invalid_tool_calls``, ``ToolMessage`` (``status="error"`` is ``is_error``). Content
lists in the OpenAI shape (``text``, ``image_url``, ``file``) become tinyctx parts; other
content blocks (thinking, provider blocks, LangChain's standard blocks) are read as their
text and kept verbatim.

Everything a tinyctx message has no field for (``id``, ``name``, ``additional_kwargs``,
``response_metadata``, ``usage_metadata``, ``artifact``, a content list's exact blocks, a
chunk's type) is kept in ``metadata["langchain"]`` the way :mod:`tinyctx.formats` keeps a
foreign file's fields, and written back while it still says what the message says: so
``to_langchain(from_langchain(m)) == m``. What LangChain has no field for (tinyctx's
``metadata`` and ``essential``) rides in ``response_metadata["tinyctx"]``, which no
LangChain chat model sends to a provider: ``from_langchain(to_langchain(m)) == m``.

A ``FunctionMessage`` (the legacy function-calling message, with no call id) and a
``RemoveMessage`` have no tinyctx equivalent: they are a :class:`~tinyctx.formats.FormatError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from ..formats._common import (
    EXTENSION_KEY,
    CallNames,
    FormatError,
    check_read_pairing,
    core,
    emit_unit,
    expect_mapping,
    expect_str,
    finish_unit,
    read_extension,
    restore_call_ids,
    unique_call_ids,
    write_extension,
)
from ..formats._parts import openai_content, read_openai_part
from ..formats.openai import content_of
from ..frozen import thaw
from ..messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from ..model import Usage
from ..parts import Content
from ._memo import ConversionMemo

__all__ = [
    "LANGCHAIN",
    "from_langchain",
    "to_langchain",
    "from_langchain_message",
    "to_langchain_message",
    "usage_from_langchain",
]

LANGCHAIN: Final = "langchain"
"""The metadata namespace of the LangChain fields a tinyctx message keeps."""

_MODELED: Final = frozenset({"type", "content", "tool_calls", "invalid_tool_calls"})
_MODELED_TOOL: Final = frozenset({"tool_call_id", "name", "status"})
_TYPES: Final = {
    "system": "system",
    "SystemMessageChunk": "system",
    "human": "human",
    "HumanMessageChunk": "human",
    "ai": "ai",
    "AIMessageChunk": "ai",
    "tool": "tool",
    "ToolMessageChunk": "tool",
    "chat": "chat",
    "ChatMessageChunk": "chat",
}
_MEDIA_KINDS: Final = ("image_url", "file")
_AI_FIELDS: Final = ("tool_calls", "invalid_tool_calls", "usage_metadata")
_TOOL_FIELDS: Final = ("tool_call_id", "artifact", "status")
_ONLY: Final = {
    "system": (*_AI_FIELDS, *_TOOL_FIELDS),
    "human": (*_AI_FIELDS, *_TOOL_FIELDS),
    "chat": (*_AI_FIELDS, *_TOOL_FIELDS),
    "ai": _TOOL_FIELDS,
    "tool": _AI_FIELDS,
}


def _base(kind: str, content: Any) -> dict[str, Any]:
    return {
        "content": content,
        "additional_kwargs": {},
        "response_metadata": {},
        "type": kind,
        "name": None,
        "id": None,
    }


def _generate(message: Message, index: int) -> dict[str, Any]:
    """The LangChain fields (``message_to_dict``'s data) that say ``message``."""
    if isinstance(message, SystemMessage):
        return _base("system", message.content)
    if isinstance(message, UserMessage):
        return _base("human", openai_content(message.content, index=index, for_api=False))
    if isinstance(message, AssistantMessage):
        unit = _base("ai", message.content)
        unit["tool_calls"] = [
            {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
            for c in message.tool_calls
            if c.invalid_arguments is None
        ]
        unit["invalid_tool_calls"] = [
            {
                "name": c.name,
                "args": c.invalid_arguments,
                "id": c.id,
                "error": None,
                "type": "invalid_tool_call",
            }
            for c in message.tool_calls
            if c.invalid_arguments is not None
        ]
        unit["usage_metadata"] = None
        return _thawed(unit)
    if isinstance(message, ToolResult):
        unit = _base("tool", openai_content(message.content, index=index, for_api=False))
        unit["name"] = message.name or None
        unit["tool_call_id"] = message.tool_call_id
        unit["artifact"] = None
        unit["status"] = "error" if message.is_error else "success"
        return unit
    raise FormatError(f"cannot express a {type(message).__name__}", format=LANGCHAIN, index=index)


def _thawed(unit: dict[str, Any]) -> dict[str, Any]:
    return {k: thaw(v) for k, v in unit.items()}


def _block_text(content: object, index: int) -> str:
    """The text of a str-only field: a string, or the text blocks of a list joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FormatError(
            f"content must be a string or a list of blocks, got {type(content).__name__}",
            format=LANGCHAIN,
            index=index,
        )
    texts: list[str] = []
    for block in content:
        if isinstance(block, str):
            texts.append(block)
        elif isinstance(block, Mapping) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str):
                texts.append(text)
    return "".join(texts)


def _read_content(content: object, index: int) -> Content:
    """Content of a human or tool message: OpenAI-shaped parts as tinyctx parts, any
    other block list as its text (the blocks themselves are kept verbatim)."""
    try:
        return content_of(
            content,
            fmt=LANGCHAIN,
            index=index,
            joiner="\n",
            media=read_openai_part,
            media_kinds=_MEDIA_KINDS,
        )
    except FormatError:
        if not isinstance(content, list):
            raise
        return _block_text(content, index)


def _calls(unit: Mapping[str, Any], index: int) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    for key in ("tool_calls", "invalid_tool_calls"):
        raw_calls = unit.get(key) or []
        if not isinstance(raw_calls, list):
            raise FormatError(f"{key} must be a list", format=LANGCHAIN, index=index)
        for position, raw in enumerate(raw_calls):
            what = f"{key}[{position}]"
            call = expect_mapping(raw, what, fmt=LANGCHAIN, index=index)
            call_id = expect_str(call.get("id"), f"{what}.id", fmt=LANGCHAIN, index=index)
            name = expect_str(call.get("name"), f"{what}.name", fmt=LANGCHAIN, index=index)
            args = call.get("args")
            if key == "tool_calls":
                arguments = expect_mapping(args, f"{what}.args", fmt=LANGCHAIN, index=index)
                calls.append(ToolCall(call_id, name, arguments))
            else:
                raw_args = args if isinstance(args, str) else ""
                calls.append(ToolCall(call_id, name, {}, invalid_arguments=raw_args))
    return tuple(calls)


def _parse(unit: Mapping[str, Any], index: int) -> Message:
    """The tinyctx message LangChain fields say (no metadata)."""
    kind = _TYPES.get(str(unit.get("type")))
    if kind is None:
        allowed = ", ".join(sorted(set(_TYPES.values())))
        raise FormatError(
            f"cannot express a {unit.get('type')!r} message (allowed: {allowed})",
            format=LANGCHAIN,
            index=index,
        )
    content = unit.get("content")
    try:
        if kind == "chat":
            role = unit.get("role")
            if role == "system":
                return SystemMessage(_block_text(content, index))
            if role in ("assistant", "ai"):
                return AssistantMessage(_block_text(content, index))
            return UserMessage(_read_content(content, index))
        if kind == "system":
            return SystemMessage(_block_text(content, index))
        if kind == "human":
            return UserMessage(_read_content(content, index))
        if kind == "ai":
            return AssistantMessage(_block_text(content, index), _calls(unit, index))
        call_id = expect_str(unit.get("tool_call_id"), "tool_call_id", fmt=LANGCHAIN, index=index)
        name = unit.get("name") or ""
        return ToolResult(
            call_id, _read_content(content, index), str(name), unit.get("status") == "error"
        )
    except FormatError:
        raise
    except (TypeError, ValueError) as exc:
        raise FormatError(str(exc), format=LANGCHAIN, index=index) from exc


def _unit_of(message: BaseMessage, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The message's fields as a unit to read, and the dump they come from (a deep copy:
    the snapshot :data:`_READ` compares the message with later)."""
    if not isinstance(message, BaseMessage):
        raise FormatError(
            f"expected a LangChain message, got {type(message).__name__}",
            format=LANGCHAIN,
            index=index,
        )
    dumped = message_to_dict(message)
    data: dict[str, Any] = dumped["data"]
    unit = dict(data)
    unit["type"] = dumped["type"]
    return unit, data


def from_langchain_message(message: BaseMessage, index: int = 0) -> Message:
    """One LangChain message as a tinyctx message (see the module docstring); pairing is
    not checked (use :func:`from_langchain` for a history)."""
    return _read(message, index, CallNames())


_READ: ConversionMemo[Message] = ConversionMemo()
"""Each LangChain message's reading, while it lives and its fields are what they were
(``message.__dict__`` equals its dump then): a thread re-sent on every call costs only
what is new or edited. A message with extra (undeclared) fields is read every time."""

_WRITTEN: ConversionMemo[BaseMessage] = ConversionMemo()
"""Each tinyctx message's LangChain message, while both live and the LangChain one was
not edited (its ``__dict__`` equals its dump when made): the same object again, as
LangGraph hands the same state objects to every call."""


def _fields(message: BaseMessage) -> dict[str, Any] | None:
    """What a reading depends on, for the memo's check; None when it cannot be vouched
    for by ``__dict__`` alone (extra fields live elsewhere)."""
    if getattr(message, "__pydantic_extra__", None):
        return None
    return message.__dict__


def _read(message: BaseMessage, index: int, calls: CallNames) -> Message:
    fields = _fields(message) if isinstance(message, BaseMessage) else None
    if fields is not None:
        known = _READ.get(message)
        if known is not None and known[0] == fields:
            calls.add(known[1])
            return known[1]
    unit, data = _unit_of(message, index)
    response_metadata = unit.get("response_metadata")
    ext_raw: dict[str, Any] = {}
    if isinstance(response_metadata, Mapping) and EXTENSION_KEY in response_metadata:
        rest = dict(response_metadata)
        ext_raw[EXTENSION_KEY] = rest.pop(EXTENSION_KEY)
        unit["response_metadata"] = rest
    ext = read_extension(ext_raw, allowed=("essential", "metadata"), fmt=LANGCHAIN, index=index)
    parsed = _parse(unit, index)
    generated = _generate(parsed, index)
    read = finish_unit(parsed, unit, generated, ext, LANGCHAIN, calls, fmt=LANGCHAIN, index=index)
    if fields is not None:
        _READ.put(message, data, read)
    return read


def from_langchain(messages: Sequence[BaseMessage]) -> tuple[Message, ...]:
    """LangChain messages as tinyctx messages. A tool message that answers no earlier call
    is a :class:`FormatError` naming its index (calls left pending at the end are fine);
    a reused call id is renamed (the original kept, and written back)."""
    calls = CallNames()
    out = unique_call_ids([_read(m, i, calls) for i, m in enumerate(messages)])
    check_read_pairing(out, range(len(out)), fmt=LANGCHAIN)
    return tuple(out)


def to_langchain_message(message: Message, index: int = 0) -> BaseMessage:
    """One tinyctx message as a LangChain message (see the module docstring)."""
    known = _WRITTEN.get(message)
    if known is not None and _fields(known[1]) == known[0]:
        return known[1]
    converted = _written(message, index)
    if _fields(converted) is not None:
        _WRITTEN.put(message, message_to_dict(converted)["data"], converted)
    return converted


def _written(message: Message, index: int) -> BaseMessage:
    generated = _generate(message, index)
    plain = core(message)

    def reads_back(unit: dict[str, Any]) -> bool:
        try:
            return _parse(unit, index) == plain
        except FormatError:
            return False

    modeled = _MODELED | _MODELED_TOOL if isinstance(message, ToolResult) else _MODELED
    unit, rest = emit_unit(
        message, generated, LANGCHAIN, modeled=modeled, reads_back=reads_back, for_api=False
    )
    carried = write_extension({}, message, rest)
    if carried:
        response_metadata = dict(unit.get("response_metadata") or {})
        response_metadata[EXTENSION_KEY] = carried[EXTENSION_KEY]
        unit["response_metadata"] = response_metadata
    kind = unit["type"]
    for key in _ONLY.get(_TYPES.get(kind, kind), ()):
        unit.pop(key, None)  # a kept type (a chat message) without the generated type's fields
    (converted,) = messages_from_dict([{"type": kind, "data": unit}])
    return converted


def to_langchain(messages: Sequence[Message]) -> list[BaseMessage]:
    """tinyctx messages as LangChain messages; ``from_langchain(to_langchain(m)) == m``."""
    restored = restore_call_ids(messages)
    return [to_langchain_message(m, i) for i, m in enumerate(restored)]


def usage_from_langchain(message: BaseMessage) -> Usage | None:
    """An ``AIMessage``'s ``usage_metadata`` as tinyctx :class:`~tinyctx.Usage` (None when
    it reports none): the prompt, the output, cache reads and reasoning tokens."""
    usage = getattr(message, "usage_metadata", None)
    if not usage:
        return None
    inputs = usage.get("input_token_details") or {}
    outputs = usage.get("output_token_details") or {}
    return Usage(
        int(usage.get("input_tokens") or 0),
        int(usage.get("output_tokens") or 0),
        int(inputs.get("cache_read") or 0),
        reasoning_tokens=int(outputs.get("reasoning") or 0),
    )

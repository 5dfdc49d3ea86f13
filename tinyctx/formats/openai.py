"""OpenAI chat-completions messages <-> tinyctx messages.

One OpenAI message is one tinyctx message: ``system`` (and ``developer``), ``user``,
``assistant`` with ``tool_calls`` (ids, JSON-string arguments) and ``tool`` with
``tool_call_id``. Fields tinyctx does not model (mini-swe-agent's ``extra``, DeepSeek's
``reasoning_content``, ...) are kept in ``metadata["openai"]`` and written back in file mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ..messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ..parts import Content, Part, TextPart, describe_part, has_media, media_parts
from ._common import (
    CallNames,
    FormatError,
    arguments_json,
    check_call_expressible,
    check_read_pairing,
    core,
    emit_unit,
    expect_mapping,
    expect_str,
    finish_unit,
    parse_arguments,
    read_extension,
    restore_call_ids,
    unique_call_ids,
    write_extension,
)
from ._parts import openai_content, openai_part, read_openai_part, read_parts

__all__ = [
    "OPENAI",
    "to_openai",
    "from_openai",
    "openai_message",
    "read_openai_message",
    "parse_openai_message",
    "read_tool_calls",
    "text_of",
    "content_of",
    "tool_call_json",
]

OPENAI: Final = "openai"
ROLES: Final = ("system", "developer", "user", "assistant", "tool")
_MODELED: Final = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})
_API_FIELDS: Final = frozenset({"role", "content"})
_EXT_ALLOWED: Final = {
    "system": ("essential", "metadata"),
    "developer": ("essential", "metadata"),
    "user": ("essential", "metadata"),
    "assistant": ("essential", "metadata"),
    "tool": ("essential", "metadata", "is_error"),
}


def tool_call_json(call: ToolCall, *, fmt: str = "openai", index: int = 0) -> dict[str, Any]:
    """One call as an OpenAI ``tool_calls`` entry (JSON-string arguments)."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments_json(call, fmt=fmt, index=index)},
    }


def _generate(message: Message, index: int, *, for_api: bool) -> dict[str, Any]:
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": message.content}
    if isinstance(message, UserMessage):
        return {"role": "user", "content": _content(message.content, index, for_api)}
    if isinstance(message, AssistantMessage):
        calls = message.tool_calls
        unit: dict[str, Any] = {
            "role": "assistant",
            "content": message.content if message.content or not calls else None,
        }
        if calls:
            if not for_api:
                for call in calls:
                    check_call_expressible(call, fmt=OPENAI, index=index)
            unit["tool_calls"] = [tool_call_json(call, index=index) for call in calls]
        return unit
    if isinstance(message, ToolResult):
        unit = {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": _content(message.content, index, for_api),
        }
        if not for_api:
            unit["name"] = message.name
        return unit
    raise FormatError(f"cannot express a {type(message).__name__}", format=OPENAI, index=index)


def _content(content: Content, index: int, for_api: bool) -> str | list[dict[str, Any]]:
    return openai_content(content, index=index, for_api=for_api)


def openai_message(message: Message, index: int = 0, *, for_api: bool = False) -> dict[str, Any]:
    """One tinyctx message as an OpenAI message (see :func:`to_openai`)."""
    generated = _generate(message, index, for_api=for_api)

    def reads_back(unit: dict[str, Any]) -> bool:
        derived = message.name if isinstance(message, ToolResult) else None
        try:
            parsed = _parse(unit, index, lambda _id: derived or "")
        except FormatError:
            return False
        return parsed == core(message)

    unit, metadata = emit_unit(
        message,
        generated,
        OPENAI,
        modeled=_MODELED,
        reads_back=reads_back,
        for_api=for_api,
        api_fields=_API_FIELDS,
    )
    if for_api:
        return unit
    is_error = True if isinstance(message, ToolResult) and message.is_error else None
    return write_extension(unit, message, metadata, is_error=is_error)


def to_openai(messages: Sequence[Message], *, for_api: bool = False) -> list[dict[str, Any]]:
    """tinyctx messages as OpenAI chat-completions messages.

    File mode (the default) is lossless: ``from_openai(to_openai(m)) == m``; what OpenAI has
    no field for (``essential``, ``metadata``, a result's ``is_error``) is carried in a
    ``"tinyctx"`` key, and a tool message keeps its ``name``. ``for_api=True`` writes only
    what the API accepts: the messages' metadata, ``essential`` flags and result names and
    error flags are local bookkeeping and are left out (the model still reads every
    message's content). Raises :class:`FormatError` naming the index of a message OpenAI
    cannot express.

    Tool messages of the API take text only, so in API mode the images and files of a tool
    result are named in its text (``[image: screenshot image/png 1280×800, attached
    below]``) and sent in a user message right after that turn's tool messages.
    """
    if not for_api:
        messages = restore_call_ids(messages)
        return [openai_message(m, i, for_api=False) for i, m in enumerate(messages)]
    out: list[dict[str, Any]] = []
    attached: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        unit = openai_message(message, index, for_api=True)
        if isinstance(message, ToolResult) and has_media(message.content):
            unit["content"] = _tool_text(message)
            attached.append(
                {"type": "text", "text": f"Attached by tool call {message.tool_call_id}:"}
            )
            attached.extend(
                openai_part(p, index=index, for_api=True) for p in media_parts(message.content)
            )
        elif attached and not isinstance(message, ToolResult):
            out.append({"role": "user", "content": attached})
            attached = []
        out.append(unit)
    if attached:
        out.append({"role": "user", "content": attached})
    return out


def _tool_text(result: ToolResult) -> str:
    """A tool result's text for the API, each image or file named and said to follow."""
    lines = []
    for part in result.parts:
        if isinstance(part, TextPart):
            lines.append(part.text)
        else:
            lines.append(describe_part(part)[:-1] + ", attached below]")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# reading


MediaReader = Callable[..., "Part | None"]
"""Reads one media part of a content list: ``(block, kind, fmt=, index=, position=)``."""


def text_of(
    content: object,
    *,
    fmt: str,
    index: int | None,
    joiner: str,
    allowed: tuple[str, ...] = ("text",),
) -> str:
    """The text of an OpenAI ``content``: a string, null, or a list of text parts."""
    text = content_of(content, fmt=fmt, index=index, joiner=joiner, allowed=allowed)
    assert isinstance(text, str)
    return text


def content_of(
    content: object,
    *,
    fmt: str,
    index: int | None,
    joiner: str,
    allowed: tuple[str, ...] = ("text",),
    media: MediaReader | None = None,
    media_kinds: tuple[str, ...] = (),
) -> Content:
    """An OpenAI-style ``content``: a string, null, or a list of parts. Text parts of the
    ``allowed`` kinds are joined; with a ``media`` reader, parts of ``media_kinds`` become
    image/document parts and a list holding any is a tuple of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FormatError(
            f"content must be a string, null or a list of parts, got {type(content).__name__}",
            format=fmt,
            index=index,
        )
    items: list[str | Part] = []
    for position, part in enumerate(content):
        part_map = expect_mapping(part, f"content part {position}", fmt=fmt, index=index)
        kind = part_map.get("type")
        if media is not None and kind in media_kinds:
            read = media(part_map, kind, fmt=fmt, index=index, position=position)
            if read is not None:
                items.append(read)
                continue
        if kind not in allowed:
            holds = ", ".join((*allowed, *media_kinds))
            raise FormatError(
                f"cannot express a {kind!r} content part (part {position}); this message "
                f"holds {holds} parts",
                format=fmt,
                index=index,
            )
        text = part_map.get(str(kind))
        if not isinstance(text, str):
            raise FormatError(
                f"content part {position} has no {kind!r} string", format=fmt, index=index
            )
        items.append(text)
    return read_parts(items, joiner)


_MEDIA_KINDS: Final = ("image_url", "file")


def _read_content(content: object, index: int) -> Content:
    return content_of(
        content,
        fmt=OPENAI,
        index=index,
        joiner="\n",
        media=read_openai_part,
        media_kinds=_MEDIA_KINDS,
    )


def read_tool_calls(raw_calls: object, *, fmt: str, index: int) -> tuple[ToolCall, ...]:
    """OpenAI ``tool_calls`` (a list, or null) as ToolCalls."""
    if raw_calls is None:
        return ()
    if not isinstance(raw_calls, list):
        raise FormatError(
            f"tool_calls must be a list, got {type(raw_calls).__name__}", format=fmt, index=index
        )
    calls: list[ToolCall] = []
    for position, raw_call in enumerate(raw_calls):
        what = f"tool_calls[{position}]"
        call_map = expect_mapping(raw_call, what, fmt=fmt, index=index)
        kind = call_map.get("type", "function")
        if kind != "function":
            raise FormatError(
                f"cannot express a {kind!r} tool call ({what}); tinyctx calls are functions",
                format=fmt,
                index=index,
            )
        function = expect_mapping(
            call_map.get("function"), f"{what}.function", fmt=fmt, index=index
        )
        arguments, invalid = parse_arguments(function.get("arguments", ""))
        calls.append(
            ToolCall(
                expect_str(call_map.get("id"), f"{what}.id", fmt=fmt, index=index),
                expect_str(function.get("name"), f"{what}.function.name", fmt=fmt, index=index),
                arguments,
                invalid_arguments=invalid,
            )
        )
    return tuple(calls)


def _parse(raw: Mapping[str, Any], index: int, name_of: Callable[[str], str]) -> Message:
    """The message one OpenAI message says (no metadata); ``name_of(id)`` names a result."""
    role = raw.get("role")
    if role not in ROLES:
        raise FormatError(
            f"unknown role {role!r} (allowed: {', '.join(ROLES)})", format=OPENAI, index=index
        )
    content = raw.get("content")
    try:
        if role in ("system", "developer"):
            return SystemMessage(text_of(content, fmt=OPENAI, index=index, joiner="\n"))
        if role == "user":
            return UserMessage(_read_content(content, index))
        if role == "assistant":
            text = text_of(content, fmt=OPENAI, index=index, joiner="", allowed=("text", "refusal"))
            calls = read_tool_calls(raw.get("tool_calls"), fmt=OPENAI, index=index)
            return AssistantMessage(text, calls)
        call_id = expect_str(raw.get("tool_call_id"), "tool_call_id", fmt=OPENAI, index=index)
        name = raw.get("name")
        if name is None:
            name = name_of(call_id)
        elif not isinstance(name, str):
            raise FormatError(f"name must be a string, got {name!r}", format=OPENAI, index=index)
        return ToolResult(call_id, _read_content(content, index), name)
    except FormatError:
        raise
    except (TypeError, ValueError) as exc:
        raise FormatError(str(exc), format=OPENAI, index=index) from exc


def parse_openai_message(raw: object, index: int) -> Message:
    """One OpenAI message as the tinyctx message it says, nothing more: no metadata, and a
    tool result without ``name`` named "" (no pairing is known)."""
    unit = expect_mapping(raw, "a message", fmt=OPENAI, index=index)
    return _parse(unit, index, lambda call_id: "")


def read_openai_message(raw: object, index: int, calls: CallNames) -> Message:
    """One OpenAI message as a tinyctx message; ``calls`` names tool results and learns calls."""
    unit = expect_mapping(raw, "a message", fmt=OPENAI, index=index)
    parsed = _parse(unit, index, lambda call_id: calls.name_of(call_id, fmt=OPENAI, index=index))
    ext = read_extension(unit, allowed=_EXT_ALLOWED[unit["role"]], fmt=OPENAI, index=index)
    generated = _generate(parsed, index, for_api=False)
    return finish_unit(parsed, unit, generated, ext, OPENAI, calls, fmt=OPENAI, index=index)


def from_openai(messages: Sequence[Any] | Mapping[str, Any]) -> tuple[Message, ...]:
    """OpenAI chat-completions messages (a list, or a request body with ``messages``) as
    tinyctx messages.

    Raises :class:`FormatError` naming the index for an unknown role, a malformed field,
    content tinyctx cannot hold (images, audio), or a tool result without a call; tool
    calls left pending at the end are fine (the agent stopped there).
    """
    items: object = messages
    if isinstance(messages, Mapping):
        items = messages.get("messages")
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise FormatError(f"expected a list of messages, got {type(items).__name__}", format=OPENAI)
    calls = CallNames()
    out = unique_call_ids(
        [read_openai_message(raw, index, calls) for index, raw in enumerate(messages)]
    )
    check_read_pairing(out, range(len(out)), fmt=OPENAI)
    return tuple(out)

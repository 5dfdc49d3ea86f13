"""Anthropic Messages API messages <-> tinyctx messages.

Leading system messages become the separate ``system`` (a string, or text blocks); an
assistant message is a ``text`` block and one ``tool_use`` block per call; tool results are
``tool_result`` blocks (with ``is_error``) inside a user message, consecutive results in one
message. Assistant blocks tinyctx does not model (``thinking``, server tool blocks,
citations) are kept in ``metadata["anthropic"]`` and sent back while the message is
unchanged, as the API requires for thinking with tool use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..frozen import thaw
from ..messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ..parts import Content
from ._common import (
    CallNames,
    FormatError,
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
from ._parts import anthropic_content, read_anthropic_part
from .openai import content_of, text_of

__all__ = [
    "to_anthropic",
    "from_anthropic",
    "read_anthropic_assistant",
    "ANTHROPIC",
    "strip_cache_control",
]

ANTHROPIC: Final = "anthropic"
ROLES: Final = ("user", "assistant")
_MESSAGE_MODELED: Final = frozenset({"role", "content"})
_RESULT_MODELED: Final = frozenset({"type", "tool_use_id", "content", "is_error"})
_BLOCK_MODELED: Final = frozenset({"type", "text"})
_API_FIELDS: Final = frozenset({"content"})


def strip_cache_control(key: str, value: Any) -> Any:
    """``value`` without ``cache_control`` markers on its blocks (a request sets its own)."""
    if isinstance(value, list):
        return [
            {k: v for k, v in block.items() if k != "cache_control"}
            if isinstance(block, dict)
            else block
            for block in value
        ]
    return value


def _drop_nulls(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if v is not None}


# ---------------------------------------------------------------------------------------
# generating units


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        arguments = {} if call.invalid_arguments is not None else thaw(call.arguments)
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return blocks


def _result_block(result: ToolResult, *, for_api: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": result.tool_call_id,
        "content": anthropic_content(result.content, for_api=for_api),
    }
    if result.is_error:
        block["is_error"] = True
    return block


def _reads_back(message: Message, unit: dict[str, Any], index: int) -> bool:
    try:
        if isinstance(message, AssistantMessage):
            invalid = {c.id: c.invalid_arguments for c in message.tool_calls if c.invalid_arguments}
            parsed: Message = _parse_assistant(unit, index, invalid)
        elif isinstance(message, ToolResult):
            parsed = _parse_result(unit, index, message.name)
        elif isinstance(message, UserMessage):
            parsed = UserMessage(_content(unit.get("content"), index))
        else:
            parsed = SystemMessage(_text([unit], index, joiner="\n"))
    except FormatError:
        return False
    return parsed == core(message)


def _emit(
    message: Message,
    generated: dict[str, Any],
    modeled: frozenset[str],
    index: int,
    *,
    for_api: bool,
    **extension: Any,
) -> dict[str, Any]:
    unit, metadata = emit_unit(
        message,
        generated,
        ANTHROPIC,
        modeled=modeled,
        reads_back=lambda candidate: _reads_back(message, candidate, index),
        for_api=for_api,
        api_fields=_API_FIELDS if modeled is not _BLOCK_MODELED else frozenset(),
        api_filter=strip_cache_control,
    )
    if for_api:
        return unit
    return write_extension(unit, message, metadata, **extension)


def _api_user_blocks(unit: dict[str, Any]) -> list[dict[str, Any]]:
    content = unit["content"]
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for b in content if not (b.get("type") == "text" and b.get("text") == "")]


def _system_blocks(messages: Sequence[Message], *, for_api: bool) -> list[dict[str, Any]]:
    """The leading system messages as text blocks, one per message."""
    system: list[dict[str, Any]] = []
    position = 0
    while position < len(messages) and isinstance(messages[position], SystemMessage):
        message = messages[position]
        assert isinstance(message, SystemMessage)
        block = {"type": "text", "text": message.content}
        system.append(_emit(message, block, _BLOCK_MODELED, position, for_api=for_api))
        position += 1
    return system


def _assistant_unit(message: AssistantMessage, index: int, *, for_api: bool) -> dict[str, Any]:
    invalid = {c.id: c.invalid_arguments for c in message.tool_calls if c.invalid_arguments}
    unit = {"role": "assistant", "content": _assistant_blocks(message)}
    return _emit(
        message,
        unit,
        _MESSAGE_MODELED,
        index,
        for_api=for_api,
        invalid_arguments=invalid or None,
    )


def _result_unit(
    message: ToolResult, index: int, call_names: CallNames, *, for_api: bool
) -> dict[str, Any]:
    """A ``tool_result`` block; its name rides along only when its call does not give it."""
    derived = call_names.get(message.tool_call_id)
    return _emit(
        message,
        _result_block(message, for_api=for_api),
        _RESULT_MODELED,
        index,
        for_api=for_api,
        name=None if derived == message.name else message.name,
    )


def _user_unit(message: UserMessage, index: int, *, for_api: bool) -> dict[str, Any]:
    return _emit(
        message,
        {"role": "user", "content": anthropic_content(message.content, for_api=for_api)},
        _MESSAGE_MODELED,
        index,
        for_api=for_api,
    )


def to_anthropic(messages: Sequence[Message], *, for_api: bool = False) -> dict[str, Any]:
    """tinyctx messages as an Anthropic ``{"system": ..., "messages": [...]}``.

    ``system`` is present when the history starts with system messages; a system message
    anywhere else cannot be expressed (the API has no such turn) and is a
    :class:`FormatError` naming its index. File mode is lossless
    (``from_anthropic(to_anthropic(m)) == m``): ``essential``, ``metadata``, a result's
    ``name`` and unparsable tool arguments ride in a ``"tinyctx"`` key. ``for_api=True``
    writes what the API accepts: system as text blocks, and every run of user-side messages
    between two assistant messages as one user message whose ``tool_result`` blocks come
    first (the API requires results right after the calls); local bookkeeping is left out,
    and arguments that were not JSON are sent as ``{}``.
    """
    if not for_api:
        messages = restore_call_ids(messages)
    system = _system_blocks(messages, for_api=for_api)
    position = len(system)
    out: list[dict[str, Any]] = []
    results_open = False  # the last written message is a user message of tool results
    api_run: list[dict[str, Any]] | None = None  # for_api: blocks of the current user run
    api_texts: list[dict[str, Any]] = []
    call_names = CallNames()
    for index in range(position, len(messages)):
        message = messages[index]
        if isinstance(message, SystemMessage):
            raise FormatError(
                "cannot express a system message after the conversation started; Anthropic "
                "takes system text only before the first message (move it into the system "
                "prompt or make it a user message)",
                format=ANTHROPIC,
                index=index,
            )
        if isinstance(message, AssistantMessage):
            written = _assistant_unit(message, index, for_api=for_api)
            if for_api and not written["content"]:
                continue  # an empty turn says nothing, and the API rejects empty content
            if api_run is not None:
                out.append({"role": "user", "content": api_run + api_texts})
                api_run, api_texts = None, []
            out.append(written)
            call_names.add(message)
            results_open = False
            continue
        if isinstance(message, ToolResult):
            block = _result_unit(message, index, call_names, for_api=for_api)
            if for_api:
                api_run = [*(api_run or []), block]
            elif results_open:
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
                results_open = True
            continue
        if isinstance(message, UserMessage):
            unit = _user_unit(message, index, for_api=for_api)
            if for_api:
                api_run = api_run if api_run is not None else []
                api_texts.extend(_api_user_blocks(unit))
            else:
                out.append(unit)
                results_open = False
            continue
        raise FormatError(
            f"cannot express a {type(message).__name__}", format=ANTHROPIC, index=index
        )
    if api_run is not None:
        out.append({"role": "user", "content": api_run + api_texts})
    result: dict[str, Any] = {"messages": out}
    if system:
        plain = len(system) == 1 and set(system[0]) == {"type", "text"} and not for_api
        result["system"] = system[0]["text"] if plain else system
    return result


# ---------------------------------------------------------------------------------------
# reading


def _text(content: object, index: int | None, *, joiner: str) -> str:
    return text_of(content, fmt=ANTHROPIC, index=index, joiner=joiner)


_MEDIA_KINDS: Final = ("image", "document")


def _content(content: object, index: int | None) -> Content:
    """A user message's or tool result's content: text, images and documents."""
    return content_of(
        content,
        fmt=ANTHROPIC,
        index=index,
        joiner="\n",
        media=read_anthropic_part,
        media_kinds=_MEDIA_KINDS,
    )


def _block_type(block: object, where: str, index: int | None) -> tuple[Mapping[str, Any], str]:
    block_map = expect_mapping(block, where, fmt=ANTHROPIC, index=index)
    kind = block_map.get("type")
    if not isinstance(kind, str):
        raise FormatError(f"{where} has no type", format=ANTHROPIC, index=index)
    return block_map, kind


def _parse_assistant(
    unit: Mapping[str, Any], index: int | None, invalid: Mapping[str, str]
) -> AssistantMessage:
    content = unit.get("content")
    if isinstance(content, str):
        return AssistantMessage(content)
    if not isinstance(content, list):
        raise FormatError(
            f"assistant content must be a string or a list of blocks, got {content!r}",
            format=ANTHROPIC,
            index=index,
        )
    texts: list[str] = []
    calls: list[ToolCall] = []
    for position, block in enumerate(content):
        block_map, kind = _block_type(block, f"content block {position}", index)
        if kind == "text":
            texts.append(_text([block_map], index, joiner=""))
        elif kind == "tool_use":
            call_id = expect_str(
                block_map.get("id"), f"block {position} id", fmt=ANTHROPIC, index=index
            )
            name = expect_str(
                block_map.get("name"), f"block {position} name", fmt=ANTHROPIC, index=index
            )
            arguments, bad = parse_arguments(block_map.get("input", {}))
            if call_id in invalid:
                if arguments:
                    raise FormatError(
                        f"tool_use {call_id!r} has input and invalid_arguments",
                        format=ANTHROPIC,
                        index=index,
                    )
                bad = invalid[call_id]
            try:
                calls.append(ToolCall(call_id, name, arguments, invalid_arguments=bad))
            except (TypeError, ValueError) as exc:
                raise FormatError(str(exc), format=ANTHROPIC, index=index) from exc
        # thinking, redacted_thinking, server tool blocks...: kept by the content override
    try:
        return AssistantMessage("".join(texts), tuple(calls))
    except (TypeError, ValueError) as exc:
        raise FormatError(str(exc), format=ANTHROPIC, index=index) from exc


def _parse_result(block: Mapping[str, Any], index: int | None, name: str) -> ToolResult:
    call_id = expect_str(
        block.get("tool_use_id"), "tool_result.tool_use_id", fmt=ANTHROPIC, index=index
    )
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise FormatError(
            f"is_error must be a boolean, got {is_error!r}", format=ANTHROPIC, index=index
        )
    content = _content(block.get("content", ""), index)
    return ToolResult(call_id, content, name, is_error)


def read_anthropic_assistant(raw: Mapping[str, Any], index: int = 0) -> AssistantMessage:
    """One Anthropic assistant message (as the API returned it) as an AssistantMessage."""
    message = _read_unit(raw, index, "assistant", CallNames())
    assert isinstance(message, AssistantMessage)
    return message


def _read_unit(unit: Mapping[str, Any], index: int | None, kind: str, calls: CallNames) -> Message:
    parsed: Message
    generated: dict[str, Any]
    if kind == "assistant":
        unit = {**unit, "content": _clean_blocks(unit.get("content"))}
        ext = read_extension(
            unit, allowed=("essential", "metadata", "invalid_arguments"), fmt=ANTHROPIC, index=index
        )
        assistant = _parse_assistant(unit, index, ext.invalid_arguments)
        parsed, generated = (
            assistant,
            {"role": "assistant", "content": _assistant_blocks(assistant)},
        )
    elif kind == "result":
        ext = read_extension(
            unit, allowed=("essential", "metadata", "name"), fmt=ANTHROPIC, index=index
        )
        call_id = expect_str(
            unit.get("tool_use_id"), "tool_result.tool_use_id", fmt=ANTHROPIC, index=index
        )
        derived = calls.name_of(call_id, fmt=ANTHROPIC, index=index)
        result = _parse_result(unit, index, derived if ext.name is None else ext.name)
        parsed, generated = result, _result_block(result)
    elif kind == "user":
        ext = read_extension(unit, allowed=("essential", "metadata"), fmt=ANTHROPIC, index=index)
        user = UserMessage(_content(unit.get("content"), index))
        parsed = user
        generated = {"role": "user", "content": anthropic_content(user.content, for_api=False)}
    else:  # a system text block
        ext = read_extension(unit, allowed=("essential", "metadata"), fmt=ANTHROPIC, index=index)
        parsed = SystemMessage(_text([unit], index, joiner="\n"))
        generated = {"type": "text", "text": parsed.text}
    return finish_unit(parsed, unit, generated, ext, ANTHROPIC, calls, fmt=ANTHROPIC, index=index)


def _clean_blocks(content: object) -> object:
    """Assistant blocks as the API means them: a null field is an absent one."""
    if isinstance(content, list):
        return [_drop_nulls(b) if isinstance(b, Mapping) else b for b in content]
    return content


def _read_user(
    raw: Mapping[str, Any], index: int, calls: CallNames
) -> tuple[list[Message], list[int]]:
    content = raw.get("content")
    if not isinstance(content, list):
        return [_read_unit(raw, index, "user", calls)], [index]
    kinds = []
    for position, block in enumerate(content):
        _, kind = _block_type(block, f"content block {position}", index)
        if kind not in ("text", "tool_result", *_MEDIA_KINDS):
            raise FormatError(
                f"cannot express a {kind!r} block (content block {position}); tinyctx user "
                "messages hold text, images, documents and tool results",
                format=ANTHROPIC,
                index=index,
            )
        kinds.append(kind)
    if "tool_result" not in kinds:
        return [_read_unit(raw, index, "user", calls)], [index]
    extra = sorted(set(raw) - {"role", "content"})
    if extra:
        raise FormatError(
            f"cannot keep message-level field(s) {', '.join(extra)} of a user message that "
            "holds tool results (tinyctx keeps them per result block)",
            format=ANTHROPIC,
            index=index,
        )
    out: list[Message] = []
    texts: list[Any] = []

    def flush_texts() -> None:
        if texts:
            out.append(_read_unit({"role": "user", "content": list(texts)}, index, "user", calls))
            texts.clear()

    for block, kind in zip(content, kinds, strict=True):
        if kind == "text":
            texts.append(block)
            continue
        flush_texts()
        out.append(_read_unit(block, index, "result", calls))
    flush_texts()
    return out, [index] * len(out)


def _read_system(system: object) -> list[Message]:
    if system is None:
        return []
    if isinstance(system, str):
        return [SystemMessage(system)]
    if not isinstance(system, list):
        raise FormatError(
            f"system must be a string or a list of text blocks, got {type(system).__name__}",
            format=ANTHROPIC,
        )
    out: list[Message] = []
    for position, block in enumerate(system):
        block_map, kind = _block_type(block, f"system block {position}", None)
        if kind != "text":
            raise FormatError(
                f"cannot express a {kind!r} system block (system block {position})",
                format=ANTHROPIC,
            )
        out.append(_read_unit(block_map, None, "system", CallNames()))
    return out


def from_anthropic(
    messages: Sequence[Any] | Mapping[str, Any], *, system: object = None
) -> tuple[Message, ...]:
    """Anthropic messages (a list plus ``system``, or a request-shaped
    ``{"system": ..., "messages": [...]}``) as tinyctx messages.

    A user message's ``tool_result`` blocks become ToolResults named after their call and
    its text blocks a UserMessage, in block order. Raises :class:`FormatError` naming the
    message index for an unknown role, a block tinyctx cannot hold (images, documents), a
    result without a call, or malformed fields.
    """
    items: object = messages
    if isinstance(messages, Mapping):
        system = messages.get("system", system)
        items = messages.get("messages")
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise FormatError(
            f"expected a list of messages, got {type(items).__name__}", format=ANTHROPIC
        )
    out: list[Message] = _read_system(system)
    origins: list[int] = [0] * len(out)
    calls = CallNames()
    for index, raw in enumerate(items):
        unit = expect_mapping(raw, "a message", fmt=ANTHROPIC, index=index)
        role = unit.get("role")
        if role not in ROLES:
            raise FormatError(
                f"unknown role {role!r} (allowed: {', '.join(ROLES)}; system text goes in "
                "the separate system field)",
                format=ANTHROPIC,
                index=index,
            )
        if role == "assistant":
            out.append(_read_unit(unit, index, "assistant", calls))
            origins.append(index)
        else:
            read, where = _read_user(unit, index, calls)
            out.extend(read)
            origins.extend(where)
    out = unique_call_ids(out)
    check_read_pairing(out, origins, fmt=ANTHROPIC)
    return tuple(out)

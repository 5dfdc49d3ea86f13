"""tinyctx messages <-> OpenAI Responses API input items, both ways.

Writing (:func:`to_responses_input`): a system message is a ``system`` message item, a user
message a ``user`` message item (a string, or ``input_text`` / ``input_image`` /
``input_file`` parts), a tool result a ``function_call_output`` item (its images and files
as parts of ``output``), and an assistant message its output items: what the model sent
(reasoning items with their ``encrypted_content``, server tool calls, the message and
function calls, as kept in ``metadata["openai_responses"]["items"]``) while they still say
what the message says, else an ``assistant`` message item and one ``function_call`` per
call, after the kept reasoning and server tool items (an empty answer is an empty
``assistant`` message item, so a reasoning item is always followed by its turn).

The items of a turn live in the assistant message they came with, so every layer that
keeps, trims, summarizes or drops that message takes its reasoning with it: a compaction
can never leave a reasoning item without its turn, nor a turn without its reasoning.

Reading (:func:`from_responses_input`, :func:`assistant_from_output`): a run of output
items is one assistant message; a new one starts at a reasoning or ``assistant`` message
item that follows the run's message or function call, and after an empty answer. (An
answer right before a turn of calls alone is one model turn on the wire, and reads back
as one message: the API sees them so too.) Items a message cannot say
(reasoning, server tool calls, ids) are kept in its metadata and written back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ..formats import FormatError
from ..formats._common import (
    arguments_json,
    check_read_pairing,
    expect_mapping,
    expect_str,
    parse_arguments,
)
from ..formats._parts import read_parts
from ..frozen import thaw
from ..messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ..parts import Content, DocumentPart, ImagePart, Part, TextPart

__all__ = [
    "RESPONSES",
    "ITEMS",
    "to_responses_input",
    "from_responses_input",
    "assistant_from_output",
    "reasoning_items",
    "reasoning_text",
]

RESPONSES: Final = "openai_responses"
"""The metadata namespace of an assistant message's output items."""
ITEMS: Final = "items"
FORMAT: Final = "openai_responses"
_INPUT_ROLES: Final = ("user", "system", "developer")
_MODELED: Final = frozenset({"message", "function_call"})


# ---------------------------------------------------------------------------------------
# parts


def _part(part: Part, *, index: int) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, ImagePart):
        return {"type": "input_image", "image_url": part.data_url, "detail": part.detail or "auto"}
    file: dict[str, Any] = {"type": "input_file"}
    if part.data is not None:
        file["file_data"] = part.data_url
    else:
        file["file_url"] = str(part.url)
    if part.title:
        file["filename"] = part.title
    return file


def _content(content: Content, *, index: int) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [_part(p, index=index) for p in content]


def _read_part(raw: object, *, index: int, position: int) -> str | Part:
    block = expect_mapping(raw, f"content part {position}", fmt=FORMAT, index=index)
    kind = block.get("type")
    try:
        if kind in ("input_text", "output_text", "text"):
            return expect_str(block.get("text"), f"part {position}.text", fmt=FORMAT, index=index)
        if kind == "input_image":
            url = expect_str(
                block.get("image_url"), f"part {position}.image_url", fmt=FORMAT, index=index
            )
            detail = block.get("detail")
            detail = None if detail in (None, "auto", "original") else detail
            return ImagePart.from_data_url(url, detail=detail)
        if kind == "input_file":
            title = block.get("filename") or ""
            data = block.get("file_data")
            if isinstance(data, str) and data:
                return DocumentPart.from_data_url(data, title=title)
            link = block.get("file_url")
            if isinstance(link, str) and link:
                return DocumentPart(url=link, title=title)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"content part {position}: {exc}", format=FORMAT, index=index) from exc
    raise FormatError(
        f"cannot read a {kind!r} content part (part {position}); tinyctx reads input_text, "
        "input_image (by URL or data URL) and input_file (file_data or file_url)",
        format=FORMAT,
        index=index,
    )


def _read_content(raw: object, *, index: int) -> Content:
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise FormatError(
            f"content must be a string or a list of parts, got {type(raw).__name__}",
            format=FORMAT,
            index=index,
        )
    items = [_read_part(p, index=index, position=i) for i, p in enumerate(raw)]
    return read_parts(items, "\n")


# ---------------------------------------------------------------------------------------
# writing


def _generated(message: AssistantMessage, index: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:  # an empty answer is an empty message
        items.append({"type": "message", "role": "assistant", "content": message.content})
    items += [
        {
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": arguments_json(call, fmt=FORMAT, index=index),
        }
        for call in message.tool_calls
    ]
    return items


def kept_items(message: Message) -> list[dict[str, Any]]:
    """The output items kept with ``message`` (none when it kept none)."""
    own = message.metadata.get(RESPONSES, None)
    items = own.get(ITEMS) if isinstance(own, Mapping) else None
    if not isinstance(items, tuple):
        return []
    return [thaw(item) for item in items if isinstance(item, Mapping)]


def _assistant_items(message: AssistantMessage, index: int) -> list[dict[str, Any]]:
    kept = kept_items(message)
    if kept and _says(kept, index) == (message.content, message.tool_calls):
        return kept
    # the kept reasoning and server tool items, then the turn as it is now: a reasoning
    # item is always followed by an item of its own turn
    return [item for item in kept if item.get("type") not in _MODELED] + _generated(message, index)


def to_responses_input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """tinyctx messages as Responses API input items (see the module docstring).

    What the API has no field for (metadata, ``essential``, a tool result's ``is_error``
    and name) stays local, as in every API mode; a message the API cannot take is a
    :class:`FormatError` naming its index.
    """
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if isinstance(message, SystemMessage):
            items.append({"type": "message", "role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            content = _content(message.content, index=index)
            items.append({"type": "message", "role": "user", "content": content})
        elif isinstance(message, AssistantMessage):
            items += _assistant_items(message, index)
        elif isinstance(message, ToolResult):
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": _content(message.content, index=index),
                }
            )
        else:
            raise FormatError(
                f"cannot express a {type(message).__name__}", format=FORMAT, index=index
            )
    return items


# ---------------------------------------------------------------------------------------
# reading


def _message_text(item: Mapping[str, Any], index: int) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FormatError("an assistant message item has no content", format=FORMAT, index=index)
    texts: list[str] = []
    for position, raw in enumerate(content):
        block = expect_mapping(raw, f"content part {position}", fmt=FORMAT, index=index)
        kind = block.get("type")
        key = "refusal" if kind == "refusal" else "text"
        if kind not in ("output_text", "refusal", "text", "input_text"):
            raise FormatError(
                f"cannot read a {kind!r} part of an assistant message (part {position})",
                format=FORMAT,
                index=index,
            )
        texts.append(expect_str(block.get(key), f"part {position}.{key}", fmt=FORMAT, index=index))
    return "".join(texts)


def _call(item: Mapping[str, Any], index: int) -> ToolCall:
    arguments, invalid = parse_arguments(item.get("arguments", ""))
    try:
        return ToolCall(
            expect_str(item.get("call_id"), "function_call.call_id", fmt=FORMAT, index=index),
            expect_str(item.get("name"), "function_call.name", fmt=FORMAT, index=index),
            arguments,
            invalid_arguments=invalid,
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(str(exc), format=FORMAT, index=index) from exc


def _says(items: Iterable[Mapping[str, Any]], index: int) -> tuple[str, tuple[ToolCall, ...]]:
    """The text and function calls that output items say."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            texts.append(_message_text(item, index))
        elif kind == "function_call":
            calls.append(_call(item, index))
    return "".join(texts), tuple(calls)


def assistant_from_output(
    items: Sequence[Mapping[str, Any]], *, index: int = 0
) -> AssistantMessage:
    """The assistant message a run of output items says; items beyond its text and
    function calls (reasoning, server tool calls, item ids) are kept in
    ``metadata["openai_responses"]["items"]`` so the next request sends them back."""
    text, calls = _says(items, index)
    try:
        message = AssistantMessage(text, calls)
    except (TypeError, ValueError) as exc:
        raise FormatError(str(exc), format=FORMAT, index=index) from exc
    plain = [dict(item) for item in items]
    if plain != _generated(message, index):
        message = message.evolve(metadata={RESPONSES: {ITEMS: plain}})
    return message


def _starts_turn(item: Mapping[str, Any], run: Sequence[Mapping[str, Any]]) -> bool:
    if run and run[-1].get("type") == "message" and run[-1].get("content") in ("", []):
        return True  # an empty answer is a turn of its own (its message is all it has)
    kind = item.get("type")
    if kind != "reasoning" and not (kind == "message" and item.get("role") == "assistant"):
        return False
    return any(i.get("type") in _MODELED for i in run)


def from_responses_input(items: Sequence[Any]) -> tuple[Message, ...]:
    """Responses API input items as tinyctx messages (see the module docstring); an item
    tinyctx cannot read, or a result without its call, is a FormatError naming its index."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise FormatError(f"expected a list of items, got {type(items).__name__}", format=FORMAT)
    out: list[Message] = []
    origins: list[int] = []
    names: dict[str, str] = {}
    run: list[Mapping[str, Any]] = []
    run_start = 0

    def close_run() -> None:
        if run:
            message = assistant_from_output(run, index=run_start)
            names.update((c.id, c.name) for c in message.tool_calls)
            out.append(message)
            origins.append(run_start)
            run.clear()

    for index, raw in enumerate(items):
        item = expect_mapping(raw, "an item", fmt=FORMAT, index=index)
        kind = item.get("type", "message")
        role = item.get("role")
        if kind == "message" and role in _INPUT_ROLES:
            close_run()
            out.append(_input_message(item, role, index))
            origins.append(index)
        elif kind == "function_call_output":
            close_run()
            call_id = expect_str(item.get("call_id"), "call_id", fmt=FORMAT, index=index)
            if call_id not in names:
                raise FormatError(
                    f"function_call_output {call_id!r} answers no earlier function call",
                    format=FORMAT,
                    index=index,
                )
            content = _read_content(item.get("output", ""), index=index)
            out.append(ToolResult(call_id, content, names[call_id]))
            origins.append(index)
        elif kind == "message" and role != "assistant":
            raise FormatError(
                f"unknown role {role!r} (allowed: {', '.join((*_INPUT_ROLES, 'assistant'))})",
                format=FORMAT,
                index=index,
            )
        else:
            if _starts_turn(item, run):
                close_run()
            if not run:
                run_start = index
            run.append(item)
    close_run()
    check_read_pairing(out, origins, fmt=FORMAT)
    return tuple(out)


def _input_message(item: Mapping[str, Any], role: str, index: int) -> Message:
    content = _read_content(item.get("content", ""), index=index)
    if role == "user":
        return UserMessage(content)
    if not isinstance(content, str):
        raise FormatError(f"a {role} message holds text only", format=FORMAT, index=index)
    return SystemMessage(content)


# ---------------------------------------------------------------------------------------
# reasoning


def reasoning_items(message: Message) -> list[dict[str, Any]]:
    """The reasoning items kept with an assistant message."""
    return [item for item in kept_items(message) if item.get("type") == "reasoning"]


def reasoning_text(message: Message) -> str:
    """What a model will read again of a message's reasoning: its summaries and any
    plain reasoning text, and its encrypted content (counted as text: the provider bills
    it as input when it is sent back)."""
    pieces: list[str] = []
    for item in reasoning_items(message):
        for key in ("summary", "content"):
            for block in item.get(key) or ():
                if isinstance(block, Mapping) and isinstance(block.get("text"), str):
                    pieces.append(block["text"])
        encrypted = item.get("encrypted_content")
        if isinstance(encrypted, str):
            pieces.append(encrypted)
    return "\n".join(pieces)


def dumps(items: Sequence[Mapping[str, Any]]) -> str:
    """Items as compact JSON (for logs and tests)."""
    return json.dumps(list(items), ensure_ascii=False, separators=(",", ":"))

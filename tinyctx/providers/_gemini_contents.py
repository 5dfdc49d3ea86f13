"""tinyctx messages <-> Gemini ``contents`` (plain JSON in the SDK's snake_case shape).

- system messages join the request's ``system_instruction``;
- a user message is a ``user`` content of ``text`` / ``inline_data`` / ``file_data`` parts;
- an assistant message is a ``model`` content: the parts the model sent (thoughts, thought
  signatures, calls without ids), kept in ``metadata["gemini"]``, while they still say
  what the message says; else its thought parts, then a text part and a ``function_call``
  part per call;
- the tool results of one turn are one ``user`` content of ``function_response`` parts
  (``response: {"output": ...}``, or ``{"error": ...}`` for an error result; images and
  files as the response's own ``parts``).

A call the model sent without an id gets one here (``call_<hex>``), remembered in the
message's metadata, and its response is sent without an id, as the model sent it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..formats import FormatError
from ..formats._common import keepable, parse_arguments
from ..frozen import thaw
from ..messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage
from ..parts import Content, DocumentPart, ImagePart, Part, TextPart, content_text, media_parts

__all__ = ["GEMINI", "PARTS", "to_gemini_contents", "assistant_from_parts", "system_text"]

GEMINI: Final = "gemini"
PARTS: Final = "parts"
IDS: Final = "ids"
"""Per function_call part kept, the tinyctx id of its call and whether the model sent it."""


def _media(part: ImagePart | DocumentPart) -> dict[str, Any]:
    if part.data is not None:
        return {"inline_data": {"mime_type": part.media_type, "data": part.data}}
    file: dict[str, Any] = {"file_uri": str(part.url)}
    if part.media_type:
        file["mime_type"] = part.media_type
    return {"file_data": file}


def _user_parts(content: Content) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}]
    out: list[dict[str, Any]] = []
    for part in content:
        out.append({"text": part.text} if isinstance(part, TextPart) else _media(part))
    return out


def _kept(message: Message) -> tuple[list[dict[str, Any]], list[tuple[str, bool]]]:
    own = message.metadata.get(GEMINI, None)
    if not isinstance(own, Mapping):
        return [], []
    parts = [thaw(p) for p in own.get(PARTS, ()) if isinstance(p, Mapping)]
    ids = [
        (str(i[0]), bool(i[1])) for i in own.get(IDS, ()) if isinstance(i, tuple) and len(i) == 2
    ]
    return parts, ids


def _says(
    parts: Sequence[Mapping[str, Any]], ids: Sequence[str]
) -> tuple[str, tuple[ToolCall, ...]]:
    texts: list[str] = []
    calls: list[ToolCall] = []
    next_id = iter(ids)
    for part in parts:
        call = part.get("function_call")
        if isinstance(call, Mapping):
            call_id = next(next_id, None) or call.get("id") or f"call_{uuid.uuid4().hex[:24]}"
            # arguments a thread could not keep (too deep, NaN) are that call's invalid
            # arguments: it gets an error result and the run goes on
            arguments, invalid = parse_arguments(call.get("args") or {})
            calls.append(
                ToolCall(
                    str(call_id),
                    str(call.get("name") or ""),
                    arguments,
                    invalid_arguments=invalid,
                )
            )
        elif isinstance(part.get("text"), str) and not part.get("thought"):
            texts.append(part["text"])
    return "".join(texts), tuple(calls)


def _keepable_part(part: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``part`` a thread can keep: a call's arguments it could not keep (too
    deep, NaN) become ``{}`` there, as in the call itself (its invalid arguments)."""
    plain = dict(part)
    call = plain.get("function_call")
    if isinstance(call, Mapping) and not keepable(call.get("args") or {}):
        plain["function_call"] = {**call, "args": {}}
    return plain


def assistant_from_parts(parts: Sequence[Mapping[str, Any]]) -> AssistantMessage:
    """The assistant message of a candidate's parts; calls without an id get one, and
    the parts are kept in ``metadata["gemini"]`` when they say more than the message."""
    ids: list[tuple[str, bool]] = []
    for part in parts:
        call = part.get("function_call")
        if isinstance(call, Mapping):
            sent = call.get("id")
            ids.append(
                (sent, True)
                if isinstance(sent, str) and sent
                else (f"call_{uuid.uuid4().hex[:24]}", False)
            )
    text, calls = _says(parts, [i for i, _ in ids])
    message = AssistantMessage(text, calls)
    plain = [_keepable_part(p) for p in parts]
    if plain != _generated(message) or not all(sent for _, sent in ids):
        message = message.evolve(metadata={GEMINI: {PARTS: plain, IDS: [list(i) for i in ids]}})
    return message


def _generated(message: AssistantMessage) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        parts.append({"text": message.content})
    for call in message.tool_calls:
        arguments = {} if call.invalid_arguments is not None else thaw(call.arguments)
        parts.append({"function_call": {"id": call.id, "name": call.name, "args": arguments}})
    return parts


def _model_parts(message: AssistantMessage, unnamed: set[str]) -> list[dict[str, Any]]:
    kept, ids = _kept(message)
    unnamed.update(call_id for call_id, sent in ids if not sent)
    if kept:
        try:
            says = _says(kept, [i for i, _ in ids])
        except (TypeError, ValueError):
            says = ("", ())
        if says == (message.content, message.tool_calls):
            return kept
    thoughts = [p for p in kept if p.get("thought")]
    return thoughts + _generated(message)


def _result_part(result: ToolResult, unnamed: set[str]) -> dict[str, Any]:
    key = "error" if result.is_error else "output"
    response: dict[str, Any] = {
        "name": result.name,
        "response": {key: content_text(result.content)},
    }
    if result.tool_call_id not in unnamed:
        response["id"] = result.tool_call_id
    media = media_parts(result.content) if not isinstance(result.content, str) else ()
    if media:
        response["parts"] = [_media(p) for p in media]
    return {"function_response": response}


def system_text(messages: Sequence[Message], system_prompt: str | None) -> str | None:
    """The system instruction: the request's system prompt, then every system message."""
    texts = [system_prompt] if system_prompt else []
    texts += [m.content for m in messages if isinstance(m, SystemMessage) and m.content]
    return "\n\n".join(texts) or None


def to_gemini_contents(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The thread as Gemini contents (system messages go to :func:`system_text`)."""
    contents: list[dict[str, Any]] = []
    unnamed: set[str] = set()
    results: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, ToolResult) and results:
            contents.append({"role": "user", "parts": results})
            results = []
        if isinstance(message, SystemMessage):
            continue
        if isinstance(message, UserMessage):
            contents.append({"role": "user", "parts": _user_parts(message.content)})
        elif isinstance(message, AssistantMessage):
            contents.append({"role": "model", "parts": _model_parts(message, unnamed)})
        elif isinstance(message, ToolResult):
            results.append(_result_part(message, unnamed))
        else:
            raise FormatError(
                f"cannot express a {type(message).__name__}", format=GEMINI, index=index
            )
    if results:
        contents.append({"role": "user", "parts": results})
    return contents


def media_of(part: Part) -> dict[str, Any]:
    """One image or document part as a Gemini part (text parts as ``text``)."""
    return {"text": part.text} if isinstance(part, TextPart) else _media(part)

"""Agent TARS / Tarko run logs (bytedance/UI-TARS-desktop) -> tinyctx messages (read only).

Three layouts, all written by that agent kit while real browser/GUI agents ran, with every
screenshot embedded as base64:

- a **session dump** ``{"agent", "sessionId", "history": [{"type": "request" | "response",
  "data"}]}``. With the Responses API each request holds only the new input items
  (``previous_response_id`` chaining), so requests and responses interleave in order; with
  chat completions the logger kept a reference to the live message list, so every request
  shows the final list: it is read once, and a last response missing from it is appended.
- an **event stream**: a JSON array of agent events (``user_message``,
  ``environment_input``, ``assistant_message`` followed by its ``tool_call`` events,
  ``tool_result``); streaming deltas and other events are skipped. It has no system
  prompt: pass ``system=`` (e.g. from an llm-request snapshot of the same run).
- an **llm-request snapshot** (``*.llm-request.jsonl``, one pretty-printed object)
  ``{"provider", "request": {"model", "messages"}, "baseURL"}``: the chat-completions
  request of one loop, the whole conversation up to it, system prompt included.

These agents send a tool result to the model as a user message ``Tool: <name>\\nResult:
\\n<json>``; right after an assistant call to ``<name>`` it is that call's ToolResult, with
the same text. A screenshot the agent adds after a result stays a user message, as the
model saw it. Where the model wrote its call as text (``<tool_call>{"name",
"parameters"}</tool_call>``) and the log has no parsed call, the block is parsed into a
call with id ``tc_<turn>_<k>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..messages import Message
from ._common import FormatError, expect_mapping
from .openai import from_openai

__all__ = ["AGENT_TARS", "from_agent_tars", "is_agent_tars"]

AGENT_TARS: Final = "agent_tars"
_TOOL_RESULT = re.compile(r"^Tool: ([^\n]+)\nResult:\n", re.S)
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_EVENTS: Final = frozenset(
    {"user_message", "environment_input", "assistant_message", "tool_call", "tool_result"}
)


def _snapshot(document: Mapping[str, Any]) -> Sequence[Any] | None:
    """The messages of an llm-request snapshot, or None when ``document`` is not one."""
    request = document.get("request")
    if "provider" not in document or not isinstance(request, Mapping):
        return None
    messages = request.get("messages")
    return messages if isinstance(messages, list) else None


def is_agent_tars(document: object) -> bool:
    """Whether a parsed JSON document is an Agent TARS session dump, event stream or
    llm-request snapshot."""
    if isinstance(document, Mapping) and _snapshot(document) is not None:
        return True
    if isinstance(document, Mapping):
        history = document.get("history")
        return (
            "sessionId" in document
            and isinstance(history, list)
            and all(
                isinstance(e, Mapping) and e.get("type") in ("request", "response") for e in history
            )
        )
    return (
        isinstance(document, list)
        and bool(document)
        and all(isinstance(e, Mapping) and "type" in e and "timestamp" in e for e in document)
        and any(e.get("type") in _EVENTS for e in document)
    )


def _part(part: object, index: int) -> dict[str, Any]:
    """One logged content part in OpenAI chat form."""
    block = expect_mapping(part, "a content part", fmt=AGENT_TARS, index=index)
    kind = block.get("type")
    if kind in ("text", "input_text", "output_text"):
        return {"type": "text", "text": block.get("text", "")}
    if kind == "image_url":
        image = block.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "input_image":
        return {"type": "image_url", "image_url": {"url": block.get("image_url")}}
    source = block.get("source")
    if kind == "image" and isinstance(source, Mapping):
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        return {"type": "image_url", "image_url": {"url": url}}
    raise FormatError(
        f"cannot read a {kind!r} content part (allowed: text, input_text, output_text, "
        "image_url, input_image, image)",
        format=AGENT_TARS,
        index=index,
    )


def _content(content: object, index: int) -> object:
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FormatError(
            f"content must be a string, null or a list, got {type(content).__name__}",
            format=AGENT_TARS,
            index=index,
        )
    return [_part(p, index) for p in content]


def _single_text(content: object) -> str | None:
    if isinstance(content, str):
        return content
    if (
        isinstance(content, list)
        and len(content) == 1
        and isinstance(content[0], Mapping)
        and content[0].get("type") in ("text", "input_text")
    ):
        text = content[0].get("text", "")
        return text if isinstance(text, str) else None
    return None


class _Builder:
    """OpenAI chat messages in order, pairing tool results with the calls still open."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.open_calls: list[tuple[str, str]] = []  # (id, name), unanswered, of the last turn
        self.turns = 0

    def system(self, content: object, index: int) -> None:
        self.out.append({"role": "system", "content": _content(content, index)})

    def user(self, content: object, index: int) -> None:
        text = _single_text(content)
        match = _TOOL_RESULT.match(text) if text is not None else None
        if match is not None and self.open_calls:
            name = match.group(1).strip()
            for position, (call_id, call_name) in enumerate(self.open_calls):
                if call_name == name:
                    del self.open_calls[position]
                    self.out.append({"role": "tool", "tool_call_id": call_id, "content": text})
                    return
        self.out.append({"role": "user", "content": _content(content, index)})

    def tool(self, call_id: str, content: object, index: int) -> None:
        self.open_calls = [c for c in self.open_calls if c[0] != call_id]
        self.out.append(
            {"role": "tool", "tool_call_id": call_id, "content": _content(content, index)}
        )

    def assistant(self, content: object, tool_calls: object, index: int) -> None:
        if isinstance(content, list):
            content = _single_text(content)
        text = content if isinstance(content, str) else ""
        calls = [self._call(raw, index) for raw in (tool_calls or [])]  # type: ignore[attr-defined]
        if not calls:
            calls = _text_calls(text, self.turns)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        self.out.append(message)
        self.turns += 1
        self.open_calls = [(c["id"], c["function"]["name"]) for c in calls]

    @staticmethod
    def _call(raw: object, index: int) -> dict[str, Any]:
        call = expect_mapping(raw, "a tool call", fmt=AGENT_TARS, index=index)
        function = expect_mapping(
            call.get("function"), "a tool call's function", fmt=AGENT_TARS, index=index
        )
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
        return {
            "id": call.get("id"),
            "type": "function",
            "function": {"name": function.get("name"), "arguments": arguments},
        }


def _text_calls(text: str, turn: int) -> list[dict[str, Any]]:
    """Calls the model wrote as ``<tool_call>{...}</tool_call>`` text blocks."""
    calls = []
    for k, block in enumerate(_TOOL_CALL_BLOCK.findall(text)):
        try:
            value = json.loads(block)
        except ValueError:
            continue  # an unfinished block (a cut-off answer) stays text
        if not isinstance(value, dict) or "name" not in value:
            continue
        arguments = value.get("parameters", value.get("arguments", {}))
        calls.append(
            {
                "id": f"tc_{turn:02d}_{k}",
                "type": "function",
                "function": {
                    "name": value["name"],
                    "arguments": json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    return calls


def _input_item(builder: _Builder, item: object, index: int) -> None:
    entry = expect_mapping(item, "an input item", fmt=AGENT_TARS, index=index)
    role = entry.get("role")
    if role in ("system", "developer"):
        builder.system(entry.get("content"), index)
    elif role == "user":
        builder.user(entry.get("content"), index)
    elif role == "assistant":
        builder.assistant(entry.get("content"), entry.get("tool_calls"), index)
    elif role == "tool":
        builder.tool(str(entry.get("tool_call_id")), entry.get("content"), index)
    elif entry.get("type") == "function_call_output":
        builder.tool(str(entry.get("call_id")), entry.get("output"), index)
    else:
        raise FormatError(
            f"cannot read an input item of role/type {role or entry.get('type')!r}",
            format=AGENT_TARS,
            index=index,
        )


def _response(entry: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    try:
        message = entry["data"]["response"]["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise FormatError(
            "a response entry has no data.response.choices[0].message",
            format=AGENT_TARS,
            index=index,
        ) from None
    return expect_mapping(message, "a response message", fmt=AGENT_TARS, index=index)


def _request(entry: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    data = expect_mapping(entry.get("data"), "a request's data", fmt=AGENT_TARS, index=index)
    return expect_mapping(data.get("request"), "data.request", fmt=AGENT_TARS, index=index)


def _session(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    history: list[Any] = document["history"]
    builder = _Builder()
    requests = [(i, e) for i, e in enumerate(history) if e.get("type") == "request"]
    if requests and "input" in _request(requests[0][1], requests[0][0]):
        for index, entry in enumerate(history):  # Responses API: incremental inputs
            if entry.get("type") == "request":
                for item in _request(entry, index).get("input") or []:
                    _input_item(builder, item, index)
            else:
                message = _response(entry, index)
                builder.assistant(message.get("content"), message.get("tool_calls"), index)
        return builder.out
    if not requests:
        return builder.out
    last_index, last = requests[-1]
    final = _request(last, last_index).get("messages")
    if not isinstance(final, list):
        raise FormatError("a request has no messages list", format=AGENT_TARS, index=last_index)
    answers = [(i, _response(e, i)) for i, e in enumerate(history) if e.get("type") == "response"]
    k = 0
    for message in final:
        entry = expect_mapping(message, "a message", fmt=AGENT_TARS, index=last_index)
        if entry.get("role") == "assistant":
            logged = answers[k][1] if k < len(answers) else entry
            calls = entry.get("tool_calls") or logged.get("tool_calls")
            builder.assistant(entry.get("content"), calls, last_index)
            k += 1
        else:
            _input_item(builder, entry, last_index)
    for index, message in answers[k:]:
        builder.assistant(message.get("content"), message.get("tool_calls"), index)
    return builder.out


def _event_stream(events: Sequence[Any], system: object) -> list[dict[str, Any]]:
    builder = _Builder()
    if system is not None:
        builder.system(system, 0)
    index = 0
    while index < len(events):
        event = expect_mapping(events[index], "an event", fmt=AGENT_TARS, index=index)
        kind = event.get("type")
        if kind in ("user_message", "environment_input"):
            builder.user(event.get("content"), index)
        elif kind == "assistant_message":
            calls: list[dict[str, Any]] = []
            after = index + 1
            while after < len(events) and events[after].get("type") == "tool_call":
                tool_call = events[after]
                function = {"name": tool_call.get("name"), "arguments": tool_call.get("arguments")}
                calls.append({"id": tool_call.get("toolCallId"), "function": function})
                after += 1
            builder.assistant(event.get("content"), calls or event.get("toolCalls"), index)
            index = after
            continue
        elif kind == "tool_result":
            content = event.get("content")
            if isinstance(content, list) and any(
                isinstance(p, Mapping) and p.get("type") in ("image_url", "image") for p in content
            ):
                builder.tool(str(event.get("toolCallId")), content, index)
            else:
                body = (
                    content
                    if isinstance(content, str)
                    else json.dumps(content, indent=2, ensure_ascii=False)
                )
                text = f"Tool: {event.get('name')}\nResult:\n{body}"
                builder.tool(str(event.get("toolCallId")), text, index)
        index += 1
    return builder.out


def from_agent_tars(document: Any, *, system: object = None) -> tuple[Message, ...]:
    """The conversation of an Agent TARS session dump, event stream or llm-request
    snapshot (parsed JSON).

    ``system`` is the system prompt of an event stream (which logs none). Raises
    :class:`FormatError` naming the entry of what cannot be read, or a tool result that
    answers no call.
    """
    snapshot = _snapshot(document) if isinstance(document, Mapping) else None
    if snapshot is not None:
        builder = _Builder()
        for index, item in enumerate(snapshot):
            _input_item(builder, item, index)
        messages = builder.out
    elif isinstance(document, Mapping) and isinstance(document.get("history"), list):
        messages = _session(document)
    elif isinstance(document, list):
        messages = _event_stream(document, system)
    else:
        raise FormatError(
            "expected a session dump with 'history', an event-stream array or an "
            "llm-request snapshot with 'request.messages'",
            format=AGENT_TARS,
        )
    try:
        return from_openai(messages)
    except FormatError as exc:
        raise FormatError(exc.reason, format=AGENT_TARS) from exc

"""SWE-agent ``.traj`` histories and mini-swe-agent ``.traj.json`` trajectories.

SWE-agent keeps the model's view of a run in ``history``: entries with ``role``,
``content``, ``message_type``, ``agent``, and for the assistant ``thought``, ``action`` and
OpenAI-style ``tool_calls`` (a list, or in some versions its Python ``repr`` string); a
``tool`` entry answers one call through ``tool_call_ids``. mini-swe-agent stores OpenAI
messages (plus an ``extra`` field) in ``messages`` and ends with an ``exit`` entry: the
run's final record, not a message, which the loaders keep in ``Transcript.info``.
"""

from __future__ import annotations

import ast
import json
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
    check_call_expressible,
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
from ._parts import openai_content, read_openai_part
from .openai import (
    content_of,
    read_openai_message,
    read_tool_calls,
    text_of,
    to_openai,
    tool_call_json,
)

__all__ = [
    "SWE_AGENT",
    "MINI_SWE_AGENT",
    "MINI_TRAJECTORY_FORMAT",
    "to_swe_agent",
    "from_swe_agent",
    "to_mini_swe_agent",
    "from_mini_swe_agent",
    "read_mini_swe_agent",
]

SWE_AGENT: Final = "swe_agent"
MINI_SWE_AGENT: Final = "mini_swe_agent"
MINI_TRAJECTORY_FORMAT: Final = "mini-swe-agent-1.1"
ROLES: Final = ("system", "user", "assistant", "tool")
_MODELED: Final = frozenset({"role", "content", "tool_calls", "tool_call_ids"})
_MESSAGE_TYPES: Final = {
    "system": "system_prompt",
    "user": "observation",
    "assistant": "action",
    "tool": "observation",
}


def _action_text(calls: tuple[ToolCall, ...]) -> str:
    lines = []
    for call in calls:
        values = thaw(call.arguments).values() if call.invalid_arguments is None else ()
        lines.append(
            " ".join([call.name, *(v if isinstance(v, str) else json.dumps(v) for v in values)])
        )
    return "\n".join(lines)


def _generate(message: Message, index: int) -> dict[str, Any]:
    role = message.role
    if role not in _MESSAGE_TYPES:  # pragma: no cover - every Message subclass has a role
        raise FormatError(
            f"cannot express a {type(message).__name__}", format=SWE_AGENT, index=index
        )
    content: Content = message.content if isinstance(message, (UserMessage, ToolResult)) else ""
    unit: dict[str, Any] = {
        "role": role,
        "content": openai_content(content, index=index, for_api=False, fmt=SWE_AGENT)
        if content
        else message.text,
        "agent": "main",
        "message_type": _MESSAGE_TYPES[role],
    }
    if isinstance(message, AssistantMessage):
        unit["thought"] = message.content
        unit["action"] = _action_text(message.tool_calls)
        if message.tool_calls:
            for call in message.tool_calls:
                check_call_expressible(call, fmt=SWE_AGENT, index=index)
            unit["tool_calls"] = [
                tool_call_json(call, fmt=SWE_AGENT, index=index) for call in message.tool_calls
            ]
    elif isinstance(message, ToolResult):
        unit["tool_call_ids"] = [message.tool_call_id]
    elif not isinstance(message, (SystemMessage, UserMessage)):
        raise FormatError(
            f"cannot express a {type(message).__name__}", format=SWE_AGENT, index=index
        )
    return unit


def _calls_value(raw: object, index: int) -> object:
    """``tool_calls`` as a list: SWE-agent may store its Python repr (or JSON) as a string."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise FormatError(
            f"tool_calls is a string that is neither JSON nor a Python literal: {raw[:80]!r}",
            format=SWE_AGENT,
            index=index,
        ) from exc


def _parse(raw: Mapping[str, Any], index: int, name: str | None, calls: CallNames) -> Message:
    role = raw.get("role")
    if role not in ROLES:
        raise FormatError(
            f"unknown role {role!r} (allowed: {', '.join(ROLES)})", format=SWE_AGENT, index=index
        )
    raw_content = raw.get("content")
    if role in ("user", "tool"):  # observations may carry images (SWE-bench multimodal)
        text: Content = content_of(
            raw_content,
            fmt=SWE_AGENT,
            index=index,
            joiner="\n",
            media=read_openai_part,
            media_kinds=("image_url", "file"),
        )
    else:
        text = text_of(raw_content, fmt=SWE_AGENT, index=index, joiner="\n")
    try:
        if role == "system":
            assert isinstance(text, str)
            return SystemMessage(text)
        if role == "user":
            return UserMessage(text)
        if role == "assistant":
            tool_calls = read_tool_calls(
                _calls_value(raw.get("tool_calls"), index), fmt=SWE_AGENT, index=index
            )
            assert isinstance(text, str)
            return AssistantMessage(text, tool_calls)
        ids = raw.get("tool_call_ids")
        if not isinstance(ids, list) or len(ids) != 1:
            count = len(ids) if isinstance(ids, list) else "no"
            raise FormatError(
                f"a tool observation must answer exactly one call through tool_call_ids, this "
                f"one names {count} (tinyctx pairs one result with each call)",
                format=SWE_AGENT,
                index=index,
            )
        call_id = expect_str(ids[0], "tool_call_ids[0]", fmt=SWE_AGENT, index=index)
        derived = calls.name_of(call_id, fmt=SWE_AGENT, index=index)
        return ToolResult(call_id, text, derived if name is None else name)
    except FormatError:
        raise
    except (TypeError, ValueError) as exc:
        raise FormatError(str(exc), format=SWE_AGENT, index=index) from exc


def to_swe_agent(messages: Sequence[Message]) -> dict[str, Any]:
    """tinyctx messages as a SWE-agent trajectory ``{"history": [...]}``, losslessly:
    ``from_swe_agent(to_swe_agent(m)) == m`` (what SWE-agent has no field for rides in a
    ``"tinyctx"`` key). Raises :class:`FormatError` naming the index of a message SWE-agent
    cannot express."""
    history: list[dict[str, Any]] = []
    calls = CallNames()
    for index, message in enumerate(restore_call_ids(messages)):
        generated = _generate(message, index)

        def reads_back(unit: dict[str, Any], message: Message = message, at: int = index) -> bool:
            name = message.name if isinstance(message, ToolResult) else None
            try:
                return _parse(unit, at, name, calls) == core(message)
            except FormatError:
                return False

        unit, metadata = emit_unit(
            message,
            generated,
            SWE_AGENT,
            modeled=_MODELED,
            reads_back=reads_back,
            for_api=False,
        )
        extension: dict[str, Any] = {}
        if isinstance(message, ToolResult):
            if calls.get(message.tool_call_id) != message.name:
                extension["name"] = message.name
            if message.is_error:
                extension["is_error"] = True
        history.append(write_extension(unit, message, metadata, **extension))
        calls.add(message)
    return {"history": history}


def from_swe_agent(data: Mapping[str, Any] | Sequence[Any]) -> tuple[Message, ...]:
    """A SWE-agent trajectory (its ``history``, or the history list) as tinyctx messages.

    Raises :class:`FormatError` naming the history index for an unknown role, an
    observation that answers no call or several, or malformed tool calls.
    """
    history = data.get("history") if isinstance(data, Mapping) else data
    if not isinstance(history, Sequence) or isinstance(history, (str, bytes)):
        raise FormatError(
            f"expected a trajectory with a history list, got {type(history).__name__}",
            format=SWE_AGENT,
        )
    calls = CallNames()
    out: list[Message] = []
    for index, raw in enumerate(history):
        unit = expect_mapping(raw, "a history entry", fmt=SWE_AGENT, index=index)
        role = unit.get("role")
        allowed = (
            ("essential", "metadata", "name", "is_error")
            if role == "tool"
            else (
                "essential",
                "metadata",
            )
        )
        ext = read_extension(unit, allowed=allowed, fmt=SWE_AGENT, index=index)
        parsed = _parse(unit, index, ext.name, calls)
        generated = _generate(parsed, index)
        message = finish_unit(
            parsed, unit, generated, ext, SWE_AGENT, calls, fmt=SWE_AGENT, index=index
        )
        out.append(message)
    out = unique_call_ids(out)
    check_read_pairing(out, range(len(out)), fmt=SWE_AGENT)
    return tuple(out)


# ---------------------------------------------------------------------------------------
# mini-swe-agent


def to_mini_swe_agent(messages: Sequence[Message]) -> dict[str, Any]:
    """tinyctx messages as a mini-swe-agent trajectory: OpenAI messages (file mode)."""
    return {"trajectory_format": MINI_TRAJECTORY_FORMAT, "messages": to_openai(messages)}


def read_mini_swe_agent(
    data: Mapping[str, Any],
) -> tuple[tuple[Message, ...], dict[str, Any]]:
    """The messages of a mini-swe-agent trajectory and everything else in it (its ``info``,
    format, instance id, and the ``exit`` records under ``"exit"``)."""
    raw_messages = data.get("messages") if isinstance(data, Mapping) else None
    if not isinstance(raw_messages, list):
        raise FormatError(
            "expected a mini-swe-agent trajectory with a messages list", format=MINI_SWE_AGENT
        )
    calls = CallNames()
    out: list[Message] = []
    origins: list[int] = []
    exits: list[Any] = []
    for index, raw in enumerate(raw_messages):
        if isinstance(raw, Mapping) and raw.get("role") == "exit":
            exits.append(raw)
            continue
        try:
            out.append(read_openai_message(raw, index, calls))
        except FormatError as exc:
            raise FormatError(exc.reason, format=MINI_SWE_AGENT, index=index) from exc
        origins.append(index)
    out = unique_call_ids(out)
    check_read_pairing(out, origins, fmt=MINI_SWE_AGENT)
    info = {k: v for k, v in data.items() if k != "messages"}
    if exits:
        info["exit"] = exits
    return tuple(out), info


def from_mini_swe_agent(data: Mapping[str, Any]) -> tuple[Message, ...]:
    """A mini-swe-agent trajectory's messages as tinyctx messages (fields beyond OpenAI's,
    like ``extra``, are kept in ``metadata["openai"]``; the ``exit`` record is not a message:
    :func:`tinyctx.formats.read_transcript` keeps it in ``info``)."""
    return read_mini_swe_agent(data)[0]

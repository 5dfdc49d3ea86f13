"""Real transcripts for tests and benchmarks: OpenAI chat-completions messages as tinyctx
messages.

``load_openai_jsonl(path)`` reads one JSON object per line (``role``, ``content``,
``tool_calls`` with JSON-string ``arguments``, ``tool_call_id``). Arguments that are not a
JSON object are kept verbatim in ``ToolCall.invalid_arguments``, as a provider adapter would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolResult, UserMessage

__all__ = ["messages_from_openai", "load_openai_jsonl"]


def _tool_call(raw: Mapping[str, Any]) -> ToolCall:
    function = raw["function"]
    text = function.get("arguments") or "{}"
    try:
        arguments = json.loads(text)
    except ValueError:
        arguments = None
    if isinstance(arguments, dict):
        return ToolCall(raw["id"], function["name"], arguments)
    return ToolCall(raw["id"], function["name"], invalid_arguments=text)


def messages_from_openai(records: Iterable[Mapping[str, Any]]) -> tuple[Message, ...]:
    """OpenAI chat messages (dicts) as tinyctx messages, in order."""
    messages: list[Message] = []
    for index, raw in enumerate(records):
        role = raw.get("role")
        content = raw.get("content") or ""
        if not isinstance(content, str):
            raise TypeError(f"message {index}: only string content is supported")
        if role == "assistant":
            calls = tuple(_tool_call(c) for c in raw.get("tool_calls") or ())
            messages.append(AssistantMessage(content, calls))
        elif role == "tool":
            messages.append(ToolResult(raw["tool_call_id"], content, raw.get("name") or ""))
        elif role in ("system", "developer"):
            messages.append(SystemMessage(content))
        elif role == "user":
            messages.append(UserMessage(content))
        else:
            raise ValueError(f"message {index}: unknown role {role!r}")
    return tuple(messages)


def load_openai_jsonl(path: str | os.PathLike[str]) -> tuple[Message, ...]:
    """A JSONL file of OpenAI chat messages (one per line) as tinyctx messages."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return messages_from_openai(json.loads(line) for line in lines if line.strip())

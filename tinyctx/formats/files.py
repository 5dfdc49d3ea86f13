"""Transcript files: read (and detect) OpenAI JSON/JSONL, Anthropic messages JSON/JSONL,
SWE-agent ``.traj``, mini-swe-agent ``.traj.json``, Claude Code session logs, OpenHands
``output.jsonl``, tau-bench results and Agent TARS run logs; write the lossless formats back."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, get_args

from attrs import field, frozen

from ..frozen import EMPTY, FrozenDict, frozen_mapping
from ..messages import Message
from ._common import FormatError
from .agent_logs import (
    OPENHANDS,
    TAU_BENCH,
    from_openhands,
    from_tau_bench,
    is_openhands_record,
    is_tau_bench_record,
    select_record,
)
from .agent_tars import from_agent_tars, is_agent_tars
from .anthropic import ANTHROPIC, from_anthropic, to_anthropic
from .claude_code import claude_code_messages
from .openai import OPENAI, from_openai, to_openai
from .swe_agent import (
    MINI_SWE_AGENT,
    SWE_AGENT,
    from_swe_agent,
    read_mini_swe_agent,
    to_mini_swe_agent,
    to_swe_agent,
)

__all__ = [
    "TranscriptFormat",
    "FORMATS",
    "Transcript",
    "detect_format",
    "parse_transcript",
    "read_transcript",
    "load_transcript",
    "format_transcript",
    "write_transcript",
]

TranscriptFormat = Literal[
    "openai",
    "anthropic",
    "swe_agent",
    "mini_swe_agent",
    "claude_code",
    "openhands",
    "tau_bench",
    "agent_tars",
]
FORMATS: Final[tuple[str, ...]] = get_args(TranscriptFormat)
_ANTHROPIC_BLOCKS: Final = frozenset(
    {"tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document"}
)
_PathLike = str | os.PathLike[str]


@frozen
class Transcript:
    """The messages of a transcript file, its format, and what else the file holds.

    ``info`` keeps the file's non-message content (for a file of several runs, the chosen
    run's fields and ``records``, how many the file holds): a SWE-agent trajectory's ``info``,
    ``environment`` and ``trajectory``; a mini-swe-agent run's ``info`` and its ``exit``
    records; the other fields of a request-shaped JSON (model, settings).
    """

    messages: tuple[Message, ...]
    format: TranscriptFormat
    info: FrozenDict[str, Any] = field(default=EMPTY, converter=frozen_mapping)
    path: str | None = None


# ---------------------------------------------------------------------------------------
# detection


def _looks_anthropic(items: Sequence[Any]) -> bool:
    for item in items:
        if not isinstance(item, Mapping):
            continue
        if item.get("role") in ("tool", "system", "developer") or item.get("tool_calls"):
            return False
        content = item.get("content")
        if not isinstance(content, list):
            continue
        if any(isinstance(b, Mapping) and b.get("type") in _ANTHROPIC_BLOCKS for b in content):
            return True
        if item.get("role") == "assistant":  # OpenAI assistants answer with a string or null
            return True
    return False


def _detect_list(items: Sequence[Any]) -> TranscriptFormat:
    for item in items:
        if isinstance(item, Mapping):
            if is_openhands_record(item):
                return "openhands"
            if is_tau_bench_record(item):
                return "tau_bench"
            if "message_type" in item:
                return "swe_agent"
            if item.get("type") in ("user", "assistant") and isinstance(
                item.get("message"), Mapping
            ):
                return "claude_code"
            if "sessionId" in item or item.get("type") in ("summary", "file-history-snapshot"):
                return "claude_code"
    return "anthropic" if _looks_anthropic(items) else "openai"


def detect_format(value: Any) -> TranscriptFormat:
    """Which transcript format a parsed JSON document (or the list of JSONL records) is."""
    if is_agent_tars(value):
        return "agent_tars"
    if isinstance(value, Mapping):
        if is_openhands_record(value):
            return "openhands"
        if is_tau_bench_record(value):
            return "tau_bench"
        if "history" in value:
            return "swe_agent"
        trajectory_format = value.get("trajectory_format")
        messages = value.get("messages")
        if isinstance(trajectory_format, str) and trajectory_format.startswith("mini-swe-agent"):
            return "mini_swe_agent"
        if isinstance(messages, list):
            if any(isinstance(m, Mapping) and m.get("role") == "exit" for m in messages):
                return "mini_swe_agent"
            if "system" in value or _looks_anthropic(messages):
                return "anthropic"
            return "openai"
        if "role" in value:
            return _detect_list([value])
        raise FormatError(
            "cannot tell the transcript format: expected a list of messages, a request-shaped "
            f"object with 'messages', or a trajectory with 'history'; got keys {sorted(value)[:8]}",
            format="transcript",
        )
    if isinstance(value, list):
        return _detect_list(value)
    raise FormatError(
        f"cannot tell the transcript format of a JSON {type(value).__name__}", format="transcript"
    )


# ---------------------------------------------------------------------------------------
# reading


def _records(text: str, path: str | None) -> tuple[Any, list[int] | None]:
    """The JSON document, or the JSONL records and their 1-based line numbers."""
    if not text.strip():
        return [], []
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        if not exc.msg.startswith("Extra data"):
            raise FormatError(
                f"bad JSON: {exc.msg} (column {exc.colno})",
                format="json",
                line=exc.lineno,
                path=path,
            ) from exc
    records: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.split("\n"), start=1):  # JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise FormatError(
                f"bad JSON: {exc.msg} (column {exc.colno})", format="jsonl", line=number, path=path
            ) from exc
        lines.append(number)
    return records, lines


def _rest(document: Any, *keys: str) -> dict[str, Any]:
    if isinstance(document, Mapping):
        return {k: v for k, v in document.items() if k not in keys}
    return {}


def _convert(
    document: Any, fmt: TranscriptFormat, origins: list[int], record: int = 0
) -> tuple[tuple[Message, ...], dict[str, Any]]:
    """The messages and info of ``document``; ``origins`` receives, for a format whose
    messages are not one per record, the record each message came from."""
    if fmt in (OPENHANDS, TAU_BENCH):
        chosen = select_record(document, record, fmt)
        count = {"records": len(document) if isinstance(document, list) else 1}
        if fmt == OPENHANDS:
            return from_openhands(chosen), {**_rest(chosen, "history"), **count}
        return from_tau_bench(chosen), {**_rest(chosen, "traj"), **count}
    if fmt == "openai":
        if isinstance(document, Mapping) and "role" in document:
            document = [document]
        return from_openai(document), _rest(document, "messages")
    if fmt == "anthropic":
        if isinstance(document, Mapping) and "role" in document:
            document = [document]
        return from_anthropic(document), _rest(document, "messages", "system")
    if fmt == "swe_agent":
        return from_swe_agent(document), _rest(document, "history")
    if fmt == "mini_swe_agent":
        return read_mini_swe_agent(document)
    if fmt == "agent_tars":
        return from_agent_tars(document), {}
    entries = document if isinstance(document, list) else [document]
    raw, where = claude_code_messages(entries)
    origins.extend(where)
    return from_anthropic(raw), {}


def parse_transcript(
    text: str,
    *,
    format: TranscriptFormat | None = None,
    path: str | None = None,
    record: int = 0,
) -> Transcript:
    """A transcript from JSON or JSONL ``text``; ``format=None`` detects it.

    ``record`` picks one run of a file that holds several (OpenHands ``output.jsonl``, one
    instance per line; tau-bench results, one task per entry), counted from 0.

    Errors are :class:`FormatError` naming the file, the JSONL line (or the message index
    in a JSON document) and what is wrong.
    """
    if format is not None and format not in FORMATS:
        raise FormatError(
            f"unknown format {format!r} (allowed: {', '.join(FORMATS)})", format="transcript"
        )
    document, lines = _records(text, path)
    fmt: TranscriptFormat = format if format is not None else detect_format(document)
    origins: list[int] = []
    try:
        messages, info = _convert(document, fmt, origins, record)
    except FormatError as exc:
        index, line = exc.index, None
        if index is not None and origins:
            index = origins[index]  # the entry of the log, not the merged message
        if index is not None and lines is not None and index < len(lines):
            line = lines[index]
        raise FormatError(exc.reason, format=fmt, index=index, line=line, path=path) from exc
    return Transcript(messages, fmt, info, path)


def read_transcript(
    path: _PathLike, *, format: TranscriptFormat | None = None, record: int = 0
) -> Transcript:
    """Read a transcript file (UTF-8 JSON or JSONL), detecting its format unless given."""
    name = os.fspath(path)
    text = Path(name).read_text(encoding="utf-8")
    return parse_transcript(text, format=format, path=name, record=record)


def load_transcript(
    path: _PathLike, *, format: TranscriptFormat | None = None, record: int = 0
) -> tuple[Message, ...]:
    """The messages of a transcript file (see :func:`read_transcript`)."""
    return read_transcript(path, format=format, record=record).messages


# ---------------------------------------------------------------------------------------
# writing


def format_transcript(
    messages: Sequence[Message], format: TranscriptFormat = "openai", *, jsonl: bool | None = None
) -> str:
    """``messages`` as the text of a transcript file that reads back to the same messages.

    OpenAI and Anthropic default to JSONL (one message per line; Anthropic needs JSON when
    the history starts with system messages); the trajectory formats are JSON. Claude Code
    logs are read only.
    """
    if format == OPENAI:
        rows: list[Any] = to_openai(messages)
        document: Any = rows
    elif format == ANTHROPIC:
        converted = to_anthropic(messages)
        rows, document = converted["messages"], converted
        if "system" in converted:
            if jsonl:
                raise FormatError(
                    "cannot write JSONL: the history starts with system messages, which "
                    "Anthropic keeps beside the messages; write JSON",
                    format=ANTHROPIC,
                )
            jsonl = False
    elif format == SWE_AGENT:
        document, jsonl = to_swe_agent(messages), False
    elif format == MINI_SWE_AGENT:
        document, jsonl = to_mini_swe_agent(messages), False
    else:
        raise FormatError(
            f"cannot write {format!r} (writable: openai, anthropic, swe_agent, mini_swe_agent)",
            format="transcript",
        )
    if jsonl is None or jsonl:
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return json.dumps(document, ensure_ascii=False, indent=1) + "\n"


def write_transcript(
    messages: Sequence[Message],
    path: _PathLike,
    format: TranscriptFormat = "openai",
    *,
    jsonl: bool | None = None,
) -> None:
    """Write ``messages`` to ``path`` (UTF-8) with :func:`format_transcript`."""
    Path(os.fspath(path)).write_text(
        format_transcript(messages, format, jsonl=jsonl), encoding="utf-8"
    )

"""Claude Code session logs (JSONL) -> tinyctx messages (read only).

A session log has one entry per line. Entries of type ``user`` and ``assistant`` carry an
Anthropic ``message``; Claude Code writes one entry per content block, so the blocks of one
API response share ``message.id`` and may be interleaved with the tool results that answer
them. The other entries (progress, hook summaries, file snapshots, queue operations) are
the tool's own bookkeeping, not conversation, and are not messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..messages import Message
from ._common import FormatError
from .anthropic import from_anthropic

__all__ = ["CLAUDE_CODE", "from_claude_code", "claude_code_messages"]

CLAUDE_CODE: Final = "claude_code"
_CONVERSATION: Final = ("user", "assistant")


def claude_code_messages(
    entries: Sequence[Any],
) -> tuple[list[dict[str, Any]], list[int]]:
    """The Anthropic messages of a session log and, for each, the index of its first entry.

    Blocks of one response (same ``message.id``) are merged into the first of them, with
    the response-level fields of the last (its final ``stop_reason`` and ``usage``). Entries
    of a side chain (a sub-agent logged into the same file) are left to their own log: only
    entries on the same chain as the first conversation entry are read.
    """
    messages: list[dict[str, Any]] = []
    origins: list[int] = []
    by_id: dict[str, int] = {}
    chain: bool | None = None
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise FormatError(
                f"an entry must be a JSON object, got {type(entry).__name__}",
                format=CLAUDE_CODE,
                index=index,
            )
        message = entry.get("message")
        if entry.get("type") not in _CONVERSATION or not isinstance(message, Mapping):
            continue
        side = bool(entry.get("isSidechain", False))
        if chain is None:
            chain = side
        elif side != chain:
            continue
        content = message.get("content")
        response_id = message.get("id") if message.get("role") == "assistant" else None
        if isinstance(response_id, str) and response_id in by_id:
            merged = messages[by_id[response_id]]
            blocks = content if isinstance(content, list) else [content]
            merged.update({k: v for k, v in message.items() if k != "content"})
            merged["content"] = [*merged["content"], *blocks]
            continue
        copy = dict(message)
        if response_id is not None:
            copy["content"] = list(content) if isinstance(content, list) else [content]
            by_id[response_id] = len(messages)
        messages.append(copy)
        origins.append(index)
    return messages, origins


def from_claude_code(entries: Sequence[Any]) -> tuple[Message, ...]:
    """The conversation of a Claude Code session log (its parsed JSONL entries).

    Raises :class:`FormatError` naming the entry index (the 0-based line of the log) of what
    cannot be read.
    """
    messages, origins = claude_code_messages(entries)
    try:
        return from_anthropic(messages)
    except FormatError as exc:
        index = origins[exc.index] if exc.index is not None else None
        raise FormatError(exc.reason, format=CLAUDE_CODE, index=index) from exc

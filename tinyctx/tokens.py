"""Token accounting: count messages, tool schemas and the system prompt.

:class:`TokenCounter` is the protocol every layer uses; :class:`HeuristicCounter` is the fast
default. Counts are memoized per message object, so re-checking a long, growing history
costs a lookup per old message and real work only for new ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .frozen import thaw
from .messages import AssistantMessage, Message, ToolResult
from .model import ModelRequest
from .tools import ToolSpec

__all__ = ["TokenCounter", "HeuristicCounter", "default_counter"]


@runtime_checkable
class TokenCounter(Protocol):
    """Estimates how many tokens a prompt costs."""

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Message) -> int: ...

    def count_messages(self, messages: Sequence[Message]) -> int: ...

    def count_tools(self, tools: Sequence[ToolSpec]) -> int: ...

    def count_request(self, request: ModelRequest) -> int: ...


class HeuristicCounter:
    """Characters per token plus a per-message overhead; memoized per message.

    ``chars_per_token`` and ``message_overhead`` are the two knobs.
    """

    def __init__(
        self,
        *,
        chars_per_token: float = 4.0,
        message_overhead: int = 4,
        max_memo: int = 200_000,
    ) -> None:
        if chars_per_token <= 0:
            raise ValueError("chars_per_token must be > 0")
        self.chars_per_token = chars_per_token
        self.message_overhead = message_overhead
        self._max_memo = max_memo
        # id(message) -> (message, count): the message is kept alive so its id stays valid
        self._memo: dict[int, tuple[Message, int]] = {}

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        return max(1, round(len(text) / self.chars_per_token))

    def _measure(self, message: Message) -> int:
        total = self.message_overhead + self.count_text(message.text)
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                total += self.count_text(call.name) + self.count_text(
                    json.dumps(thaw(call.arguments), ensure_ascii=False)
                )
        elif isinstance(message, ToolResult):
            total += self.count_text(message.tool_call_id)
        return total

    def count_message(self, message: Message) -> int:
        entry = self._memo.get(id(message))
        if entry is not None and entry[0] is message:
            return entry[1]
        count = self._measure(message)
        if len(self._memo) >= self._max_memo:
            self._memo.clear()
        self._memo[id(message)] = (message, count)
        return count

    def count_messages(self, messages: Sequence[Message]) -> int:
        return sum(self.count_message(m) for m in messages)

    def count_tools(self, tools: Sequence[ToolSpec]) -> int:
        return sum(
            self.count_text(t.name)
            + self.count_text(t.description)
            + self.count_text(json.dumps(thaw(t.parameters)))
            for t in tools
        )

    def count_request(self, request: ModelRequest) -> int:
        return (
            self.count_messages(request.messages)
            + self.count_tools(request.tools)
            + self.count_text(request.system_prompt or "")
        )


_DEFAULT: HeuristicCounter | None = None


def default_counter() -> HeuristicCounter:
    """The shared heuristic counter layers use when none is configured."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = HeuristicCounter()
    return _DEFAULT

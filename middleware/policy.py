"""The context-pressure policy protocol shared by the budget guard and compaction layers.

A policy takes a history and returns a relieved one plus what it freed. The same object
serves as a standalone layer (``Microcompact``, ``Summarize``) and as one step of a
``BudgetGuard``; pure, synchronous history functions sit underneath both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen

from tinyctx import Message, RunContext
from tinyctx.frozen import FrozenDict
from tinyctx.tokens import TokenCounter

__all__ = ["Relief", "PressurePolicy"]


def _messages(value: Any) -> tuple[Message, ...]:
    return value if type(value) is tuple else tuple(value)


def _detail(value: Mapping[str, Any] | None) -> FrozenDict[str, Any]:
    return value if isinstance(value, FrozenDict) else FrozenDict(value or {})


@frozen
class Relief:
    """What a policy did: the new history, tokens freed (estimate), and its own stats.

    A policy that failed returns the history unchanged with ``error`` set (raising works
    too); a budget guard counts either as a failure for its circuit breaker.
    """

    messages: tuple[Message, ...] = field(converter=_messages)
    freed_tokens: int = 0
    detail: FrozenDict[str, Any] = field(factory=FrozenDict, converter=_detail)
    error: str | None = field(default=None, kw_only=True)

    @property
    def changed(self) -> bool:
        return self.freed_tokens > 0

    @property
    def failed(self) -> bool:
        return self.error is not None


@runtime_checkable
class PressurePolicy(Protocol):
    """One step a budget guard can take to bring a prompt back under its target.

    ``need`` is how many tokens the guard still has to free; a policy may free more (it
    clears everything it is allowed to) or less (then the guard moves on). A policy must
    keep tool calls paired with their results, never drop a system message, and leave the
    history unchanged (returning it as is) when it has nothing to do or fails — a failure is
    reported with ``Relief(messages, error=...)`` or by raising.
    """

    name: str

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief: ...

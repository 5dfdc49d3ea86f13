"""Trim the oldest messages: the context-pressure policy of last resort.

Removes messages from the start of the history, keeping every system message (wherever
it stands) and at least the newest ``keep_recent`` messages. Cuts only where no tool call
is separated from its results (:func:`tinyctx.safe_boundaries`), so a tool turn goes as a
whole or stays as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinyctx import ConfigError, Message, RunContext, SystemMessage, safe_boundaries, snap_boundary
from tinyctx.tokens import TokenCounter, default_counter

from .policy import Relief

__all__ = ["TrimOldest", "trim_oldest", "check_keep", "check_name"]


def check_keep(value: Any, *, field: str = "keep_recent", owner: str = "") -> int:
    """Validate a keep count (an integer >= 0) or raise ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(field, value, "an integer >= 0 (messages)", owner=owner)
    return value


def check_name(value: Any, *, owner: str = "") -> str:
    """Validate a policy name (a non-empty string) or raise ConfigError."""
    if not isinstance(value, str) or not value:
        raise ConfigError("name", value, "a non-empty string", owner=owner)
    return value


def trim_oldest(
    messages: Sequence[Message],
    *,
    keep_recent: int,
    need: int | None = None,
    counter: TokenCounter | None = None,
) -> Relief:
    """Remove the oldest non-system messages until ``need`` tokens are freed (when None:
    everything older than the newest ``keep_recent`` messages).

    Pure: the cut is the first safe boundary at which enough is freed, never later than
    the safe boundary at or before ``len - keep_recent``. Returns a :class:`Relief` with
    ``detail = {"removed": n, "kept": m}``; the input as is when nothing is removed.
    """
    check_keep(keep_recent, owner="trim_oldest")
    history = tuple(messages)
    n = len(history)
    unchanged = Relief(history, 0, {"removed": 0, "kept": n})
    if n == 0 or (need is not None and need <= 0):
        return unchanged
    count = (counter or default_counter()).count_message
    safe = safe_boundaries(history)
    limit = snap_boundary(history, n - keep_recent, direction="backward", boundaries=safe)
    cut = limit
    if need is not None:
        freed = 0
        for index in range(limit):
            message = history[index]
            if not isinstance(message, SystemMessage):
                freed += count(message)
            if freed >= need and safe[index + 1]:
                cut = index + 1
                break
    head = history[:cut]
    removed = [m for m in head if not isinstance(m, SystemMessage)]
    if not removed:
        return unchanged
    kept = (*(m for m in head if isinstance(m, SystemMessage)), *history[cut:])
    freed_tokens = sum(count(m) for m in removed)
    return Relief(kept, freed_tokens, {"removed": len(removed), "kept": len(kept)})


class TrimOldest:
    """Context-pressure policy: :func:`trim_oldest` with the guard's ``need``.

    ``keep_recent`` (default 4) messages at the end are never removed; 0 lets the guard
    trim down to the system messages.
    """

    role = "trim"
    breaker_group: str | None = None

    def __init__(self, keep_recent: int = 4, *, name: str = "TrimOldest") -> None:
        self.keep_recent = check_keep(keep_recent, owner="TrimOldest")
        self.name = check_name(name, owner="TrimOldest")

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        return trim_oldest(messages, keep_recent=self.keep_recent, need=need, counter=counter)

    def __repr__(self) -> str:
        return f"TrimOldest(keep_recent={self.keep_recent}, name={self.name!r})"

"""Trim the oldest messages: the context-pressure policy of last resort.

Removes messages from the start of the history, keeping every system message (wherever
it stands) and at least the newest ``keep_recent`` messages. Cuts only where no tool call
is separated from its results (:func:`tinyctx.messages.safe_boundaries`), so a tool turn goes as a
whole or stays as a whole.

A summarized history starts with a digest: the summaries :class:`Summarize` wrote, and the
task it keeps in front of them. They stand for everything before them in a few tokens, so
the oldest raw turns after them go first; the digest goes only when that is not enough
(its summaries oldest first, the task last).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinyctx import Message, RunContext, SystemMessage, UserMessage
from tinyctx.config import flag, integer, text
from tinyctx.messages import safe_boundaries, snap_boundary
from tinyctx.tokens import TokenCounter, default_counter

from .policy import Relief
from .summarize import digest_end, is_summary

__all__ = ["TrimOldest", "trim_oldest", "digest_end", "check_keep", "check_name"]


_KEEP = integer(minimum=0, allowed="an integer >= 0 (messages)")
_NAME = text()


def check_keep(value: Any, *, field: str = "keep_recent", owner: str = "") -> int:
    """Validate a keep count (an integer >= 0) or raise ConfigError naming it."""
    return _KEEP.check(value, field, owner)


def check_name(value: Any, *, owner: str = "") -> str:
    """Validate a policy name (a non-empty string) or raise ConfigError."""
    return _NAME.check(value, "name", owner)


def trim_oldest(
    messages: Sequence[Message],
    *,
    keep_recent: int,
    need: int | None = None,
    counter: TokenCounter | None = None,
    keep_task: bool = False,
) -> Relief:
    """Remove the oldest non-system messages until ``need`` tokens are freed (when None:
    everything older than the newest ``keep_recent`` messages).

    ``keep_task=True`` treats the first user message, when it is the first message after
    the system messages, as a one-message digest: it goes last, only when nothing else
    frees enough (as the task a summary keeps in front of it does).

    Pure: the cut is the first safe boundary at which enough is freed, never later than
    the safe boundary at or before ``len - keep_recent``. A summarized history's digest
    (:func:`digest_end`) is skipped over: the cut starts after it, and the digest's own
    messages go only when everything up to that limit was not enough. Returns a
    :class:`Relief` with ``detail = {"removed": n, "kept": m}``; the input as is when
    nothing is removed.
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
    digest = min(digest_end(history), limit)
    if keep_task and digest == 0:
        digest = min(_task_end(history, safe), limit)
    cut = limit
    freed = 0
    if need is not None:
        for index in range(digest, limit):
            message = history[index]
            if not isinstance(message, SystemMessage):
                freed += count(message)
            if freed >= need and safe[index + 1]:
                cut = index + 1
                break
    # the digest (summaries oldest first, the task last) goes only when the raw turns after
    # it, all of them up to the kept tail, did not free enough
    gone = {i for i in range(digest, cut) if not isinstance(history[i], SystemMessage)}
    if digest and cut == limit and (need is None or freed < need):
        pinned = [i for i in range(digest) if not isinstance(history[i], SystemMessage)]
        if pinned and not is_summary(history[pinned[0]]):
            pinned.append(pinned.pop(0))  # the task
        for index in pinned:
            if need is not None and freed >= need:
                break
            gone.add(index)
            freed += count(history[index])
    if not gone:
        return unchanged
    kept = tuple(m for i, m in enumerate(history) if i not in gone)
    freed_tokens = sum(count(history[i]) for i in gone)
    return Relief(kept, freed_tokens, {"removed": len(gone), "kept": len(kept)})


def _task_end(history: tuple[Message, ...], safe: Sequence[bool]) -> int:
    """Just after the first message when it is (after system messages) a user message
    with a safe boundary after it; else 0."""
    for index, message in enumerate(history):
        if isinstance(message, SystemMessage):
            continue
        return index + 1 if isinstance(message, UserMessage) and safe[index + 1] else 0
    return 0


class TrimOldest:
    """Context-pressure policy: :func:`trim_oldest` with the guard's ``need``.

    ``keep_recent`` (default 4) messages at the end are never removed; 0 lets the guard
    trim down to the system messages. After a summary, the raw turns that follow it go
    before the summary and the task in front of it; ``keep_task=True`` keeps the first user
    message (the task) the same way when there is no summary yet.
    """

    role = "trim"
    breaker_group: str | None = None

    def __init__(
        self, keep_recent: int = 4, *, keep_task: bool = False, name: str = "TrimOldest"
    ) -> None:
        self.keep_recent = check_keep(keep_recent, owner="TrimOldest")
        self.keep_task = flag().check(keep_task, "keep_task", "TrimOldest")
        self.name = check_name(name, owner="TrimOldest")

    async def relieve(
        self,
        messages: tuple[Message, ...],
        ctx: RunContext[Any],
        counter: TokenCounter,
        *,
        need: int,
    ) -> Relief:
        return trim_oldest(
            messages,
            keep_recent=self.keep_recent,
            need=need,
            counter=counter,
            keep_task=self.keep_task,
        )

    def __repr__(self) -> str:
        return (
            f"TrimOldest(keep_recent={self.keep_recent}, keep_task={self.keep_task}, "
            f"name={self.name!r})"
        )

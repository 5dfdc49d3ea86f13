"""Optional store protocols for a thread's whole life, and the values they exchange.

A :class:`~tinyctx.threads.ThreadStore` keeps working without any of these; a store that
implements one gets the matching capability done cheaply (the built-in stores implement
all of them, and the conformance suite holds them to one behaviour):

- :class:`ThreadWindowStore`: read a slice of the live log (pages, usage without messages);
- :class:`ArchivePruneStore`: drop a thread's archived originals older than an age.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from attrs import frozen

from .threads import check_thread_id

__all__ = [
    "ThreadWindow",
    "ThreadWindowStore",
    "ArchivePruneStore",
    "check_window_args",
    "check_age",
    "window_of",
]


@frozen
class ThreadWindow:
    """Live messages ``[start, start + len(messages))`` of a thread, read in one snapshot.

    ``length`` is the live log's length and ``version`` the thread's version at that
    snapshot; ``checkpoint`` and ``state`` are the thread's documents then (read without
    any message when the window is empty).
    """

    thread_id: str
    version: int
    length: int
    start: int
    messages: tuple[str, ...]
    checkpoint: str | None = None
    state: str | None = None


@runtime_checkable
class ThreadWindowStore(Protocol):
    """A thread store that reads a slice of the live log without the rest of it."""

    async def load_window(
        self, thread_id: str, *, stop: int | None = None, count: int
    ) -> ThreadWindow:
        """The newest ``count`` messages before index ``stop`` (None: the end of the log):
        the live messages ``[max(0, s - count), s)`` where ``s = min(stop, length)``.

        ``count=0`` reads the version, length, checkpoint and state alone. An unknown
        thread is an empty window at version 0.
        """
        ...


def check_window_args(thread_id: str, stop: int | None, count: int) -> None:
    """The argument checks of :meth:`ThreadWindowStore.load_window` (``ValueError`` naming
    the argument and what it may be)."""
    check_thread_id(thread_id)
    if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int) or stop < 0):
        raise ValueError(f"load_window(stop={stop!r}): stop must be None or an integer >= 0")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"load_window(count={count!r}): count must be an integer >= 0")


def window_of(
    thread_id: str,
    version: int,
    docs: Sequence[str],
    stop: int | None,
    count: int,
    checkpoint: str | None = None,
    state: str | None = None,
) -> ThreadWindow:
    """The window a whole log ``docs`` holds (what a store without a cheaper read does)."""
    length = len(docs)
    end = length if stop is None else min(stop, length)
    start = max(0, end - count)
    return ThreadWindow(
        thread_id, version, length, start, tuple(docs[start:end]), checkpoint, state
    )


@runtime_checkable
class ArchivePruneStore(Protocol):
    """A thread store that drops archived originals older than an age, on request (the
    application schedules it; ``archive_retention`` does it on every compaction)."""

    async def prune_archive(self, thread_id: str, *, older_than: float) -> int:
        """Remove the thread's archived ranges archived more than ``older_than`` seconds
        ago; how many were removed. Versions before them can no longer be rebuilt."""
        ...


def check_age(older_than: object) -> float:
    """``older_than`` as seconds >= 0, else ``ValueError`` naming it."""
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, (int, float))
        or not older_than >= 0
        or older_than == float("inf")
    ):
        raise ValueError(f"prune_archive(older_than={older_than!r}): seconds >= 0, finite")
    return float(older_than)

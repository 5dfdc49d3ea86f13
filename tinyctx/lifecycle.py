"""Optional store protocols for a thread's whole life, and the values they exchange.

A :class:`~tinyctx.threads.ThreadStore` keeps working without any of these; a store that
implements one gets the matching capability done cheaply (the built-in stores implement
all of them, and the conformance suite holds them to one behaviour):

- :class:`ThreadWindowStore`: read a slice of the live log (pages, usage without messages).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from attrs import frozen

from .threads import check_thread_id

__all__ = ["ThreadWindow", "ThreadWindowStore", "check_window_args", "window_of"]


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

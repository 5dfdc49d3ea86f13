"""The cyclic collector held off while a long thread's documents are read or decoded.

Reading a 2,000-message thread allocates thousands of small acyclic objects (row tuples,
then messages) in one synchronous stretch. The collector would scan the whole heap
several times meanwhile and find nothing to free; in a serving process with a large heap
that cost a load 0.5-1 ms. It runs again as soon as the stretch ends.

A store reads in a thread of its own, so a process may fork while that thread holds the
collector off: the child has no such thread to turn it back on, so it does so at once.
"""

from __future__ import annotations

import gc
import os
import threading
from typing import Final

__all__ = ["PAUSE_FROM", "gc_paused"]

PAUSE_FROM: Final = 64
"""Below this many documents the collector is left alone (the pause is not worth it)."""

_holders: set[int] = set()
"""The threads holding the collector off now (``set.add``/``discard`` are atomic)."""


class gc_paused:
    """``with gc_paused(count):`` holds the collector off when ``count`` documents are
    over :data:`PAUSE_FROM` and it is on; it never re-enables a collector it did not stop
    (an application that turned it off keeps it off)."""

    __slots__ = ("_paused",)

    def __init__(self, count: int) -> None:
        self._paused = count > PAUSE_FROM and gc.isenabled()

    def __enter__(self) -> None:
        if self._paused:
            _holders.add(threading.get_ident())
            gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._paused:
            gc.enable()
            _holders.discard(threading.get_ident())


def _after_fork_in_child() -> None:
    # the threads that held the collector off did not come along: nobody would turn it on
    if _holders:
        _holders.clear()
        gc.enable()


os.register_at_fork(after_in_child=_after_fork_in_child)

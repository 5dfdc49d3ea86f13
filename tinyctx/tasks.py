"""Background work owned by a Session's task group: nothing is fire-and-forget.

A layer starts work with ``ctx.background.spawn(...)``; the Session that owns the group
waits for it (up to a grace period) and then cancels it when the session ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from .errors import TinyCtxError
from .events import BackgroundTaskFailed, Event
from .streaming import STREAMED

if TYPE_CHECKING:
    from .events import EventSink

__all__ = ["BackgroundTasks"]


class BackgroundTasks:
    """Spawns tasks into a task group the framework owns and tracks how many still run."""

    __slots__ = ("_closed", "_events", "_group", "_idle", "_running")

    def __init__(self, group: TaskGroup, events: EventSink | None = None) -> None:
        self._group = group
        self._events = events
        self._running = 0
        self._idle: anyio.Event | None = None
        self._closed = False

    @property
    def running(self) -> int:
        return self._running

    def spawn(
        self,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        name: str | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        report: Callable[[Event], None] | None = None,
    ) -> None:
        """Start ``fn(*args)`` in the session's group; the caller does not wait for it.

        An exception is reported (``on_error`` and a BackgroundTaskFailed event) instead of
        tearing down the session; cancellation propagates as it must.
        """
        if self._closed:
            raise TinyCtxError("the session that owns these background tasks has ended")
        label: str = name or str(getattr(fn, "__qualname__", repr(fn)))
        self._running += 1
        if report is None and self._events is not None:
            report = self._events.emit
        self._group.start_soon(self._run, fn, args, label, on_error, report)

    async def _run(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        label: str,
        on_error: Callable[[BaseException], None] | None,
        report: Callable[[Event], None] | None,
    ) -> None:
        # background work is no part of the streamed run that started it: its model calls
        # do not stream for it, and its events stay out of that run's stream
        STREAMED.set(False)
        try:
            await fn(*args)
        except Exception as exc:
            if on_error is not None:
                on_error(exc)
            if report is not None:
                report(BackgroundTaskFailed(task=label, error=f"{type(exc).__name__}: {exc}"))
        finally:
            self._running -= 1
            if self._running == 0 and self._idle is not None:
                self._idle.set()
                self._idle = None

    async def wait_idle(self) -> None:
        """Return when no spawned task is running."""
        while self._running:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()
        await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        self._closed = True

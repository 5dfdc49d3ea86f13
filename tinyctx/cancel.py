"""Cooperative cancellation: a latching token shared by a run and everything it starts.

The token is plain state, so it can be created anywhere (module import, a sync callback,
before any event loop runs). Waiting is done with anyio cancel scopes registered on the
token: ``cancel()`` cancels every registered scope directly, with no watcher task, so
racing an operation against the token costs one cancel scope.
"""

from __future__ import annotations

import functools
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Generator
from contextlib import contextmanager
from typing import TypeVar

import anyio
import anyio.lowlevel
import sniffio

from .errors import RunCancelled

__all__ = ["CancellationToken", "SchedulerCheckpoint", "scheduler_checkpoint"]

T = TypeVar("T")


class CancellationToken:
    """``cancel()`` latches; ``child()`` tokens follow their parent, never the reverse.

    Call ``cancel()`` from the thread running the event loop (from another thread use
    ``anyio.from_thread.run_sync(token.cancel)``).
    """

    __slots__ = ("__weakref__", "_cancelled", "_children", "_reason", "_scopes")

    def __init__(self) -> None:
        self._cancelled = False
        self._reason: str | None = None
        # both made on first use: most tokens (one per derived call) never need them
        self._scopes: set[anyio.CancelScope] | None = None
        self._children: weakref.WeakSet[CancellationToken] | None = None

    def __repr__(self) -> str:
        state = "cancelled" if self._cancelled else "active"
        return f"<CancellationToken {state}>"

    @property
    def reason(self) -> str | None:
        return self._reason

    def is_cancelled(self) -> bool:
        return self._cancelled

    def cancel(self, reason: str | None = None) -> None:
        """Cancel this token and every child; idempotent (the first reason is kept)."""
        if self._cancelled:
            return
        self._cancelled = True
        self._reason = reason
        scopes, self._scopes = self._scopes, None
        for scope in scopes or ():
            scope.cancel()
        for child in list(self._children or ()):
            child.cancel(reason)

    def child(self) -> CancellationToken:
        """A token cancelled with this one; cancelling the child leaves this one alone."""
        token = CancellationToken()
        if self._cancelled:
            token._cancelled = True
            token._reason = self._reason
        else:
            if self._children is None:
                self._children = weakref.WeakSet()
            self._children.add(token)
        return token

    def _watch(self, scope: anyio.CancelScope) -> None:
        if self._scopes is None:
            self._scopes = set()
        self._scopes.add(scope)

    def _unwatch(self, scope: anyio.CancelScope) -> None:
        if self._scopes is not None:
            self._scopes.discard(scope)

    def raise_if_cancelled(self, checkpoint: str = "") -> None:
        if self._cancelled:
            raise RunCancelled(checkpoint, self._reason)

    @contextmanager
    def linked_scope(self, checkpoint: str = "") -> Generator[anyio.CancelScope, None, None]:
        """A cancel scope that this token cancels; leaving it cancelled raises RunCancelled.

        Use it to race an operation (a streamed chunk, a hanging call) against the token.
        Do not ``yield`` from an async generator while inside it.
        """
        self.raise_if_cancelled(checkpoint)
        scope = anyio.CancelScope()
        self._watch(scope)
        try:
            with scope:
                yield scope
        finally:
            self._unwatch(scope)
        if scope.cancelled_caught and self._cancelled:
            raise RunCancelled(checkpoint, self._reason)

    async def cancelled(self) -> None:
        """Return once the token is cancelled; safe to cancel (use it in a task group race)."""
        if self._cancelled:
            await anyio.lowlevel.checkpoint()
            return
        scope = anyio.CancelScope()
        self._watch(scope)
        try:
            with scope:
                await anyio.sleep_forever()
        finally:
            self._unwatch(scope)

    async def race(self, fn: Callable[[], Awaitable[T]], checkpoint: str = "") -> T:
        """Await ``fn()`` unless the token is cancelled first (then raise RunCancelled)."""
        with self.linked_scope(checkpoint):
            return await fn()
        raise RunCancelled(checkpoint, self._reason)  # pragma: no cover - scope raised above


def scheduler_checkpoint() -> Callable[[], Awaitable[None]]:
    """``anyio.lowlevel.checkpoint`` of the event loop running now, without its per-call
    look-up of the backend: what anyio awaits on trio and on asyncio (a session, which
    lives in one loop, looks it up once and yields through it at every checkpoint)."""
    library = sniffio.current_async_library()
    if library == "trio":
        import trio.lowlevel

        return trio.lowlevel.checkpoint
    if library == "asyncio":
        global _asyncio_checkpoint
        if _asyncio_checkpoint is None:
            # asyncio runs this, so it is imported: importing tinyctx never loads it
            _asyncio_checkpoint = functools.partial(sys.modules["asyncio"].sleep, 0)
        return _asyncio_checkpoint
    return anyio.lowlevel.checkpoint


_asyncio_checkpoint: Callable[[], Awaitable[None]] | None = None
"""anyio's checkpoint on asyncio (``await sleep(0)``), one object for every session."""


YIELD_EVERY = 0.001
"""Seconds a session runs between two turns it hands the scheduler (its checkpoints)."""


class SchedulerCheckpoint:
    """A session's checkpoint, with a time budget for scheduling (tokio's cooperative
    budget, counted in time): a cancellation of the host's always lands at it, and once
    the session has run :data:`YIELD_EVERY` seconds since its last turn it yields to the
    scheduler too.

    A scheduler round trip (an ``epoll``/``select`` call on trio and on asyncio) cost more
    than a third of a run whose model answered at once; a model that does real I/O
    yields anyway, and a session that never waits still lets other tasks in within about
    a millisecond. The first checkpoint after entering always yields."""

    __slots__ = ("_full", "_if_cancelled", "_last")

    def __init__(self) -> None:
        self._full = scheduler_checkpoint()
        self._if_cancelled = _cancel_check()
        self._last = float("-inf")

    async def __call__(self) -> None:
        if time.perf_counter() - self._last >= YIELD_EVERY:
            await self._full()
            self._last = time.perf_counter()
        else:
            await self._if_cancelled()


def _cancel_check() -> Callable[[], Awaitable[None]]:
    """``anyio.lowlevel.checkpoint_if_cancelled`` of the event loop running now, looked
    up once (it never yields unless the task is cancelled)."""
    if sniffio.current_async_library() == "trio":
        import trio.lowlevel

        return trio.lowlevel.checkpoint_if_cancelled
    return anyio.lowlevel.checkpoint_if_cancelled

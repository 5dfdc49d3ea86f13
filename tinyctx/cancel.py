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

    __slots__ = ("__weakref__", "_cancelled", "_children", "_parent", "_reason", "_scopes")

    def __init__(self) -> None:
        self._cancelled = False
        self._reason: str | None = None
        # both made on first use: most tokens (one per derived call) never need them
        self._scopes: set[anyio.CancelScope] | None = None
        self._children: weakref.WeakSet[CancellationToken] | None = None
        # a child reads its parent's state when asked (no registration per child: one
        # token per run and per derived call); it registers in ``_children`` only once it
        # has scopes to cancel (see :meth:`_watch`)
        self._parent: CancellationToken | None = None

    def __repr__(self) -> str:
        state = "cancelled" if self.is_cancelled() else "active"
        return f"<CancellationToken {state}>"

    @property
    def reason(self) -> str | None:
        self.is_cancelled()  # latches a parent's cancellation, with its reason
        return self._reason

    def is_cancelled(self) -> bool:
        if self._cancelled:
            return True
        parent = self._parent
        if parent is not None and (
            parent._cancelled or (parent._parent is not None and parent.is_cancelled())
        ):
            self._cancelled, self._reason = True, parent._reason
            return True
        return False

    def cancel(self, reason: str | None = None) -> None:
        """Cancel this token and every child; idempotent (the first reason is kept)."""
        if self._cancelled:
            return
        parent = self._parent
        if parent is not None and parent.is_cancelled():
            reason = parent._reason  # cancelled with it already: its reason came first
        self._cancelled = True
        self._reason = reason
        scopes, self._scopes = self._scopes, None
        for scope in scopes or ():
            scope.cancel()
        # the children with scopes (the others see it when they are next asked)
        for child in list(self._children or ()):
            child.cancel(reason)

    def child(self) -> CancellationToken:
        """A token cancelled with this one; cancelling the child leaves this one alone."""
        token = CancellationToken()
        if self.is_cancelled():
            token._cancelled = True
            token._reason = self._reason
        else:
            token._parent = self
        return token

    def _watch(self, scope: anyio.CancelScope) -> None:
        if self._scopes is None:
            self._scopes = set()
        self._scopes.add(scope)
        self._register()

    def _register(self) -> None:
        """Be reached by an ancestor's ``cancel()`` (this token has scopes to cancel)."""
        parent = self._parent
        if parent is None:
            return
        if parent._children is None:
            parent._children = weakref.WeakSet()
        elif self in parent._children:
            return  # so are the ancestors
        parent._children.add(self)
        parent._register()

    def _unwatch(self, scope: anyio.CancelScope) -> None:
        if self._scopes is not None:
            self._scopes.discard(scope)

    def raise_if_cancelled(self, checkpoint: str = "") -> None:
        if self.is_cancelled():
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
        if scope.cancelled_caught and self.is_cancelled():
            raise RunCancelled(checkpoint, self._reason)

    async def cancelled(self) -> None:
        """Return once the token is cancelled; safe to cancel (use it in a task group race)."""
        if self.is_cancelled():
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

    def __call__(self) -> Awaitable[None]:
        # not a coroutine of its own: within the budget, the backend's check itself is
        # what the caller awaits (one frame less per checkpoint)
        if time.perf_counter() - self._last >= YIELD_EVERY:
            return self._turn()
        return self._if_cancelled()

    async def _turn(self) -> None:
        await self._full()
        self._last = time.perf_counter()


def _cancel_check() -> Callable[[], Awaitable[None]]:
    """``anyio.lowlevel.checkpoint_if_cancelled`` of the event loop running now, looked
    up once (it never yields unless the task is cancelled)."""
    if sniffio.current_async_library() == "trio":
        import trio.lowlevel

        return trio.lowlevel.checkpoint_if_cancelled
    return anyio.lowlevel.checkpoint_if_cancelled

"""The thread's lease for a framework's session: the same lease and fencing a tinyctx
``Session`` takes (:class:`~tinyctx.durable.ThreadLink`), held for one write or for a block.

:class:`Leasing` takes the lease of one thread for its owner, waiting up to ``wait``
seconds while another owner holds it (then :class:`~tinyctx.threads.LeaseHeld`, a
:class:`~tinyctx.SessionBusy`, naming the holder). :meth:`Leasing.hold` keeps it until
:meth:`Leasing.let_go`, renewed every third of its TTL by a task in a task group it owns;
:meth:`Leasing.writing` gives the lease a write carries: the held one, or a lease taken
for that write alone. Every release is shielded and bounded, so it runs on cancellation too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..context import RunConfig, RunContext
from ..conversation import Conversation
from ..durable import ThreadLink
from ..events import EventSink
from ..threads import Lease, LeaseHeld, ThreadStore

__all__ = ["Leasing"]

_FIRST_PAUSE = 0.01
_LONGEST_PAUSE = 0.25


class Leasing:
    """The lease of ``thread_id`` in ``store`` for ``owner`` (see the module doc)."""

    def __init__(
        self,
        store: ThreadStore,
        thread_id: str,
        *,
        owner: str,
        ttl: float,
        wait: float,
        events: EventSink | None = None,
    ) -> None:
        self.store = store
        self.thread_id = thread_id
        self.owner = owner
        self.ttl = ttl
        self.wait = wait
        self.events = events
        self.held: ThreadLink | None = None
        self._renewal: tuple[TaskGroup, anyio.Event] | None = None

    async def take(self) -> ThreadLink:
        """A link holding the thread's lease, taken within ``wait`` seconds."""
        deadline = anyio.current_time() + self.wait
        pause = _FIRST_PAUSE
        while True:
            link = ThreadLink(self.store, self.thread_id, owner=self.owner, ttl=self.ttl)
            try:
                await link.open(Conversation())
            except LeaseHeld:
                left = deadline - anyio.current_time()
                if left <= 0:
                    raise
                await anyio.sleep(min(pause, left))
                pause = min(pause * 2, _LONGEST_PAUSE)
                continue
            return link

    async def _give_up(self, link: ThreadLink) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(min(self.ttl, 5.0)):
            await link.release()

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[Lease | None]:
        """The lease a write carries: the held block's, else one taken for this write."""
        held = self.held
        if held is not None:
            yield held.current_lease()
            return
        link = await self.take()
        try:
            yield link.current_lease()
        finally:
            await self._give_up(link)

    async def hold(self) -> None:
        """Hold the lease from now until :meth:`let_go`, renewed every third of its TTL
        by a task in a task group this object owns (entered here, left there: a context
        manager's two halves, never a generator's)."""
        if self.held is not None:
            raise RuntimeError(f"the lease of thread {self.thread_id!r} is already held")
        link = await self.take()
        ctx: RunContext[Any] = RunContext.new(
            RunConfig(thread_id=self.thread_id), events=self.events
        )
        stop, stopped = anyio.Event(), anyio.Event()
        group = anyio.create_task_group()
        try:
            await group.__aenter__()
            group.start_soon(link.keep_leased, ctx, stop, stopped)
        except BaseException:
            await self._give_up(link)
            raise
        self.held = link
        self._renewal = (group, stop)

    async def renew_held(self) -> None:
        """Take the held lease again (a deleted thread lost it with its other records)."""
        held = self.held
        if held is not None:
            held.lease = await self.store.acquire_lease(self.thread_id, self.owner, self.ttl)

    async def let_go(self) -> None:
        """Stop renewing and release the held lease, shielded and bounded (so it runs on
        a cancellation too)."""
        link, renewal = self.held, self._renewal
        self.held, self._renewal = None, None
        if link is None or renewal is None:
            return
        group, stop = renewal
        stop.set()  # the renewal ends by itself (cancelled only if the caller is)
        try:
            # left in the scope it was entered in: a scope around it would corrupt trio's
            await group.__aexit__(None, None, None)
        finally:
            await self._give_up(link)

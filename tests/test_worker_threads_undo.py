"""A networked store's call with an undo (a lease request) that its caller gave up on is
settled before the caller leaves: undone if it ran, never begun if it had not
(``WorkerThreads``, the worker threads PostgreSQL's and Redis's stores share). Issue #39's
cancellation soak found leases a cancelled request left for the next one to trip over."""

from __future__ import annotations

import threading

from tests.cancelling import Gate, cancelled_when
from tinyctx.backends._common import WorkerThreads


def threads(capacity: int) -> WorkerThreads[object]:
    client = object()  # the calls below use no driver: they are plain functions
    return WorkerThreads(
        lambda: "<test store>",
        capacity,
        lambda: client,
        lambda _: None,
        connect_timeout=5.0,
        address="nowhere",
    )


class TestACallWithAnUndoGivenUp:
    """Its caller leaves only once what the call did is undone, or it never runs."""

    async def test_one_running_when_cancelled_is_undone_before_the_caller_leaves(self) -> None:
        """The call is still in its thread when its caller is cancelled; by the time
        the caller has left, the call has finished and its undo has run."""
        pool = threads(2)
        gate = Gate()
        undone: list[object] = []

        async def request() -> None:
            await pool.run(gate.held("lease"), undo=lambda _, result: undone.append(result))

        # the thread goes on (and grants) only once its caller was cancelled
        await cancelled_when(gate.entered, request, then=gate.proceed)
        assert undone == ["lease"]
        await pool.aclose()

    async def test_one_not_begun_when_cancelled_never_runs(self) -> None:
        """The call's thread waits for a permit (an abandoned call holds the only one)
        when its caller is cancelled: the caller leaves at once, and once the permit is
        free the call does not run."""
        pool = threads(1)
        first = Gate()
        ran: list[str] = []
        # abandoned, its thread holds the only permit
        await cancelled_when(first.entered, lambda: pool.run(first.held(None)))
        waiting = threading.Event()

        def grant(_: object) -> str:
            ran.append("grant")
            return "lease"

        async def request() -> None:
            waiting.set()
            await pool.run(grant, undo=lambda _, result: ran.append(f"undo {result}"))

        await cancelled_when(waiting, request)
        first.proceed.set()
        await pool.run(lambda _: None)  # runs only after both threads gave the permit back
        assert ran == []
        await pool.aclose()

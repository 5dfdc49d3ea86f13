"""Cancel a request at the moment a worker thread reports (the tests of lease requests
given up on in flight)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread

SAFETY = 20.0  # no wait here ends by this timer unless the code under test hangs


async def cancelled_when(
    event: threading.Event,
    request: Callable[[], Awaitable[object]],
    then: threading.Event | None = None,
) -> None:
    """Run ``request()``, cancelled as soon as ``event`` is set in a worker thread (and
    then set ``then``); it must end cancelled."""

    async def cancel(scope: anyio.CancelScope) -> None:
        assert await anyio.to_thread.run_sync(event.wait, SAFETY)
        scope.cancel()
        if then is not None:
            then.set()

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(cancel, scope)
            await request()
    assert scope.cancelled_caught


class Gate:
    """A call that reports it is in its thread (``entered``) and waits for ``proceed``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.proceed = threading.Event()

    def held(self, result: object) -> Callable[[object], object]:
        def call(_: object) -> object:
            self.entered.set()
            self.proceed.wait(SAFETY)
            return result

        return call

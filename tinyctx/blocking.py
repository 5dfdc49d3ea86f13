"""Running a coroutine from code that has no event loop (``Agent.run_sync``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from .config import one_of

_BACKEND = one_of(("trio", "asyncio"), allowed="'trio' or 'asyncio'")

__all__ = ["run_blocking"]

T = TypeVar("T")


def run_blocking(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    backend: Literal["trio", "asyncio"] = "trio",
    **kwargs: Any,
) -> T:
    """Run ``fn(*args, **kwargs)`` in a new event loop; refused inside a running one."""
    _BACKEND.check(backend, "backend", "Agent.run_sync")
    running = _running_loop()
    if running is not None:
        raise RuntimeError(
            f"Agent.run_sync was called inside a running {running} event loop (a notebook "
            "cell, async code), where it cannot start its own: use `await agent.run(...)` "
            "there instead"
        )
    import anyio

    return anyio.run(functools.partial(fn, *args, **kwargs), backend=backend)


def _running_loop() -> str | None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return "asyncio"
    try:
        import trio

        trio.lowlevel.current_task()
    except (ImportError, RuntimeError):
        return None
    return "trio"

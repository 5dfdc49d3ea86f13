"""One dedicated thread for blocking calls that a resource serializes anyway.

An SQLite connection runs one statement at a time, so the store needs no pool of threads:
it needs one thread and the cheapest possible hand-off to it. ``anyio.to_thread.run_sync``
spends most of a short call on its own bookkeeping (a capacity limiter, its thread cache,
a cancel scope per call); a durable step is a ~30 µs SQLite transaction, so that overhead
was most of the step's cost. :class:`WorkerThread` hands a call over through a queue and
wakes the waiting task with the event loop's own thread-safe primitive (trio's
``TrioToken.run_sync_soon``, asyncio's ``call_soon_threadsafe``).

A call is a checkpoint (a cancelled caller never submits), and a caller cancelled after
submitting never half-knows, yet is not held: a call still queued is skipped (nothing ran),
a running one is asked to stop (``interrupt``, e.g. ``sqlite3.Connection.interrupt``, and
:func:`cancel_requested` for the call's own waits, such as a busy file) and ends at once,
rolled back, and the caller waits only for that end: it then gets the call's value if the
call had finished (the cancel lands at its next checkpoint), else the cancellation. Calls
run in submission order. The thread exits after ``idle`` seconds without work and is
started again on the next call, so an unclosed store does not keep a thread forever.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import outcome
import sniffio

__all__ = ["WorkerThread", "cancel_requested"]

T = TypeVar("T")

_Deliver = Callable[[outcome.Outcome[Any]], None]
_STOP: Final = None


class _Job:
    """One submitted call, and whether its caller gave up on it."""

    __slots__ = ("cancelled", "deliver", "fn", "started")

    def __init__(self, fn: Callable[[], Any], deliver: _Deliver) -> None:
        self.fn = fn
        self.deliver = deliver
        self.cancelled = False
        self.started = False


_running = threading.local()


def cancel_requested() -> bool:
    """In a worker thread: whether the caller of the call running now was cancelled (a
    call that waits in a loop, e.g. for a busy file, gives up when it is)."""
    job: _Job | None = getattr(_running, "job", None)
    return job is not None and job.cancelled


_INHERITED: list[object] = []


def keep_inherited(client: object) -> None:
    """Keep a database client a forked child inherited from its parent alive and unused:
    it must not be closed in the child (that would end or disturb the parent's
    connections), nor collected."""
    _INHERITED.append(client)


class _ForkAware(Protocol):
    def _after_fork(self) -> None: ...


_FORK_AWARE: weakref.WeakSet[_ForkAware] = weakref.WeakSet()


def reset_after_fork(obj: _ForkAware) -> None:
    """Have ``obj._after_fork()`` called in the child of every later ``os.fork`` (a store
    used before a pre-forking server forked), before the child runs anything else: the
    child drops the threads, locks and connections it inherited and starts its own."""
    _FORK_AWARE.add(obj)


def _in_forked_child() -> None:
    for obj in list(_FORK_AWARE):
        obj._after_fork()


os.register_at_fork(after_in_child=_in_forked_child)


class WorkerThread:
    """Runs blocking calls one at a time in a thread of its own; see the module docstring."""

    __slots__ = ("__weakref__", "_current", "_idle", "_lock", "_name", "_queue", "_thread")

    def __init__(self, name: str, *, idle: float = 10.0) -> None:
        self._name = name
        self._idle = idle
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._current: _Job | None = None
        reset_after_fork(self)

    def __repr__(self) -> str:
        state = "running" if self._thread is not None else "idle"
        return f"<WorkerThread {self._name!r} {state}>"

    async def run(self, fn: Callable[[], T], *, interrupt: Callable[[], None] | None = None) -> T:
        """``fn()`` in the worker thread; its exception is raised here. When the caller is
        cancelled while ``fn`` runs, ``interrupt()`` is called (from the caller's thread)
        to make it stop."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        library = sniffio.current_async_library()
        if library == "trio":
            return await self._run_trio(fn, interrupt)
        if library == "asyncio":
            return await self._run_asyncio(fn, interrupt)
        return await anyio.to_thread.run_sync(fn)  # pragma: no cover - no other backend

    @property
    def idle(self) -> bool:
        """No call queued or running now (a caller that runs a call of its own in place
        then overtakes none submitted before it)."""
        return self._current is None and self._queue.empty()

    def _give_up(self, job: _Job, interrupt: Callable[[], None] | None) -> bool:
        """The caller of ``job`` was cancelled: skip it if queued (True: it never runs and
        nothing is delivered, so the caller leaves now), else stop it if running."""
        with self._lock:
            job.cancelled = True
            if not job.started:
                return True
            if interrupt is not None and self._current is job:
                interrupt()
            return False

    def stop(self) -> None:
        """Let the thread exit once the calls already submitted have run."""
        with self._lock:
            if self._thread is not None:
                self._queue.put(_STOP)
                # later calls go to a new thread and queue; the old one drains its own
                self._queue = queue.SimpleQueue()
                self._thread = None

    # -- the two backends ---------------------------------------------------------------

    async def _run_trio(self, fn: Callable[[], T], interrupt: Callable[[], None] | None) -> T:
        import trio

        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()

        def deliver(result: outcome.Outcome[Any]) -> None:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        job = _Job(fn, deliver)

        def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
            # a queued call is skipped and the caller leaves now; a running one is stopped
            # and the caller waits for that (prompt) end
            if self._give_up(job, interrupt):
                return trio.lowlevel.Abort.SUCCEEDED
            return trio.lowlevel.Abort.FAILED

        self._submit(job)
        try:
            value: T = await trio.lowlevel.wait_task_rescheduled(abort)
        except BaseException:
            if job.cancelled:
                await trio.lowlevel.checkpoint()  # the cancellation, not the call's error
            raise
        return value

    async def _run_asyncio(self, fn: Callable[[], T], interrupt: Callable[[], None] | None) -> T:
        import asyncio  # loaded already on this backend; ``import tinyctx`` does not pay for it

        loop = asyncio.get_running_loop()
        future: asyncio.Future[outcome.Outcome[Any]] = loop.create_future()

        def settle(result: outcome.Outcome[Any]) -> None:
            if not future.done():
                future.set_result(result)

        def deliver(result: outcome.Outcome[Any]) -> None:
            loop.call_soon_threadsafe(settle, result)

        job = _Job(fn, deliver)
        self._submit(job)
        try:
            await asyncio.wait((future,))  # a cancel here leaves the future alone
        except asyncio.CancelledError:
            if self._give_up(job, interrupt):
                raise  # still queued: skipped, it never runs
            with anyio.CancelScope(shield=True):
                await asyncio.wait((future,))
            if isinstance(future.result(), outcome.Error):
                raise
            # the call had finished: its value, and the cancel lands at the next checkpoint
        value: T = future.result().unwrap()
        return value

    # -- the thread ---------------------------------------------------------------------

    def _after_fork(self) -> None:
        # a forked child does not inherit the thread, and its lock may be held forever
        self._lock = threading.Lock()
        self._thread = None
        self._current = None
        self._queue = queue.SimpleQueue()

    def _submit(self, job: _Job) -> None:
        with self._lock:
            self._queue.put(job)
            if self._thread is None:
                thread = threading.Thread(
                    target=self._serve, args=(self._queue,), name=self._name, daemon=True
                )
                self._thread = thread
                thread.start()

    def _serve(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            try:
                job = jobs.get(timeout=self._idle)
            except queue.Empty:
                with self._lock:
                    if jobs.empty() and self._thread is threading.current_thread():
                        self._thread = None
                        return
                continue
            if job is _STOP:
                return
            result = self._execute(job)
            if result is None:
                continue  # skipped: its caller left when it gave up, nobody waits
            # a RuntimeError: the caller's event loop closed meanwhile, nobody waits
            with contextlib.suppress(RuntimeError):
                job.deliver(result)
            del job, result

    def _execute(self, job: _Job) -> outcome.Outcome[Any] | None:
        with self._lock:
            if job.cancelled:
                return None
            job.started = True
            self._current = job
        _running.job = job
        try:
            result: outcome.Outcome[Any] = outcome.capture(job.fn)
            return result
        finally:
            _running.job = None
            with self._lock:
                self._current = None

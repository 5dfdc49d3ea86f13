"""WorkerThread: the store's own thread; a cancelled caller leaves at once, never half-knowing."""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyctx import SqliteStore
from tinyctx._gc import gc_paused
from tinyctx.codec import encode_messages
from tinyctx.messages import UserMessage
from tinyctx.threads import ThreadWrite
from tinyctx.worker import WorkerThread


class TestWorkerThread:
    """Calls run off the event loop, in order, one at a time; errors come back."""

    async def test_calls_run_in_one_thread_that_is_not_the_loops(self) -> None:
        """Every call runs in the worker's thread, never on the event loop's."""
        worker = WorkerThread("t")
        idents = [await worker.run(threading.get_ident) for _ in range(5)]
        worker.stop()
        assert len(set(idents)) == 1
        assert idents[0] != threading.get_ident()

    async def test_exceptions_are_raised_in_the_caller(self) -> None:
        """An exception raised by the call is raised by ``run``, with its type."""
        worker = WorkerThread("t")

        def boom() -> None:
            raise KeyError("missing")

        with pytest.raises(KeyError, match="missing"):
            await worker.run(boom)
        assert await worker.run(lambda: 7) == 7  # the thread survives a failed call
        worker.stop()

    async def test_concurrent_callers_run_one_at_a_time_in_submission_order(self) -> None:
        """Calls from many tasks never overlap and run in the order they were submitted."""
        worker = WorkerThread("t")
        active = 0
        overlap = False
        order: list[int] = []

        def job(index: int) -> int:
            nonlocal active, overlap
            active += 1
            overlap = overlap or active > 1
            time.sleep(0.001)
            order.append(index)
            active -= 1
            return index

        results: dict[int, int] = {}

        async def call(index: int) -> None:
            results[index] = await worker.run(lambda: job(index))

        async with anyio.create_task_group() as group:
            for index in range(20):
                group.start_soon(call, index)
        worker.stop()
        assert not overlap
        assert sorted(order) == list(range(20))
        assert results == {i: i for i in range(20)}

    async def test_the_thread_exits_when_idle_and_comes_back(self) -> None:
        """An idle worker's thread exits; the next call starts a new one."""
        worker = WorkerThread("t", idle=0.01)
        first = await worker.run(threading.current_thread)
        await anyio.to_thread.run_sync(first.join, 5)  # the idle thread exits on its own
        assert not first.is_alive()
        second = await worker.run(threading.current_thread)
        assert second is not first and second.is_alive()
        worker.stop()
        second.join(5)
        assert not second.is_alive()


class TestWorkerThreadCancellation:
    """A cancelled caller never half-knows: either nothing ran or the call finished."""

    async def test_a_caller_cancelled_before_submitting_runs_nothing(self) -> None:
        """Cancelled before the call: the call never runs (run is a checkpoint)."""
        worker = WorkerThread("t")
        ran: list[int] = []
        with anyio.CancelScope() as scope:
            scope.cancel()
            await worker.run(lambda: ran.append(1))
        assert scope.cancelled_caught
        assert await worker.run(lambda: len(ran)) == 0
        worker.stop()

    async def test_a_caller_cancelled_mid_call_waits_for_the_call_to_finish(self) -> None:
        """Cancelled while the call runs: the caller waits for it, then the cancel lands."""
        worker = WorkerThread("t")
        started = threading.Event()
        finished = threading.Event()

        def slow() -> None:
            started.set()
            time.sleep(0.05)
            finished.set()

        with anyio.move_on_after(0.01) as scope:
            await worker.run(slow)
            await anyio.sleep(1)  # the cancel lands at the next checkpoint
        assert started.is_set()
        assert finished.is_set()  # not abandoned: run returned only after the call ended
        assert scope.cancelled_caught
        worker.stop()

    async def test_a_queued_call_whose_caller_is_cancelled_never_runs(self) -> None:
        """Cancelled while its call waits behind another: the caller leaves at once and
        the call is skipped (nothing ran); the worker goes on with the next one."""
        worker = WorkerThread("t")
        gate = threading.Event()
        ran: list[str] = []

        def first() -> None:
            gate.wait(10)
            ran.append("first")

        async with anyio.create_task_group() as group:
            group.start_soon(worker.run, first)
            await anyio.sleep(0.01)
            with anyio.move_on_after(0.05) as scope:
                await worker.run(lambda: ran.append("queued"))
            # the caller left while the first call still runs: it was not held behind it
            assert ran == []
            gate.set()
        assert scope.cancelled_caught
        assert ran == ["first"]
        ran.clear()
        assert await worker.run(lambda: list(ran)) == []
        worker.stop()

    async def test_a_running_call_is_interrupted_and_its_caller_sees_the_cancellation(
        self,
    ) -> None:
        """Cancelled while its call runs: ``interrupt`` is called, the call stops with
        its own error, and the caller gets the cancellation, not that error."""
        worker = WorkerThread("t")
        stop = threading.Event()

        def stubborn() -> None:
            if not stop.wait(10):
                return
            raise RuntimeError("interrupted")

        with anyio.move_on_after(0.05) as scope:
            await worker.run(stubborn, interrupt=stop.set)
        assert scope.cancelled_caught and stop.is_set()
        assert await worker.run(lambda: 7) == 7
        worker.stop()

    @settings(max_examples=20, deadline=None)
    @given(delays=st.lists(st.sampled_from([0.0, 0.0005, 0.002]), min_size=1, max_size=6))
    async def test_a_cancelled_store_write_either_landed_or_did_not(
        self, tmp_path_factory: pytest.TempPathFactory, delays: list[float]
    ) -> None:
        """Cancelling writers at any moment leaves a version that counts exactly what landed."""
        path = tmp_path_factory.mktemp("w") / "w.db"
        async with SqliteStore(path) as store:
            landed = 0
            version = 0
            for delay in delays:
                with anyio.move_on_after(delay):
                    version = await store.write(
                        "t",
                        ThreadWrite(encode_messages([UserMessage("x")])),
                        expected_version=version,
                    )
                    landed += 1
            record = await store.load_thread("t")
            assert record.version == version == landed
            assert len(record.messages) == landed


class TestSqliteStoreThread:
    """SqliteStore runs on its own worker thread and gives it up on close."""

    async def test_closing_the_store_stops_its_thread(self, tmp_path: Path) -> None:
        """After aclose the store's thread exits (no thread left behind per store)."""
        store = SqliteStore(tmp_path / "s.db")
        thread = await store._worker.run(threading.current_thread)
        await store.aclose()
        thread.join(5)
        assert not thread.is_alive()


class TestCollectorPause:
    """A long read holds the cyclic collector off, and nothing leaves it off for good."""

    def test_the_pause_restores_the_collector_and_respects_one_turned_off(self) -> None:
        """Over the threshold the collector is off inside and on after, on an error too;
        at the threshold it stays on; one the application turned off stays off."""
        with gc_paused(65):
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(ValueError), gc_paused(1000):
            raise ValueError
        assert gc.isenabled()
        with gc_paused(64):
            assert gc.isenabled()
        gc.disable()
        try:
            with gc_paused(1000):
                pass
            assert not gc.isenabled()
        finally:
            gc.enable()

    def test_a_fork_during_another_threads_pause_leaves_the_child_collecting(self) -> None:
        """A process forked while a store's thread holds the collector off gets it back on:
        the child has no such thread to turn it on later."""
        holding, release = threading.Event(), threading.Event()

        def read() -> None:
            with gc_paused(1000):
                holding.set()
                release.wait(10)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert holding.wait(10) and not gc.isenabled()
            pid = os.fork()
            if pid == 0:  # the child: never returns into pytest
                os._exit(0 if gc.isenabled() else 1)
            _, status = os.waitpid(pid, 0)
        finally:
            release.set()
            reader.join(10)
        assert os.waitstatus_to_exitcode(status) == 0
        assert gc.isenabled()

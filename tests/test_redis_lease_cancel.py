"""A lease request its caller gave up on never holds the thread once the caller has left
(Redis, issue #39's cancellation soak): the request's worker thread is held back, on a
real Redis, at the two moments a busy machine stretches, before the request reaches Redis
and after Redis granted it but before the reply was read, and the next request must find
the thread free while that thread is still held."""

from __future__ import annotations

import importlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis

from tests.cancelling import SAFETY, cancelled_when
from tinyctx import Agent, Session
from tinyctx.backends.redis import RedisStore
from tinyctx.testing import ScriptedModel

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


class HeldBack:
    """Stands in for the store's ACQUIRE script in its worker thread: each request waits
    for ``go`` before it is sent to Redis, and for ``back`` before its thread returns
    (where a cancelled call's undo would run), as a thread starved of the GIL would."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.real = client.acquire
        self.reached = threading.Event()  # a request is in its worker thread
        self.go = threading.Event()  # send it to Redis
        self.answered = threading.Event()  # Redis answered it
        self.back = threading.Event()  # let its thread return
        self.answer: Any = None
        client.acquire = self

    def __call__(self, **script: Any) -> Any:
        self.reached.set()
        self.go.wait(SAFETY)
        self.answer = self.real(**script)
        self.answered.set()
        self.back.wait(SAFETY)
        return self.answer

    def restore(self) -> None:
        """Later requests go straight to Redis again."""
        self.client.acquire = self.real


@pytest.fixture
async def store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisStore]:
    opened = RedisStore(redis_url, prefix=redis_prefix)
    await opened.open()
    yield opened
    await opened.aclose()


async def held_back(store: RedisStore) -> HeldBack:
    return HeldBack(await anyio.to_thread.run_sync(store._threads.client))


def keys_of(store: RedisStore, thread_id: str) -> list[str]:
    client = redis.Redis.from_url(store.url, decode_responses=True)
    try:
        found = client.scan_iter(match=store.prefix + "*")
        return [key for key in found if key.endswith("}" + thread_id)]
    finally:
        client.close()


class TestAGivenUpLeaseRequest:
    """A lease request cancelled in flight leaves its thread free for the next owner."""

    async def test_one_that_reaches_redis_after_its_caller_left_is_refused(
        self, store: RedisStore
    ) -> None:
        """Cancelled before its worker thread sent it, and held back longer than its
        caller waits for it (a second): the caller leaves, the request then reaches Redis
        and is refused, so the next owner gets the lease at once."""
        hook = await held_back(store)
        try:
            await cancelled_when(hook.reached, lambda: store.acquire_lease("t", "gone", 30))
            hook.go.set()  # the request reaches Redis only now, its caller long gone
            assert await anyio.to_thread.run_sync(hook.answered.wait, SAFETY)
            assert hook.answer[0] == 0  # refused: it was given up on
            hook.restore()
            lease = await store.acquire_lease("t", "next", 30)
            assert lease.owner == "next"
        finally:
            hook.go.set()
            hook.back.set()

    async def test_one_redis_granted_before_its_caller_read_the_reply_is_released(
        self, store: RedisStore
    ) -> None:
        """Cancelled after Redis granted it, the worker thread held back longer than its
        caller waits for it: the grant is released before the caller leaves, while the
        thread is still held."""
        hook = await held_back(store)
        hook.go.set()
        try:
            await cancelled_when(hook.answered, lambda: store.acquire_lease("t", "gone", 30))
            assert hook.answer[0] == 1  # it had been granted
            hook.restore()
            lease = await store.acquire_lease("t", "next", 30)
            assert lease.owner == "next"
        finally:
            hook.back.set()

    async def test_a_session_cancelled_while_leasing_leaves_its_thread_free(
        self, store: RedisStore
    ) -> None:
        """A request's deadline falls while its Session's lease request waits in its
        worker thread: once the request has left and the lease request lands, the next
        request's Session opens the thread (no SessionBusy)."""
        agent = Agent(model=ScriptedModel(["hello"]))

        async def request() -> None:
            async with Session(agent, thread_id="t", store=store, owner="gone"):
                pass

        hook = await held_back(store)
        try:
            await cancelled_when(hook.reached, request)
            hook.go.set()
            assert await anyio.to_thread.run_sync(hook.answered.wait, SAFETY)
            hook.restore()
            async with Session(agent, thread_id="t", store=store, owner="next") as session:
                assert (await session.run("hi")).final_text == "hello"
        finally:
            hook.go.set()
            hook.back.set()

    async def test_deleting_the_thread_leaves_no_given_up_request_behind(
        self, store: RedisStore
    ) -> None:
        """The record of a request given up on goes with its thread."""
        hook = await held_back(store)
        hook.go.set()
        try:
            request = lambda: store.acquire_lease("gone-thread", "gone", 30)  # noqa: E731
            await cancelled_when(hook.answered, request, then=hook.back)
        finally:
            hook.back.set()
        assert any("{g}" in key for key in keys_of(store, "gone-thread"))
        await store.delete_thread("gone-thread")
        assert keys_of(store, "gone-thread") == []


@pytest.mark.slow  # about 20 s: a thousand cancelled requests on each event loop
class TestTheCancellationSoakOnRedis:
    """Deadlines at random points of durable requests leave no lease held on Redis."""

    def test_no_lease_held_on_trio_or_asyncio(
        self, redis_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """benchmarks/_cancel_soak.py, bounded to 1,000 cancelled requests per loop and
        traced: no request leaves its lease held, orphan tool calls or errors (a held
        lease is reported with its owner and the steps of its request)."""
        monkeypatch.syspath_prepend(str(BENCHMARKS))
        soak = importlib.import_module("_cancel_soak")
        rows = soak.cancellation_soak(1000, ("", redis_url), stores=("redis",), trace=True)
        assert [row["loop"] for row in rows] == ["trio", "asyncio"]
        for row in rows:
            assert row["cancelled"] >= 1000
            assert row["held"] == 0, row["held_leases"]
            assert row["orphan calls"] == row["unpaired threads"] == row["errors"] == 0, row

"""Store calls under cancellation, unreachable servers and stalls (issue #32, items 2 and 3).

Real processes only: a loopback port nobody listens on, a test-started TCP server that
accepts and never answers, and private PostgreSQL and Redis servers (started for this
module, so stopping them does not disturb other tests) frozen with SIGSTOP and thawed with
SIGCONT. Every freeze has a safety thaw: a timer that sends SIGCONT after ``SAFETY``
seconds, so a call that ignores its deadline ends the test (failing it: the checks below
ask whether the answer came while the server was still frozen) instead of hanging it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.servers import start_services, stop_services, unique_name
from tinyctx import Agent, Session, SqliteStore, StoreError
from tinyctx.backends.postgres import PostgresStore
from tinyctx.backends.redis import RedisStore
from tinyctx.messages import AssistantMessage, UserMessage
from tinyctx.stores import StoreUnavailable, WriteOutcomeUnknown
from tinyctx.testing import ScriptedModel
from tinyctx.threads import Lease, LeaseHeld, StaleThreadVersion, ThreadWrite

SAFETY = 20.0
"""Seconds after which a frozen server is thawed whatever the test does."""

NETWORKED = ["postgres", "redis"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class SilentServer:
    """A TCP server on loopback that accepts every connection and never sends a byte;
    after ``SAFETY`` seconds it closes them all (so a client that waits forever ends)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.05)
        waited = 0.0
        while not self._done.is_set() and waited < SAFETY:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                waited += 0.05
                continue
            except OSError:
                return
            self.accepted.append(conn)
        self.close_all()

    def close_all(self) -> None:
        for conn in self.accepted:
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


class Servers:
    """This module's own PostgreSQL and Redis, and a way to freeze and thaw each."""

    def __init__(self, found: dict[str, str]) -> None:
        self.dir = found["TINYCTX_SERVICES_DIR"]
        self.urls = {
            "postgres": found["TINYCTX_TEST_POSTGRES_URL"],
            "redis": found["TINYCTX_TEST_REDIS_URL"],
        }

    def pids(self, kind: str) -> list[int]:
        """Every process of the server: Redis's one, PostgreSQL's postmaster and children."""
        if kind == "redis":
            return [int(Path(self.dir, "redis", "redis.pid").read_text().split()[0])]
        postmaster = int(Path(self.dir, "pg", "data", "postmaster.pid").read_text().split()[0])
        pids = [postmaster]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = (entry / "stat").read_text()
                    if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                        pids.append(int(entry.name))
        return pids

    @contextlib.contextmanager
    def frozen(self, kind: str) -> Iterator[Freeze]:
        """SIGSTOP the server now, SIGCONT it on leaving (or after ``SAFETY`` seconds)."""
        freeze = Freeze(self.pids(kind))
        freeze.stop()
        try:
            yield freeze
        finally:
            freeze.thaw()


class Freeze:
    """A stopped server: ``thaw()`` resumes it; ``thawed_by_timer`` says whether the safety
    timer had to (a call that waited for the server instead of answering its deadline)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.thawed_by_timer = False
        self._lock = threading.Lock()
        self._stopped = False
        self._timer = threading.Timer(SAFETY, self._safety)
        self._timer.daemon = True

    def stop(self) -> None:
        with self._lock:
            for pid in self.pids:
                with contextlib.suppress(ProcessLookupError):  # a backend that just ended
                    os.kill(pid, signal.SIGSTOP)
            self._stopped = True
        self._timer.start()

    def _safety(self) -> None:
        with self._lock:
            if self._stopped:
                self.thawed_by_timer = True
        self.thaw()

    def thaw(self) -> None:
        with self._lock:
            if self._stopped:
                for pid in self.pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                self._stopped = False
        self._timer.cancel()

    @property
    def still_frozen(self) -> bool:
        """The server was never thawed by the timer (what a prompt answer leaves)."""
        return not self.thawed_by_timer


@pytest.fixture(scope="module")
def private_servers() -> Iterator[Servers]:
    """A PostgreSQL and a Redis for this module alone (so freezing them is harmless)."""
    try:
        found = start_services()
    except (RuntimeError, OSError) as exc:
        if os.environ.get("TINYCTX_REQUIRE_SERVERS") == "1":
            pytest.fail(str(exc))
        pytest.skip(f"no private database servers: {exc}")
    servers = Servers(found)
    try:
        yield servers
    finally:
        stop_services(servers.dir)


def networked_store(kind: str, url: str, **options: Any) -> Any:
    """A PostgresStore or RedisStore on ``url`` with a fresh schema or prefix."""
    if kind == "postgres":
        return PostgresStore(url, schema=unique_name("pg"), **options)
    return RedisStore(url, prefix=unique_name("redis") + ":", **options)


@pytest.fixture(params=NETWORKED)
async def private_store(
    request: pytest.FixtureRequest, private_servers: Servers
) -> AsyncIterator[tuple[str, Any]]:
    """An open store of each networked kind on this module's own server."""
    kind: str = request.param
    store = networked_store(kind, private_servers.urls[kind], timeout=5)
    await store.open()
    yield kind, store
    await store.aclose()


def unreachable_url(kind: str, port: int, query: str = "") -> str:
    if kind == "postgres":
        return f"postgresql://tiny:sekrit@127.0.0.1:{port}/db{query}"
    return f"redis://:sekrit@127.0.0.1:{port}/0{query}"


class TestUnreachableServer:
    """A server that refuses or never answers is StoreUnavailable, in the connect timeout."""

    @pytest.mark.parametrize("kind", NETWORKED)
    async def test_a_closed_port_is_store_unavailable_naming_host_and_port(self, kind: str) -> None:
        """Nobody listening: StoreUnavailable at once, naming 127.0.0.1:port, no password,
        with the driver's error as its cause; the store then still refuses the same way."""
        port = closed_port()
        store = networked_store(kind, unreachable_url(kind, port), timeout=3)
        for _ in range(2):
            with pytest.raises(StoreUnavailable) as info:
                await store.get("ns", "k")
            assert info.value.address == f"127.0.0.1:{port}"
            assert f"127.0.0.1:{port}" in str(info.value)
            assert "sekrit" not in str(info.value)
            assert info.value.__cause__ is not None
            assert isinstance(info.value, StoreError) and isinstance(info.value, ConnectionError)
        await store.aclose()

    @pytest.mark.parametrize(
        ("kind", "query"),
        [("postgres", "?connect_timeout=1"), ("redis", "?socket_connect_timeout=1")],
    )
    async def test_a_silent_server_fails_within_the_urls_connect_timeout(
        self, kind: str, query: str, silent_server: SilentServer
    ) -> None:
        """A server that accepts and never answers: StoreUnavailable within the URL's
        connect timeout (it wins over the store's ``timeout``), naming host and port."""
        store = networked_store(kind, unreachable_url(kind, silent_server.port, query), timeout=8)
        with pytest.raises(StoreUnavailable) as info:
            await store.open()
        assert store.connect_timeout == 1.0
        assert info.value.address == f"127.0.0.1:{silent_server.port}"
        assert "within the connect timeout of 1s" in str(info.value)
        assert "sekrit" not in str(info.value)
        await store.aclose()

    @pytest.mark.parametrize("kind", NETWORKED)
    async def test_the_store_timeout_is_the_connect_timeout_without_one_in_the_url(
        self, kind: str, silent_server: SilentServer
    ) -> None:
        """Without a connect timeout in the URL, the store's ``timeout`` bounds the connect."""
        store = networked_store(kind, unreachable_url(kind, silent_server.port), timeout=1.5)
        with pytest.raises(StoreUnavailable, match="connect timeout of 1.5s"):
            await store.open()
        assert store.connect_timeout == 1.5
        await store.aclose()

    @pytest.mark.parametrize("kind", NETWORKED)
    async def test_a_session_on_a_silent_server_keeps_the_callers_deadline(
        self, kind: str, silent_server: SilentServer
    ) -> None:
        """A session opened inside the caller's deadline leaves at the deadline, cancelled,
        with nothing raised (not the pool's timeout long after)."""
        store = networked_store(kind, unreachable_url(kind, silent_server.port), timeout=3)
        agent = Agent(model=ScriptedModel(["never"]))
        with anyio.move_on_after(0.5) as scope:
            async with Session(agent, thread_id="t", store=store) as session:
                await session.run("hello")
        assert scope.cancelled_caught
        await store.aclose()


@pytest.mark.slow  # servers of its own, frozen with SIGSTOP: CI's slow group runs it
class TestCancellation:
    """Every store call answers a cancellation promptly and leaves the store working."""

    async def test_a_call_to_a_frozen_server_answers_the_deadline(
        self, private_store: tuple[str, Any], private_servers: Servers
    ) -> None:
        """SIGSTOP the server: a read inside a deadline leaves at the deadline while the
        server is still frozen; after SIGCONT every connection of the pool works."""
        kind, store = private_store
        await store.put("ns", "k", 1)
        with private_servers.frozen(kind) as freeze:
            with anyio.move_on_after(0.3) as scope:
                await store.get("ns", "k")
            answered_in_time = freeze.still_frozen
        assert scope.cancelled_caught and answered_in_time
        for n in range(12):  # more than the pool: no connection was lost to the cancel
            await store.put("ns", f"k{n}", n)
            assert await store.get("ns", f"k{n}") == n

    @pytest.mark.parametrize("kind", NETWORKED)
    async def test_a_cancelled_call_holds_nothing_while_the_server_stays_frozen(
        self, kind: str, private_servers: Servers
    ) -> None:
        """A server frozen for good: a cancelled call gives its connection up at once, so
        the next call (one connection in all) is not stuck behind it: it fails within the
        connect timeout while the server is still frozen (on PostgreSQL it waited for the
        server's return behind the cancelled call before; redis-py's own 5 s read timeout
        ends a stuck call too), and works once it is thawed."""
        size = {"pool_size": 1} if kind == "postgres" else {"max_connections": 1}
        store = networked_store(kind, private_servers.urls[kind], timeout=1, **size)
        await store.put("ns", "k", 1)
        with private_servers.frozen(kind) as freeze:
            with anyio.move_on_after(0.3) as scope:
                await store.get("ns", "k")
            with anyio.move_on_after(SAFETY / 2), pytest.raises(Exception) as info:
                await store.get("ns", "k")
            answered_in_time = freeze.still_frozen
        assert scope.cancelled_caught and answered_in_time
        # PostgreSQL: the pool found no connection; Redis: redis-py's connect timed out
        expected = StoreUnavailable if kind == "postgres" else redis.TimeoutError
        assert isinstance(info.value, expected)
        assert await store.get("ns", "k") == 1
        await store.aclose()

    async def test_a_cancelled_lease_is_not_left_held(
        self, private_store: tuple[str, Any], private_servers: Servers
    ) -> None:
        """A lease request cancelled while the server is frozen does not hold the thread
        once the server answers: the next owner gets it at once."""
        kind, store = private_store
        lease: Lease | None = None
        with private_servers.frozen(kind) as freeze:
            with anyio.move_on_after(0.3) as scope:
                await store.acquire_lease("t", "gone", 60)
            answered_in_time = freeze.still_frozen
        assert scope.cancelled_caught and answered_in_time
        # the abandoned call ends in its thread once the server answers, and releases
        # what it got: the next owner gets the lease long before its 60 s TTL
        for _ in range(100):
            try:
                lease = await store.acquire_lease("t", "next", 60)
                break
            except LeaseHeld:
                await anyio.sleep(0.05)
        assert lease is not None and lease.owner == "next"

    @settings(
        max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(delays=st.lists(st.sampled_from([0.0, 0.0002, 0.001, 0.003]), min_size=1, max_size=8))
    async def test_writes_cancelled_at_any_moment_land_at_most_once_in_order(
        self, private_store: tuple[str, Any], delays: list[float]
    ) -> None:
        """Writers cancelled at random moments, each looking before it retries: every
        attempt lands at most once, in order, and the version counts what landed."""
        _, store = private_store
        thread_id = unique_name("t")
        version = 0
        for attempt, delay in enumerate(delays):
            with anyio.move_on_after(delay) as scope:
                try:
                    version = await store.write(
                        thread_id, ThreadWrite([f"m{attempt}"]), expected_version=version
                    )
                except StaleThreadVersion as exc:  # a cancelled one landed after all
                    version = exc.actual
            if scope.cancelled_caught:  # outcome unknown: look before the next write
                version = (await store.load_thread(thread_id)).version
        record = await store.load_thread(thread_id)
        landed = [int(doc[1:]) for doc in record.messages]
        assert landed == sorted(set(landed))
        assert record.version == len(record.messages)

    async def test_a_sqlite_call_waiting_on_a_locked_file_answers_the_deadline(
        self, tmp_path: Path
    ) -> None:
        """Another connection holds the write lock: writes inside a deadline (one waiting
        for the lock, one queued behind it) leave at the deadline, not after the busy
        timeout, and neither lands; once the lock is gone the store works."""
        path = tmp_path / "locked.db"
        store = SqliteStore(path, timeout=4)
        await store.put("ns", "k", 0)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            with anyio.move_on_after(0.3) as scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(store.put, "ns", "k", 1)
                    group.start_soon(store.put, "ns", "k", 2)
            assert scope.cancelled_caught
            assert await store.get("ns", "k") == 0  # a reader never waits for the writer
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert await store.get("ns", "k") == 0
        await store.put("ns", "k", 2)
        assert await store.get("ns", "k") == 2
        await store.aclose()


@pytest.mark.slow  # servers of its own, frozen with SIGSTOP: CI's slow group runs it
class TestSessionDeadline:
    """A session opened inside the caller's deadline leaves at it (plus bounded cleanup)."""

    async def test_a_server_that_freezes_after_the_lease_does_not_hold_the_caller(
        self, private_store: tuple[str, Any], private_servers: Servers
    ) -> None:
        """The server freezes right after granting the lease: the load answers the
        deadline, and the lease release on the way out is bounded (shielded, it cannot be
        cancelled), so the caller leaves while the server is still frozen."""
        kind, store = private_store
        stack = contextlib.ExitStack()
        freezes: list[Freeze] = []
        acquire = store.acquire_lease

        async def acquire_then_freeze(thread_id: str, owner: str, ttl: float) -> Lease:
            lease: Lease = await acquire(thread_id, owner, ttl)
            freezes.append(stack.enter_context(private_servers.frozen(kind)))
            return lease

        store.acquire_lease = acquire_then_freeze
        agent = Agent(model=ScriptedModel(["never"]))
        with stack:
            with anyio.move_on_after(0.5) as scope:
                async with Session(agent, thread_id="t", store=store):
                    pass
            left_in_time = freezes[0].still_frozen
        assert scope.cancelled_caught and left_in_time


@pytest.mark.slow  # servers of its own, frozen with SIGSTOP: CI's slow group runs it
class TestWriteBound:
    """A write to a stalled server is bounded, and reported as of unknown outcome."""

    async def test_a_stalled_write_is_write_outcome_unknown_and_the_next_open_resolves_it(
        self, private_store: tuple[str, Any], private_servers: Servers
    ) -> None:
        """The server freezes during the run: the run fails with WriteOutcomeUnknown (a
        StoreError and a TimeoutError) while the server is still frozen; after SIGCONT the
        session's exit writes what was pending, and the next open holds the input once."""
        kind, store = private_store
        stack = contextlib.ExitStack()
        freezes: list[Freeze] = []

        def freeze_then_answer(request: Any, ctx: Any) -> str:
            freezes.append(stack.enter_context(private_servers.frozen(kind)))
            return "answer"

        agent = Agent(model=ScriptedModel([freeze_then_answer]))
        with stack:
            async with Session(agent, thread_id="t", store=store, grace_period=0.5) as session:
                with pytest.raises(WriteOutcomeUnknown) as info:
                    await session.run("hello")
                reported_in_time = freezes[0].still_frozen
                freezes[0].thaw()
        assert reported_in_time
        error = info.value
        assert isinstance(error, StoreError) and isinstance(error, TimeoutError)
        assert (error.thread_id, error.expected_version) == ("t", 1)
        assert "look before you retry" in str(error)
        reopened = Session(Agent(model=ScriptedModel([])), thread_id="t", store=store)
        async with reopened:
            messages = reopened.conversation_messages
        assert [type(m) for m in messages] == [UserMessage, AssistantMessage]
        assert [m.text for m in messages] == ["hello", "answer"]

"""TinyctxSession takes the thread's lease (the durable Session's lease and fencing) while
it writes: a held session refuses or delays a second writer, in this process or another,
and the lease is released when the block ends, cancelled or not."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("agents")

from tests.servers import BACKENDS, make_backend
from tinyctx import SessionBusy
from tinyctx.errors import ConfigError
from tinyctx.integrations.openai_agents import TinyctxSession
from tinyctx.threads import FencedOut, LeaseHeld

WORKER = Path(__file__).with_name("agents_session_worker.py")
BOUND = 240.0  # seconds any worker may take (its start alone is slow on a loaded machine)


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def _contents(session: TinyctxSession) -> list[str]:
    return [item["content"] for item in await session.get_items()]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Every thread store backend, PostgreSQL and Redis on real servers."""
    backend = make_backend(request.param, request, tmp_path)
    yield backend
    await backend.aclose()


class TestLease:
    """A session's writes carry the thread's lease; a second writer is refused or waits."""

    async def test_a_held_session_refuses_a_second_writer(self, store: Any) -> None:
        """Inside ``async with one``, another session's write is LeaseHeld (a SessionBusy
        naming the holder) and writes nothing; after the block it goes through."""
        one, two = TinyctxSession("s", store, owner="one"), TinyctxSession("s", store)
        async with one:
            await one.add_items(_user("a"))
            with pytest.raises(LeaseHeld) as busy:
                await two.add_items(_user("b"))
            assert isinstance(busy.value, SessionBusy) and busy.value.owner == "one"
            with pytest.raises(LeaseHeld):
                await two.pop_item()
            await one.add_items(_user("c"))
        assert await _contents(two) == ["a", "c"]
        await two.add_items(_user("d"))
        assert await _contents(one) == ["a", "c", "d"]

    async def test_a_waiting_writer_goes_after_the_holder(self, store: Any) -> None:
        """A writer with ``wait`` waits for the held block to end, so the block's writes
        stay together."""
        one = TinyctxSession("s", store, owner="one")
        two = TinyctxSession("s", store, owner="two", wait=10)
        held = anyio.Event()

        async def holder() -> None:
            async with one:
                await one.add_items(_user("a"))
                held.set()
                await anyio.sleep(0.3)
                await one.add_items(_user("b"))

        async with anyio.create_task_group() as group:
            group.start_soon(holder)
            await held.wait()
            await two.add_items(_user("c"))
        assert await _contents(one) == ["a", "b", "c"]

    async def test_the_lease_is_released_when_the_block_is_cancelled(self, store: Any) -> None:
        """A block cut off by a deadline releases the lease (shielded): another owner takes
        it at once."""
        one = TinyctxSession("s", store, owner="one")
        with anyio.move_on_after(0.2):
            async with one:
                await one.add_items(_user("a"))
                await anyio.sleep(30)
        lease = await store.acquire_lease("s", "other", 5)
        assert lease.owner == "other"
        await store.release_lease(lease)
        async with one:  # and the session holds it again
            await one.clear_session()
            await one.add_items(_user("again"))
        assert await _contents(one) == ["again"]

    async def test_writes_are_fenced(self, store: Any) -> None:
        """A write under a lease that a newer lease replaced is FencedOut; nothing lands."""
        one = TinyctxSession("s", store, owner="one")
        async with one:
            await one.add_items(_user("a"))
            newer = await store.acquire_lease("s", "one", 5)  # the same owner, a new token
            with pytest.raises(FencedOut):
                await one.add_items(_user("b"))
            await store.release_lease(newer)
        assert await _contents(one) == ["a"]

    async def test_one_lease_with_tinyctx_s_own_session(self, store: Any) -> None:
        """A tinyctx Session open on the thread holds the same lease: the SDK session's
        write is refused; and the other way round."""
        from tinyctx import Agent, Session
        from tinyctx.testing import ScriptedModel

        agent = Agent(model=ScriptedModel(["one"]))
        sdk = TinyctxSession("s", store, owner="sdk")
        async with Session(agent, thread_id="s", store=store, owner="tinyctx"):
            with pytest.raises(LeaseHeld, match="tinyctx"):
                await sdk.add_items(_user("a"))
        async with sdk:
            with pytest.raises(LeaseHeld, match="sdk"):
                async with Session(agent, thread_id="s", store=store):
                    pass
        assert await sdk.get_items() == []

    def test_bad_settings_name_the_field(self) -> None:
        """A TTL that is not positive, a negative wait or an empty owner is a ConfigError
        naming the field."""
        from tinyctx.stores import MemoryStore

        for field, value in (("lease_ttl", 0), ("wait", -1), ("owner", ""), ("session_id", "")):
            arguments: dict[str, Any] = {field: value}
            session_id = arguments.pop("session_id", "s")
            with pytest.raises(ConfigError, match=field):
                TinyctxSession(session_id, MemoryStore(), **arguments)


class _Worker(subprocess.Popen[str]):
    """A worker process killed, if still running, when its block ends."""

    def __exit__(self, *exc: Any) -> None:
        if self.poll() is None:
            self.kill()
        super().__exit__(*exc)


def _worker(args: list[str], name: str, mode: str, folder: Path) -> _Worker:
    return _Worker(
        [sys.executable, str(WORKER), *args, name, mode, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _appear(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + BOUND
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"worker ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, f"{path.name} did not appear in {BOUND}s"
        time.sleep(0.02)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=BOUND)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"worker did not finish in {BOUND}s: {err[-2000:]}") from None
    assert out, err[-2000:]
    return proc.returncode, out.splitlines()[-1]


@pytest.mark.slow  # two worker processes each: the multi-process group
class TestTwoProcesses:
    """Two SDK runners in two processes on one session id never interleave their writes."""

    @pytest.fixture(params=["sqlite", "redis"])
    def where(self, request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
        """How a worker reaches the store: a SQLite file, or the test Redis and a prefix."""
        if request.param == "sqlite":
            return ["sqlite", str(tmp_path / "threads.db"), "-"]
        url = request.getfixturevalue("redis_url")
        return ["redis", url, request.getfixturevalue("redis_prefix")]

    def test_the_second_runner_is_refused_or_waits(self, where: list[str], tmp_path: Path) -> None:
        """While ``a`` holds the session mid-run, ``b`` (wait=0) is refused at its first
        write and ``c`` (waiting) starts only after ``a`` ended; the thread holds a's whole
        run, then c's, and nothing of b's."""
        with contextlib.ExitStack() as running:  # every worker ends, its pipes closed
            a = running.enter_context(_worker(where, "a", "hold", tmp_path))
            _appear(tmp_path / "a.step", a)  # a holds the lease, mid-run, in its tool
            b = running.enter_context(_worker(where, "b", "once", tmp_path))
            assert _finish(b) == (3, "busy a")
            c = running.enter_context(_worker(where, "c", "wait", tmp_path))
            (tmp_path / "c.go").write_text("")
            time.sleep(1.0)  # c is up and waiting (or still starting): it must not get in
            assert not (tmp_path / "c.leased").exists()
            (tmp_path / "a.go").write_text("")
            assert _finish(a) == (0, "done")
            assert _finish(c) == (0, "done")
        texts = anyio.run(self._thread, where)
        assert texts == [
            "a asks",
            "call a-call",
            "a stepped",
            "a done",
            "c asks",
            "call c-call",
            "c stepped",
            "c done",
        ]

    @staticmethod
    async def _thread(where: list[str]) -> list[str]:
        """The thread as items, each said in a word."""
        from tests.agents_session_worker import _store

        store = _store(*where)
        try:
            items = await TinyctxSession("s", store).get_items()
        finally:
            await store.aclose()
        said = []
        for item in items:
            if item.get("type") == "function_call":
                said.append(f"call {item['call_id']}")
            elif item.get("type") == "function_call_output":
                said.append(item["output"])
            elif isinstance(item.get("content"), str):
                said.append(item["content"])
            else:
                said.append("".join(part.get("text", "") for part in item["content"]))
        return said

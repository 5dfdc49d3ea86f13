"""Leaving a durable Session under a cancelled scope: the last write and the lease release
always run (shielded, bounded), on trio and asyncio, on every store (issue #32, item 1).

The trigger is a request timeout: ``with anyio.move_on_after(t): async with Session(...)
as s: await s.run(...)`` with the deadline falling during the run. Afterwards another
worker opens the thread at once, and every tool call stored on it has its result.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.servers import BACKENDS, make_backend
from tinyctx import (
    Agent,
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
    ToolCall,
    ToolResult,
    UserMessage,
    tool,
)
from tinyctx.codec import decode_messages
from tinyctx.messages import check_pairing, pending_tool_calls
from tinyctx.middleware import RuleExtractor, SessionMemory
from tinyctx.middleware.extractors import ExtractionJob
from tinyctx.threads import (
    ArchivedRange,
    Lease,
    ThreadRecord,
    ThreadStore,
    ThreadWrite,
)

T = TypeVar("T")


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A new store of every kind: Memory, SQLite, PostgreSQL, Redis (real servers)."""
    made = make_backend(request.param, request, tmp_path)
    yield made
    await made.aclose()


def _thread() -> str:
    return f"exit-{uuid.uuid4().hex[:12]}"


async def _assert_free_and_paired(store: Any, thread: str) -> tuple[Any, ...]:
    """The thread is not leased (another owner takes it at once) and every stored tool
    call has its result; returns the stored messages."""
    lease = await store.acquire_lease(thread, "next-request", 30.0)  # LeaseHeld if kept
    await store.release_lease(lease)
    messages = decode_messages((await store.load_thread(thread)).messages)
    check_pairing(messages)
    assert not pending_tool_calls(messages), messages
    return messages


class Hang:
    """A model or tool step where the host's deadline falls: it cancels the host's scope
    (``scope``, as ``move_on_after`` does when its time is up) and waits to be cancelled."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.scope: anyio.CancelScope | None = None

    async def __call__(self) -> None:
        self.entered.set()
        if self.scope is not None:
            self.scope.cancel()
        await anyio.sleep_forever()


def _agent(hang_model: Hang | None = None, hang_tool: Hang | None = None, **kw: Any) -> Agent:
    """Calls ``lookup`` once per run, then answers; either step may hang."""

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        last = request.messages[-1]
        if isinstance(last, ToolResult):
            return ModelResponse(AssistantMessage(f"done: {last.text}"))
        if hang_model is not None:
            await hang_model()
        call = ToolCall(f"call_{len(request.messages)}", "lookup", {"q": last.text})
        return ModelResponse(AssistantMessage("", (call,)))

    @tool
    async def lookup(q: str) -> str:
        """Look it up.

        Args:
            q: the query
        """
        if hang_tool is not None:
            await hang_tool()
        return f"found {q}"

    return Agent(model=model, tools=[lookup], **kw)


class TestDeadlineDuringTheRun:
    """A caller's deadline during a run: the session's exit still writes and releases."""

    @pytest.mark.parametrize("step", ["model", "tool"])
    async def test_the_next_request_opens_the_thread_at_once(self, store: Any, step: str) -> None:
        """Cancelled in the model call or in a tool call, the session leaves its thread
        free (no SessionBusy for the lease's TTL) with what it committed written and
        every tool call answered."""
        hang = Hang()
        agent = _agent(hang if step == "model" else None, hang if step == "tool" else None)
        thread = _thread()
        with anyio.move_on_after(30) as deadline:
            hang.scope = deadline
            async with Session(agent, thread_id=thread, store=store) as session:
                await session.run("hi")
        assert deadline.cancelled_caught and hang.entered.is_set()
        messages = await _assert_free_and_paired(store, thread)
        assert messages[0] == UserMessage("hi")
        if step == "tool":  # the call that was running is answered, and says so
            assert "interrupted while running" in messages[-1].text
        # and the thread goes on in the next request
        async with Session(_agent(), thread_id=thread, store=store, owner="w2") as session:
            assert (await session.run("again")).final_text == "done: found again"

    async def test_the_deadline_falling_during_the_exit_still_releases(self, store: Any) -> None:
        """The run ended, then the deadline passed while the exit flushed and wrote."""
        thread = _thread()
        with anyio.CancelScope() as scope:
            async with Session(_agent(), thread_id=thread, store=store) as session:
                await session.run("hi")
                scope.cancel()  # the exit runs in a cancelled scope
        messages = await _assert_free_and_paired(store, thread)
        assert messages[-1] == AssistantMessage("done: found hi")

    async def test_an_error_leaving_a_cancelled_scope_stays_itself(self, store: Any) -> None:
        """The body's own error propagates out of the exit, never replaced by the host's
        cancellation (which its enclosing scope would swallow: the error lost)."""
        thread = _thread()
        with pytest.raises(LookupError, match="the caller's own"):
            with anyio.CancelScope() as scope:
                async with Session(_agent(), thread_id=thread, store=store) as session:
                    await session.run("hi")
                    scope.cancel()
                    raise LookupError("the caller's own")
        await _assert_free_and_paired(store, thread)

    async def test_background_work_running_at_the_deadline_gets_its_grace(self, store: Any) -> None:
        """The deadline passing while the exit waits for an extraction: the extraction
        still has the grace period, its notes land, and the lease is released after it."""
        started, leaving = anyio.Event(), anyio.Event()
        host: list[anyio.CancelScope] = []

        class Slow(RuleExtractor):
            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
                started.set()
                await leaving.wait()
                host[0].cancel()  # the caller's deadline, while the session is leaving
                await anyio.sleep(0.01)
                return await super().extract(job, ctx)

        memory = SessionMemory(Slow(), store=store, min_tokens=0, min_tool_calls=0, min_turns=1)
        thread = _thread()
        with anyio.CancelScope() as scope:
            host.append(scope)
            async with Session(_agent(middleware=[memory]), thread_id=thread, store=store) as s:
                await s.run("I prefer tea.")
                await started.wait()
                leaving.set()  # the block ends here: the exit waits for the extraction
        await _assert_free_and_paired(store, thread)
        notes = await store.notes(f"session_memory:thread:{thread}")
        assert "User preference: I prefer tea." in [n.text for n in notes]


class Tripwire:
    """Cancels the host's scope at the ``at``-th step it sees (a store call, a model call
    or a tool call): just ``before`` that step, just ``after`` it returned, or as its reply
    is ``lost`` (the step completed, then the cancellation raises from inside it, as a
    call cancelled while its reply travels would)."""

    def __init__(self, at: int, when: str) -> None:
        self.at, self.when, self.seen = at, when, 0
        self.scope: anyio.CancelScope | None = None

    async def step(self, op: Callable[[], Awaitable[T]]) -> T:
        scope = self.scope if self.seen == self.at else None
        self.seen += 1
        if scope is not None and self.when == "before":
            scope.cancel()
        result = await op()
        if scope is not None and self.when != "before":
            scope.cancel()
            if self.when == "lost":
                await anyio.lowlevel.checkpoint()
        return result


class TrippedStore(ThreadStore):
    """A ThreadStore whose every call passes a :class:`Tripwire` first."""

    def __init__(self, inner: Any, wire: Tripwire) -> None:
        self.inner, self.wire = inner, wire

    async def load_thread(self, thread_id: str) -> ThreadRecord:
        return await self.wire.step(lambda: self.inner.load_thread(thread_id))

    async def write(
        self,
        thread_id: str,
        change: ThreadWrite,
        *,
        expected_version: int,
        lease: Lease | None = None,
    ) -> int:
        return await self.wire.step(
            lambda: self.inner.write(
                thread_id, change, expected_version=expected_version, lease=lease
            )
        )

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Lease:
        return await self.wire.step(lambda: self.inner.acquire_lease(thread_id, owner, ttl))

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        return await self.wire.step(lambda: self.inner.renew_lease(lease, ttl))

    async def release_lease(self, lease: Lease) -> None:
        await self.wire.step(lambda: self.inner.release_lease(lease))

    async def list_threads(self, *, prefix: str = "", limit: int | None = None) -> list[str]:
        return await self.wire.step(lambda: self.inner.list_threads(prefix=prefix, limit=limit))

    async def archived(self, thread_id: str) -> list[ArchivedRange]:
        return await self.wire.step(lambda: self.inner.archived(thread_id))

    async def delete_thread(self, thread_id: str) -> bool:
        return await self.wire.step(lambda: self.inner.delete_thread(thread_id))

    async def aclose(self) -> None:
        """The inner store is the test's to close."""


def _wired_agent(wire: Tripwire, store: Any) -> Agent:
    """Two tool calls per run and session memory (background work at the exit); the
    model and the tools pass the tripwire too."""

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        async def answer() -> ModelResponse:
            await anyio.lowlevel.checkpoint()
            last = request.messages[-1]
            if isinstance(last, ToolResult):
                return ModelResponse(AssistantMessage(f"Noted {last.text}."))
            calls = tuple(
                ToolCall(f"c{len(request.messages)}_{k}", "save", {"key": f"{last.text}{k}"})
                for k in range(2)
            )
            return ModelResponse(AssistantMessage("", calls))

        return await wire.step(answer)

    @tool
    async def save(key: str) -> str:
        """Save it.

        Args:
            key: what to save
        """

        async def saved() -> str:
            await anyio.lowlevel.checkpoint()
            return f"saved {key}"

        return await wire.step(saved)

    memory = SessionMemory(RuleExtractor(), store=store, min_tokens=0, min_tool_calls=0)
    return Agent(model=model, tools=[save], middleware=[memory])


class TestDeadlineWhileEntering:
    """A deadline while the session takes its lease leaves the thread free."""

    async def test_a_lease_granted_as_the_deadline_falls_is_given_up(self, store: Any) -> None:
        """The store granted the lease but the cancellation lost its reply (the session
        never learnt its token): entering gives up the live lease its owner holds."""
        wire = Tripwire(0, "lost")
        thread = _thread()
        with anyio.CancelScope() as scope:
            wire.scope = scope
            async with Session(_agent(), thread_id=thread, store=TrippedStore(store, wire)):
                raise AssertionError("entered although cancelled")  # pragma: no cover
        assert scope.cancelled_caught
        await _assert_free_and_paired(store, thread)


class TestCancelledAtAnyStep:
    """A bounded soak: the host cancelled before, after or as the reply of any step of a
    session's life arrives (entering, each store call, model and tool call, the exit)
    leaves no lease held and no orphan tool call."""

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
    # a session here has 21 steps: every one of them, in each way, and a few past the end
    @given(at=st.integers(0, 28), when=st.sampled_from(["before", "after", "lost"]))
    async def test_no_lease_held_and_no_orphan_call(self, store: Any, at: int, when: str) -> None:
        """Wherever the cancellation lands, the next request opens the thread at once and
        finds every tool call answered."""
        wire = Tripwire(at, when)
        thread = _thread()
        tripped = TrippedStore(store, wire)
        agent = _wired_agent(wire, store)
        with anyio.CancelScope() as scope:
            wire.scope = scope
            async with Session(agent, thread_id=thread, store=tripped) as session:
                for run in range(2):
                    await session.run(f"I prefer option {run}.")
        await _assert_free_and_paired(store, thread)

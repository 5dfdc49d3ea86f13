"""Property tests: a streamed run equals the same run with run(); closing early keeps pairing."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    Event,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunContext,
    RunResult,
    Session,
    SqliteStore,
)
from tinyctx.codec import decode_messages
from tinyctx.messages import ToolCall, check_pairing
from tinyctx.streaming import FinalResult, StreamEvent, TextDelta
from tinyctx.testing import FakeTool, ScriptedModel, reply, stream
from tinyctx.testing._fakes import ScriptItem
from tinyctx.threads import ThreadStore

# a step: ("tools", outcomes, streamed) with outcomes "ok" / "fail", or ("text", text, streamed)
tool_steps = st.tuples(
    st.just("tools"),
    st.lists(st.sampled_from(["ok", "fail"]), min_size=1, max_size=2),
    st.booleans(),
)
final_steps = st.tuples(st.just("text"), st.text(max_size=20), st.booleans())
scripts = st.tuples(st.lists(tool_steps, max_size=3), final_steps)


def _items(script: Any) -> list[ScriptItem]:
    steps, (_, text, streamed) = script
    items: list[ScriptItem] = []
    for turn, (_, outcomes, streamed_step) in enumerate(steps):
        calls = [ToolCall(f"c{turn}_{i}", outcome, {"n": i}) for i, outcome in enumerate(outcomes)]
        response = reply(f"step {turn}", *calls, usage=(10 + turn, 2))
        items.append(stream(response) if streamed_step else response)
    last = reply(text, usage=(30, 4))
    items.append(stream(last) if streamed else last)
    return items


def _agent(model: Callable[..., Any]) -> Agent:
    ok = FakeTool("ok", returns="fine")
    fail = FakeTool("fail", returns=ValueError("no"))
    return Agent(model, tools=[ok.tool, fail.tool])


def _events(events: tuple[Event, ...]) -> list[tuple[str, dict[str, Any]]]:
    """Events as kind and payload, without what differs between two runs (timings)."""
    return [(e.kind, {k: v for k, v in e.payload().items() if k != "seconds"}) for e in events]


def _same_run(result: RunResult) -> tuple[Any, ...]:
    """A result without its run id (each run has its own) and event timings."""
    return (
        result.final_text,
        result.messages,
        result.usage,
        result.status,
        result.thread_id,
        result.model_calls,
        result.tool_calls,
        _events(result.events),
    )


@asynccontextmanager
async def _store(kind: str) -> AsyncIterator[ThreadStore]:
    if kind == "memory":
        yield MemoryStore()
        return
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteStore(Path(folder) / "threads.db")
        try:
            yield store
        finally:
            await store.aclose()


class _Paced:
    """A model whose every call waits for a permit the test hands out (racing the token)."""

    def __init__(self, inner: Callable[..., Any], permits: anyio.Semaphore) -> None:
        self.inner = inner
        self.permits = permits

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        with ctx.cancellation.linked_scope("paced"):
            await self.permits.acquire()
        response: ModelResponse = await self.inner(request, ctx)
        return response


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
class TestStreamEqualsRun:
    """Whatever the script, streaming a run changes nothing but how it is read."""

    @pytest.mark.slow  # a durable run per example, on every store: CI's slow group runs it
    @given(script=scripts)
    async def test_result_and_stored_thread_equal_run(self, store_kind: str, script: Any) -> None:
        """The stream ends with a result equal to run()'s, and the stored threads are equal."""
        async with _store(store_kind) as first, _store(store_kind) as second:
            agent = _agent(ScriptedModel(_items(script)))
            async with Session(agent, thread_id="t", store=first) as session:
                expected = await session.run("go")
            agent = _agent(ScriptedModel(_items(script)))
            async with Session(agent, thread_id="t", store=second) as session:
                items: list[StreamEvent] = [i async for i in session.stream("go")]
            final = items[-1]
            assert isinstance(final, FinalResult)
            assert all(not isinstance(i, FinalResult) for i in items[:-1])
            assert _same_run(final.result) == _same_run(expected)
            one, two = await first.load_thread("t"), await second.load_thread("t")
            assert list(one.messages) == list(two.messages)
            assert (one.checkpoint, one.version) == (two.checkpoint, two.version)
        steps, final_step = script
        streamed = [f"step {t}" for t, step in enumerate(steps) if step[2]]
        streamed += [final_step[1]] if final_step[2] else []
        assert "".join(i.text for i in items if isinstance(i, TextDelta)) == "".join(streamed)

    @pytest.mark.slow  # a durable run per example, on every store: CI's slow group runs it
    @given(script=scripts, permits=st.integers(0, 4), spins=st.integers(0, 6))
    async def test_closing_early_keeps_pairing(
        self, store_kind: str, script: Any, permits: int, spins: int
    ) -> None:
        """Closed at any point, the history and the stored thread pair; the session goes on."""
        async with _store(store_kind) as store:
            gate = anyio.Semaphore(0)
            paced = _Paced(ScriptedModel(_items(script)), gate)
            agent = _agent(paced)
            async with Session(agent, thread_id="t", store=store) as session:
                async with session.stream("go"):
                    for _ in range(permits):
                        gate.release()
                    for _ in range(spins):
                        await anyio.lowlevel.checkpoint()
                check_pairing(session.conversation_messages, allow_pending=False)
                paced.inner = ScriptedModel(["after"])
                for _ in range(4):
                    gate.release()
                assert (await session.run("again")).final_text == "after"
            record = await store.load_thread("t")
            check_pairing(decode_messages(list(record.messages)), allow_pending=False)
            async with Session(agent, thread_id="t", store=store) as again:  # the lease is free
                assert again.conversation_messages == session.conversation_messages

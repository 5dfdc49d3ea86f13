"""What a Session costs before any layer does anything: a run's fixed cost, idle memory.

    python benchmarks/bench_session.py [--quick]

1. **Fixed cost of a run** (issue #39, gap 2): ``Session.run("hi")`` of an agent with no
   layers and a model that answers at once, on trio and on asyncio, against the floor of
   the same model awaited bare (``await model(request, ctx)``). Rounds interleave the two
   (a batch of runs, then a batch of bare awaits); the row reports the medians. Target:
   <= 20 µs per run.
2. **Idle memory** (gap 3): the bytes (``tracemalloc``) one entered, idle Session holds,
   measured over many sessions kept open at once (an exit stack holds them, in both
   counts); the floor is an entered anyio task group, the one thing a session must hold
   to own background work. The row's time is
   entering and leaving one idle session against entering and leaving the bare group.
   Target: <= 4 KB per idle session.
3. **Throughput under concurrency** (gap 3): runs per second with 1,000 sessions running
   at once against 100 at once (the same total number of runs, interleaved round by round).
   Target: 1,000 sessions at most 10% slower per run than 100.

Times are the process's CPU time (``time.process_time``): the machine is shared, and what
is measured runs on one thread without waiting on anything.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio.lowlevel
from _harness import Row, print_table

from tinyctx import Agent, AssistantMessage, Session, UserMessage
from tinyctx.context import RunConfig, RunContext
from tinyctx.events import EventSink
from tinyctx.model import ModelRequest, ModelResponse

ANSWER = ModelResponse(AssistantMessage("ok"))
REQUEST = ModelRequest(messages=(UserMessage("hi"),))
HISTORY = (UserMessage("hi"), AssistantMessage("ok"))
FIXED_COST_TARGET = 20e-6
IDLE_BYTES_TARGET = 4 * 1024
CONCURRENCY_TARGET = 1.10


async def instant_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return ANSWER


def _agent() -> Agent:
    return Agent(model=instant_model)


async def _per_call(fn: Callable[[], Awaitable[Any]], number: int) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(number):
            await fn()
        return (time.process_time() - start) / number
    finally:
        gc.enable()


async def _fixed_cost(quick: bool) -> tuple[float, float]:
    """Median seconds per run and per bare await, rounds interleaved."""
    number, rounds = (500, 5) if quick else (3_000, 9)
    ctx = RunContext.new(events=EventSink(logger=None))
    async with Session(
        _agent(), config=RunConfig(max_model_calls=None), events=EventSink(logger=None)
    ) as session:
        conversation = session.ctx.conversation

        async def run() -> None:
            # the same two-message thread every time: the cost measured is the run's, flat
            conversation.replace(HISTORY, emit_new=False)
            await session.run("hi")

        async def bare() -> None:
            await instant_model(REQUEST, ctx)

        await _per_call(run, number // 5)  # warm up
        runs, floors = [], []
        for _ in range(rounds):
            runs.append(await _per_call(run, number))
            floors.append(await _per_call(bare, number))
    return statistics.median(runs), statistics.median(floors)


async def _idle_bytes(count: int) -> float:
    """Bytes per entered idle Session, ``count`` of them open at once."""
    agent = _agent()
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(10):  # first-use caches (attrs, anyio) off the count
            await stack.enter_async_context(Session(agent))
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            sessions = [Session(agent) for _ in range(count)]
            for session in sessions:
                await stack.enter_async_context(session)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    return held / count


async def _floor_bytes(count: int) -> float:
    """Bytes per entered anyio task group, ``count`` open at once (the floor)."""
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(10):
            await stack.enter_async_context(anyio.create_task_group())
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            groups = [anyio.create_task_group() for _ in range(count)]
            for group in groups:
                await stack.enter_async_context(group)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    return held / count


async def _enter_times(quick: bool) -> tuple[float, float]:
    """Median seconds to enter and leave one idle Session, and one bare task group."""
    number, rounds = (300, 5) if quick else (2_000, 7)
    agent = _agent()

    async def session() -> None:
        async with Session(agent):
            pass

    async def group() -> None:
        async with anyio.create_task_group():
            pass

    ours, floors = [], []
    for _ in range(rounds):
        ours.append(await _per_call(session, number))
        floors.append(await _per_call(group, number))
    return statistics.median(ours), statistics.median(floors)


async def _concurrent(sessions: int, runs_total: int) -> float:
    """Seconds per run with ``sessions`` sessions running at once, ``runs_total`` runs in
    all; the clock runs from the moment every session is entered to the last run's end
    (entering and leaving are not counted)."""
    agent = _agent()
    per_session = max(1, runs_total // sessions)
    entered, go = [0], anyio.Event()
    finished: list[float] = []

    async def one() -> None:
        async with Session(agent, config=RunConfig(max_model_calls=None)) as session:
            conversation = session.ctx.conversation
            entered[0] += 1
            await go.wait()
            for _ in range(per_session):
                conversation.replace(HISTORY, emit_new=False)
                await session.run("hi")
            finished.append(time.process_time())

    gc.collect()
    async with anyio.create_task_group() as group:
        for _ in range(sessions):
            group.start_soon(one)
        while entered[0] < sessions:
            await anyio.lowlevel.checkpoint()
        start = time.process_time()
        go.set()
    return (max(finished) - start) / (per_session * sessions)


async def _throughput(quick: bool) -> tuple[float, float]:
    runs_total, rounds = (4_000, 3) if quick else (20_000, 5)
    many, few = [], []
    for _ in range(rounds):
        few.append(await _concurrent(100, runs_total))
        many.append(await _concurrent(1_000, runs_total))
    return statistics.median(many), statistics.median(few)


def _kb(value: float) -> str:
    return f"{value / 1024:.1f} KB"


def run(quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    for backend in ("trio", "asyncio"):
        ours, floor = anyio.run(_fixed_cost, quick, backend=backend)
        rows.append(
            Row(
                "run fixed cost",
                f"Session.run, no layers, {backend}",
                ours,
                baseline="bare await of the model",
                baseline_seconds=floor,
                target="<= 20 µs per run",
                met=ours <= FIXED_COST_TARGET,
            )
        )
    count = 500 if quick else 2_000
    for backend in ("trio", "asyncio"):
        held = anyio.run(_idle_bytes, count, backend=backend)
        floor_held = anyio.run(_floor_bytes, count, backend=backend)
        ours, floor = anyio.run(_enter_times, quick, backend=backend)
        rows.append(
            Row(
                "idle session memory",
                f"{_kb(held)} per idle Session, {backend} (time: enter+exit)",
                ours,
                baseline=f"entered task group {_kb(floor_held)}",
                baseline_seconds=floor,
                target="<= 4 KB per idle session",
                met=held <= IDLE_BYTES_TARGET,
                extra={"bytes": held, "floor_bytes": floor_held},
            )
        )
    for backend in ("trio", "asyncio"):
        many, few = anyio.run(_throughput, quick, backend=backend)
        rows.append(
            Row(
                "session concurrency",
                f"per run, 1,000 sessions at once, {backend}",
                many,
                baseline="the same runs, 100 sessions at once",
                baseline_seconds=few,
                target="<= 1.10x the 100-session time",
                met=many <= few * CONCURRENCY_TARGET,
            )
        )
    return rows


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

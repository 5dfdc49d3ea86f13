"""Host cancellations at random points of durable sessions (issue #32, item 1).

Every trial is one request: ``with anyio.move_on_after(t): async with Session(...,
store=...) as s`` running two runs (each calls a tool; session memory extracts in the
background), ``t`` drawn uniformly over how long an uncancelled request takes, so the
deadline falls anywhere: while the lease is taken, the thread loaded, a model or a tool
called, a message written, background work waited for, the lease released. Trials go on
until ``TRIALS`` deadlines fell during their request (``cancelled``; ``requests`` counts
them all). Right after each trial, as the next request would, the thread's lease is
taken by another owner (``held`` counts a LeaseHeld: the thread kept hostage) and its
stored history checked: ``orphan calls`` counts tool calls without a result (and
``unpaired threads`` results without a call).

Used by ``bench_load.py``; ``python benchmarks/_cancel_soak.py [TRIALS]`` runs it alone.
Servers: ``TINYCTX_TEST_POSTGRES_URL`` / ``TINYCTX_TEST_REDIS_URL``, or started (and
stopped) here with ``.ci/services.sh``.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from _harness import servers

from tinyctx import (
    Agent,
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    PairingError,
    RunContext,
    Session,
    SqliteStore,
    ToolCall,
    ToolResult,
    Usage,
    tool,
)
from tinyctx.codec import decode_messages
from tinyctx.messages import check_pairing, pending_tool_calls
from tinyctx.middleware import RuleExtractor, SessionMemory
from tinyctx.middleware.extractors import ExtractionJob
from tinyctx.threads import LeaseHeld

STORES = ("sqlite", "postgres", "redis")
LOOPS = ("trio", "asyncio")
CONCURRENT = 8  # trials at once (a busy service times out several requests together)


async def _model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    """Calls ``save`` once per run, then answers; takes a moment as a provider would."""
    await anyio.sleep(random.random() * 0.004)
    last = request.messages[-1]
    if isinstance(last, ToolResult):
        return ModelResponse(AssistantMessage("Noted."), usage=Usage(400, 5))
    call = ToolCall(f"call_{len(request.messages)}", "save", {"key": last.text})
    return ModelResponse(AssistantMessage("", (call,)), usage=Usage(300, 10))


@tool
async def save(key: str) -> str:
    """Save one value (a tool that takes a moment).

    Args:
        key: what to save
    """
    await anyio.sleep(random.random() * 0.004)
    return f"saved {key}"


class SlowRules(RuleExtractor):
    """The offline extractor, taking a moment as a model would (background work that is
    often still running when the request's deadline falls)."""

    async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
        await anyio.sleep(random.random() * 0.01)
        return await super().extract(job, ctx)


def _agent(store: Any) -> Agent:
    memory = SessionMemory(SlowRules(), store=store, min_tokens=0, min_tool_calls=0, min_turns=1)
    return Agent(model=_model, tools=[save], middleware=[memory])


async def _request(agent: Agent, store: Any, thread: str) -> None:
    async with Session(agent, thread_id=thread, store=store, grace_period=1.0) as session:
        for run in range(2):
            await session.run(f"I prefer option {run}.")


async def _check(store: Any, thread: str, counts: Counter[str]) -> None:
    """What the next request finds: the lease free, every stored tool call answered."""
    try:
        lease = await store.acquire_lease(thread, "next-request", 30.0)
    except LeaseHeld:
        counts["held"] += 1
    else:
        await store.release_lease(lease)
    messages = decode_messages((await store.load_thread(thread)).messages)
    counts["orphan calls"] += len(pending_tool_calls(messages))
    try:
        check_pairing(messages)
    except PairingError:
        counts["unpaired threads"] += 1
    counts["messages"] += len(messages)


async def _soak(store: Any, trials: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    agent = _agent(store)
    # how long an uncancelled request takes: the deadlines are drawn over it
    durations = []
    for _ in range(20):
        started = time.perf_counter()
        await _request(agent, store, f"warm-{uuid.uuid4().hex[:10]}")
        durations.append(time.perf_counter() - started)
    span = statistics.quantiles(durations, n=10)[-1] * 1.2
    counts: Counter[str] = Counter(held=0, **{"orphan calls": 0, "unpaired threads": 0})
    counts["cancelled"] = 0
    errors: list[str] = []

    async def trial(index: int, deadline: float) -> None:
        thread = f"cancel-{seed}-{index}"
        with anyio.move_on_after(deadline) as scope:
            try:
                await _request(agent, store, thread)
            except Exception as exc:  # counted, never hidden
                errors.append(f"{type(exc).__name__}: {exc}")
        # the deadline fell during the request (in its exit too, where nothing raises)
        counts["cancelled"] += scope.cancel_called
        counts["requests"] += 1
        await _check(store, thread, counts)

    started = time.perf_counter()
    index = 0
    while counts["cancelled"] < trials:  # a deadline drawn past a request's end cancels none
        async with anyio.create_task_group() as group:
            for _ in range(CONCURRENT):
                group.start_soon(trial, index, rng.uniform(0, span))
                index += 1
    return {
        **counts,
        "trials": trials,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "deadline_span_ms": round(span * 1000, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _open(kind: str, urls: tuple[str, str], directory: str, name: str) -> Any:
    if kind == "sqlite":
        return SqliteStore(Path(directory) / f"{name}.db")
    if kind == "postgres":
        from tinyctx.backends.postgres import PostgresStore

        return PostgresStore(urls[0], schema=name)
    from tinyctx.backends.redis import RedisStore

    return RedisStore(urls[1], prefix=name + ":")


def _drop(kind: str, urls: tuple[str, str], name: str) -> None:
    """Remove what the soak stored on a server."""
    if kind == "postgres":
        import psycopg

        with psycopg.connect(urls[0], autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    elif kind == "redis":
        import redis

        client = redis.Redis.from_url(urls[1])
        try:
            keys = list(client.scan_iter(match=name + ":*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        finally:
            client.close()


def cancellation_soak(trials: int, urls: tuple[str, str]) -> list[dict[str, Any]]:
    """``trials`` cancelled requests on each loop x store; one figures dict per pair."""
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        for loop in LOOPS:
            for seed, kind in enumerate(STORES):
                name = f"bench_cancel_{uuid.uuid4().hex[:10]}"

                async def main(kind: str = kind, seed: int = seed, name: str = name) -> Any:
                    store = _open(kind, urls, directory, name)
                    try:
                        return await _soak(store, trials, seed)
                    finally:
                        await store.aclose()

                try:
                    figures = anyio.run(main, backend=loop)
                finally:
                    _drop(kind, urls, name)
                out.append({"loop": loop, "store": kind, **figures})
    return out


if __name__ == "__main__":
    import sys

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with servers("the cancellation soak") as found:
        for row in cancellation_soak(count, found):
            print(row)

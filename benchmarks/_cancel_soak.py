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

Used by ``bench_load.py``; ``python benchmarks/_cancel_soak.py [TRIALS] [--trace]
[--stores redis,...]`` runs it alone. With ``--trace`` the store's lease and thread calls
are recorded per thread (a subclass of the store, the library untouched), and each lease
found held is reported: the cancelled request's owner, the holder LeaseHeld named, the
steps of the request (which call the deadline cancelled) and of the store's calls in
order, and whether the lease was still held once the soak ended (``held at the end``: a
lease kept until its TTL, not one its request's cleanup released a moment late).
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
    async with Session(
        agent, thread_id=thread, store=store, grace_period=1.0, owner=f"request-{thread}"
    ) as session:
        for run in range(2):
            await session.run(f"I prefer option {run}.")


class LeaseTrace:
    """Mixed into a store's class by ``--trace``: each lease and thread call, recorded
    per thread as ``<step>>`` (started), ``<step><`` (answered: the lease it returned or
    saw, ``owner#token``) or ``<step>!<exception>`` (a deadline shows as Cancelled)."""

    trace: dict[str, list[str]]

    async def _traced(self, thread_id: str, step: str, call: Any) -> Any:
        log = self.trace.setdefault(thread_id, [])
        log.append(f"{step}>")
        try:
            answer = await call
        except BaseException as exc:
            log.append(f"{step}!{type(exc).__name__}")
            raise
        lease = getattr(answer, "lease", answer)
        shown = f"{lease.owner}#{lease.token}" if hasattr(lease, "token") else ""
        log.append(f"{step}<{shown}")
        return answer

    async def acquire_lease(self, thread_id: str, owner: str, ttl: float) -> Any:
        call = super().acquire_lease(thread_id, owner, ttl)  # type: ignore[misc]
        return await self._traced(thread_id, f"acquire({owner})", call)

    async def renew_lease(self, lease: Any, ttl: float) -> Any:
        call = super().renew_lease(lease, ttl)  # type: ignore[misc]
        return await self._traced(lease.thread_id, f"renew(#{lease.token})", call)

    async def release_lease(self, lease: Any) -> Any:
        call = super().release_lease(lease)  # type: ignore[misc]
        return await self._traced(lease.thread_id, f"release(#{lease.token})", call)

    async def load_thread(self, thread_id: str) -> Any:
        call = super().load_thread(thread_id)  # type: ignore[misc]
        return await self._traced(thread_id, "load", call)

    async def write(self, thread_id: str, change: Any, **options: Any) -> Any:
        call = super().write(thread_id, change, **options)  # type: ignore[misc]
        return await self._traced(thread_id, "write", call)


def _held_report(store: Any, thread: str, holder: str) -> dict[str, Any]:
    """What ``--trace`` knows of a lease found held on ``thread``."""
    steps = list(getattr(store, "trace", {}).get(thread, ()))
    cancelled = [step for step in steps if step.endswith(("!Cancelled", "!CancelledError"))]
    return {
        "thread": thread,
        "request owner": f"request-{thread}",
        "holder": holder,
        "cancelled at": cancelled[0].split("!")[0] if cancelled else "(no call cancelled)",
        "steps": steps,
    }


async def _check(store: Any, thread: str, counts: Counter[str], held: list[Any]) -> None:
    """What the next request finds: the lease free, every stored tool call answered."""
    try:
        lease = await store.acquire_lease(thread, "next-request", 30.0)
    except LeaseHeld as exc:
        counts["held"] += 1
        if hasattr(store, "trace"):
            held.append(_held_report(store, thread, exc.owner))
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
    held: list[dict[str, Any]] = []  # with --trace: each lease found held

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
        await _check(store, thread, counts, held)

    started = time.perf_counter()
    index = 0
    while counts["cancelled"] < trials:  # a deadline drawn past a request's end cancels none
        async with anyio.create_task_group() as group:
            for _ in range(CONCURRENT):
                group.start_soon(trial, index, rng.uniform(0, span))
                index += 1
    seconds = time.perf_counter() - started
    for report in held:  # a lease its request's cleanup only released late is free now
        try:
            await store.release_lease(await store.acquire_lease(report["thread"], "end", 30.0))
            report["held at the end"] = False
        except LeaseHeld:
            report["held at the end"] = True
    return {
        **counts,
        "trials": trials,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "deadline_span_ms": round(span * 1000, 1),
        "seconds": round(seconds, 1),
        **({"held_leases": held} if hasattr(store, "trace") else {}),
    }


def _open(kind: str, urls: tuple[str, str], directory: str, name: str, trace: bool) -> Any:
    if kind == "sqlite":
        kind_class: type[Any] = SqliteStore
        args: tuple[Any, ...] = (Path(directory) / f"{name}.db",)
        options: dict[str, Any] = {}
    elif kind == "postgres":
        from tinyctx.backends.postgres import PostgresStore

        kind_class, args, options = PostgresStore, (urls[0],), {"schema": name}
    else:
        from tinyctx.backends.redis import RedisStore

        kind_class, args, options = RedisStore, (urls[1],), {"prefix": name + ":"}
    if not trace:
        return kind_class(*args, **options)
    store = type(f"Traced{kind_class.__name__}", (LeaseTrace, kind_class), {})(*args, **options)
    store.trace = {}
    return store


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


def cancellation_soak(
    trials: int,
    urls: tuple[str, str],
    *,
    stores: tuple[str, ...] = STORES,
    trace: bool = False,
) -> list[dict[str, Any]]:
    """``trials`` cancelled requests on each loop x store; one figures dict per pair.

    Args:
        trials: how many requests per pair must have been cancelled by their deadline
        urls: the PostgreSQL and Redis URLs
        stores: which of ``STORES`` to soak
        trace: record the store's calls and report each lease found held (``--trace``)
    """
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        for loop in LOOPS:
            for seed, kind in enumerate(STORES):
                if kind not in stores:
                    continue
                name = f"bench_cancel_{uuid.uuid4().hex[:10]}"

                async def main(kind: str = kind, seed: int = seed, name: str = name) -> Any:
                    store = _open(kind, urls, directory, name, trace)
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
    import argparse

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    parser = argparse.ArgumentParser(description="Deadlines at random points of requests.")
    parser.add_argument("trials", type=int, nargs="?", default=2000)
    parser.add_argument("--trace", action="store_true", help="report each lease found held")
    parser.add_argument("--stores", default=",".join(STORES), help="e.g. redis or sqlite,redis")
    options = parser.parse_args()
    chosen = tuple(options.stores.split(","))
    if unknown := set(chosen) - set(STORES):
        parser.error(f"--stores: unknown {sorted(unknown)}; choose from {', '.join(STORES)}")
    with servers("the cancellation soak") as found:
        for row in cancellation_soak(options.trials, found, stores=chosen, trace=options.trace):
            for report in row.pop("held_leases", ()):
                print("  held:", report)
            print(row)

"""Durable threads on PostgreSQL and Redis: per-step cost, loading 2000 messages, and
throughput with 1, 2 and 4 worker processes.

The same measurement as ``bench_durable`` (real transcripts, one step = one agent turn,
codec included, bytes = what the database grew by), on real servers, side by side in the
same run with the peers' backends for the same databases when the ``bench`` extra has them:

- PostgreSQL: ``PostgresStore`` beside LangGraph's ``AsyncPostgresSaver`` behind a
  ``MessagesState`` graph (``langgraph-checkpoint-postgres``);
- Redis: ``RedisStore`` beside the OpenAI Agents SDK's ``RedisSession``
  (``openai-agents[redis]``). LangGraph's ``AsyncRedisSaver`` (``langgraph-checkpoint-redis``)
  needs the RediSearch and RedisJSON modules of Redis Stack; on a plain redis-server it
  cannot start, which is printed.

Throughput: N worker processes, each serving requests on threads of its own (lease,
load, write one step, release) for a fixed time on one database; SQLite (one file) too.

Servers: ``TINYCTX_TEST_POSTGRES_URL`` / ``TINYCTX_TEST_REDIS_URL``, or started (and
stopped) here with ``.ci/services.sh``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_durable  # noqa: E402
from _harness import Row, fmt_seconds, print_table, servers  # noqa: E402
from bench_durable import (  # noqa: E402
    Backend,
    Ours,
    build_thread,
    measure_backends,
    split_steps,
)

from tinyctx import Message, SqliteStore  # noqa: E402
from tinyctx.backends.postgres import PostgresStore  # noqa: E402
from tinyctx.backends.redis import RedisStore  # noqa: E402
from tinyctx.codec import encode_messages  # noqa: E402
from tinyctx.threads import ThreadWrite  # noqa: E402

try:
    from langchain_core.messages import convert_to_messages
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    HAVE_LANGGRAPH_PG = True
except ImportError:  # pragma: no cover - the bench extra is optional
    HAVE_LANGGRAPH_PG = False

try:
    from langgraph.checkpoint.redis.aio import AsyncRedisSaver

    HAVE_LANGGRAPH_REDIS = True
except ImportError:  # pragma: no cover - the bench extra is optional
    HAVE_LANGGRAPH_REDIS = False

try:
    from agents.extensions.memory.redis_session import RedisSession

    HAVE_OPENAI_REDIS = True
except ImportError:  # pragma: no cover - the bench extra is optional
    HAVE_OPENAI_REDIS = False

from tinyctx.formats import to_openai  # noqa: E402


def _name() -> str:
    return f"bench_{uuid.uuid4().hex[:12]}"


def _pg_bytes(url: str, schemas: Sequence[str]) -> int:
    """Every table and index of ``schemas`` (pages PostgreSQL allocated)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        row = conn.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = ANY(%s)",
            (list(schemas),),
        ).fetchone()
    return int(row[0]) if row else 0


def _redis_bytes(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


class OursPostgres(Ours):
    name = "tinyctx PostgresStore"

    def __init__(self, folder: Path, url: str) -> None:
        super().__init__(folder)
        self.url, self.schema = url, _name()

    async def open(self) -> None:
        self.store = PostgresStore(self.url, schema=self.schema)  # type: ignore[assignment]
        await self.store.open()
        self.versions, self.leases = {}, {}

    def size_bytes(self) -> int:
        return _pg_bytes(self.url, [self.schema])


class OursRedis(Ours):
    name = "tinyctx RedisStore"

    def __init__(self, folder: Path, url: str) -> None:
        super().__init__(folder)
        self.url, self.prefix = url, _name() + ":"

    async def open(self) -> None:
        self.store = RedisStore(self.url, prefix=self.prefix)  # type: ignore[assignment]
        await self.store.open()
        self.versions, self.leases = {}, {}

    def size_bytes(self) -> int:
        return _redis_bytes(self.url)


class LangGraphPostgres(Backend):
    name = "LangGraph AsyncPostgresSaver"

    def __init__(self, folder: Path, url: str) -> None:
        super().__init__(folder)
        self.url = url

    async def open(self) -> None:
        self._cm = AsyncPostgresSaver.from_conn_string(self.url)
        self.saver = await self._cm.__aenter__()
        await self.saver.setup()
        builder = StateGraph(MessagesState)
        builder.add_node("agent", bench_durable._no_change)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        self.graph = builder.compile(checkpointer=self.saver)
        self.run = _name()

    async def close(self) -> None:
        await self._cm.__aexit__(None, None, None)

    def config(self, thread: str) -> Any:
        return {"configurable": {"thread_id": f"{self.run}-{thread}"}}

    async def prefill(self, thread: str, messages: Sequence[Message]) -> None:
        await self.graph.ainvoke({"messages": self.prepare(messages)}, self.config(thread))

    def prepare(self, step: Sequence[Message]) -> Any:
        return convert_to_messages(to_openai(step, for_api=True))

    async def step(self, thread: str, prepared: Any) -> None:
        await self.graph.ainvoke({"messages": prepared}, self.config(thread))

    async def load(self, thread: str) -> int:
        found = await self.saver.aget_tuple(self.config(thread))
        assert found is not None
        return len(found.checkpoint["channel_values"]["messages"])

    def size_bytes(self) -> int:
        return _pg_bytes(self.url, ["public"])


class OpenAIRedis(Backend):
    name = "OpenAI Agents RedisSession"

    def __init__(self, folder: Path, url: str) -> None:
        super().__init__(folder)
        self.url = url
        self.run = _name()
        self.sessions: dict[str, Any] = {}

    def session(self, thread: str) -> Any:
        if thread not in self.sessions:
            self.sessions[thread] = RedisSession.from_url(f"{self.run}-{thread}", url=self.url)
        return self.sessions[thread]

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()

    async def prefill(self, thread: str, messages: Sequence[Message]) -> None:
        await self.session(thread).add_items(to_openai(messages))

    def prepare(self, step: Sequence[Message]) -> Any:
        return to_openai(step)

    async def step(self, thread: str, prepared: Any) -> None:
        await self.session(thread).add_items(prepared)

    async def load(self, thread: str) -> int:
        return len(await self.session(thread).get_items())

    def size_bytes(self) -> int:
        return _redis_bytes(self.url)


def _langgraph_redis_status(url: str) -> str:
    if not HAVE_LANGGRAPH_REDIS:
        return "LangGraph AsyncRedisSaver: not installed (bench extra)"

    async def probe() -> str:
        try:
            async with AsyncRedisSaver.from_conn_string(url) as saver:
                await saver.asetup()
        except Exception as exc:
            return f"LangGraph AsyncRedisSaver: cannot run here ({type(exc).__name__}: {exc})"
        return "LangGraph AsyncRedisSaver: runs (a Redis with RediSearch)"

    return anyio.run(probe, backend="asyncio")


# ---------------------------------------------------------------------------------------
# throughput: worker processes


def _open(kind: str, target: str, name: str) -> Any:
    if kind == "sqlite":
        return SqliteStore(target)
    if kind == "postgres":
        return PostgresStore(target, schema=name)
    return RedisStore(target, prefix=name + ":")


async def _worker(kind: str, target: str, name: str, worker: int, seconds: float) -> None:
    """Serve requests on this worker's own threads until ``seconds`` pass; print the count."""
    store = _open(kind, target, name)
    docs = encode_messages(split_steps(build_thread(40)[0])[1])
    threads = [f"w{worker}-t{index}" for index in range(20)]
    await store.open()
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())  # the parent's go: every worker starts together
    await anyio.sleep(max(0.0, start_at - time.time()))
    done = 0
    deadline = start_at + seconds  # one shared window: a late worker does not extend it
    while time.time() < deadline:
        thread = threads[done % len(threads)]
        lease = await store.acquire_lease(thread, f"w{worker}", 30)
        record = await store.load_thread(thread)
        await store.write(thread, ThreadWrite(docs), expected_version=record.version, lease=lease)
        await store.release_lease(lease)
        done += 1
    await store.aclose()
    print(done, flush=True)


def throughput(kind: str, target: str, workers: int, seconds: float) -> float:
    """Requests per second of ``workers`` processes on one database."""
    name = _name()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", kind, target, name, str(w), str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    for proc in procs:  # imports and connections, outside the measured window
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"a {kind} worker failed to start (said {ready!r})")
    start_at = f"{time.time() + 0.2}\n"
    outputs = [proc.communicate(start_at, timeout=120)[0] for proc in procs]
    return sum(int(out.strip().splitlines()[-1]) for out in outputs) / seconds


# ---------------------------------------------------------------------------------------
# the run


async def _per_step(
    backends: list[Backend], history: list[Message], steps: list[list[Message]], quick: bool
) -> dict[str, dict[str, float]]:
    count, rounds = (10, 2) if quick else (20, 3)
    # the others take turns round by round; LangGraph rewrites every message per step, so
    # it runs apart, with few steps
    apart = [b for b in backends if isinstance(b, LangGraphPostgres)]
    turns = [b for b in backends if not isinstance(b, LangGraphPostgres)]
    measured = await measure_backends(turns, history, steps, count, rounds, 3) if turns else {}
    if apart:
        measured.update(await measure_backends(apart, history, steps, 3, 1, 3))
    return {backend.name: measured[backend.name] for backend in backends}


def run(quick: bool = False) -> list[Row]:
    history, source = build_thread(bench_durable.LONG)
    steps = split_steps(build_thread(bench_durable.LONG + 1200)[0][len(history) :])
    rows: list[Row] = []
    with (
        servers("bench_durable_backends") as (pg_url, redis_url),
        tempfile.TemporaryDirectory() as tmp,
    ):
        folder = Path(tmp)
        groups = {
            "postgres": [OursPostgres(folder, pg_url)]
            + ([LangGraphPostgres(folder, pg_url)] if HAVE_LANGGRAPH_PG else []),
            "redis": [OursRedis(folder, redis_url)]
            + ([OpenAIRedis(folder, redis_url)] if HAVE_OPENAI_REDIS else []),
        }
        print(f"history: {len(history)} messages from {source}")
        for group, backends in groups.items():
            results = anyio.run(_per_step, backends, history, steps, quick, backend="asyncio")
            ours = results[backends[0].name]
            peers = {k: v for k, v in results.items() if k != backends[0].name}
            for name, r in results.items():
                print(
                    f"  {name:<30} step@{bench_durable.SHORT} {fmt_seconds(r['step_short']):>10} "
                    f"{bench_durable._fmt_bytes(r['bytes_short']):>9}   step@{len(history)} "
                    f"{fmt_seconds(r['step_long']):>10} "
                    f"{bench_durable._fmt_bytes(r['bytes_long']):>9}   "
                    f"load {int(r['loaded'])} msgs {fmt_seconds(r['load']):>10}"
                )
            for case, key in (
                (f"step @{len(history)} msgs", "step_long"),
                (f"step @{bench_durable.SHORT} msgs", "step_short"),
                (f"load {int(ours['loaded'])} msgs", "load"),
            ):
                peer = min(peers.items(), key=lambda kv: kv[1][key]) if peers else None
                rows.append(
                    Row(
                        f"durable {group}",
                        case,
                        ours[key],
                        baseline=peer[0] if peer else None,
                        baseline_seconds=peer[1][key] if peer else None,
                        extra=dict(ours),
                    )
                )
        print(_langgraph_redis_status(redis_url))
        seconds = 1.5 if quick else 3.0
        for kind, target in (
            ("sqlite", str(folder / "throughput.db")),
            ("postgres", pg_url),
            ("redis", redis_url),
        ):
            one = throughput(kind, target, 1, seconds)
            for workers in (1, 2, 4):
                rate = one if workers == 1 else throughput(kind, target, workers, seconds)
                rows.append(
                    Row(
                        f"throughput {kind}",
                        f"{workers} worker(s): {rate:.0f} requests/s",
                        1 / rate,
                        baseline="1 worker",
                        baseline_seconds=1 / one,
                        extra={"requests_per_second": rate},
                    )
                )
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        kind, target, name, worker, seconds = sys.argv[2:7]
        anyio.run(_worker, kind, target, name, int(worker), float(seconds), backend="trio")
    else:
        print_table(run(quick="--quick" in sys.argv))

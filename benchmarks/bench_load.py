"""Load, many processes and kills: the reliability figures of issue #15, re-measured.

    python benchmarks/bench_load.py [--quick]

1. **Load**: 1000 concurrent sessions (200 with ``--quick``) on trio and on asyncio, the
   full stack (Inherit, ToolResultBudget, BudgetGuard with its default policies,
   ControlOutcomes, SessionMemory) on one SQLite file. Every session tells two facts in
   two runs, and each run's tool writes one value. Counted: errors, lost writes (values
   not read back), facts never extracted into session memory. The baseline is the same
   load on a ``MemoryStore``.
2. **Many processes**: 16 processes write one SQLite file at once (notes and values)
   with the default busy timeout. Counted: errors and lost writes.
3. **Kills**: 20 writer processes are SIGKILLed mid-write. Counted: stores that fail
   SQLite's integrity check or hold a partial note batch (batches are atomic).

4. **Cancellations** (issue #32): 2000 requests (200 with ``--quick``) on each of trio and
   asyncio x SQLite, PostgreSQL and Redis, each cancelled by its deadline at a random point
   (``_cancel_soak.py``). Counted: leases left held (the next request would get
   SessionBusy) and orphan tool calls in the stored threads.
5. **Memory**: the RSS over 5000 durable sessions (1000 with ``--quick``) on one SQLite
   store, beside SQLite's page cache (``_rss_soak.py``): what grows is the page cache
   (and glibc's free chunks, which ``malloc_trim`` gives back); what the process holds
   beyond it stays flat.

The figures are printed; every count must be 0. PostgreSQL and Redis:
``TINYCTX_TEST_POSTGRES_URL`` / ``TINYCTX_TEST_REDIS_URL``, or started (and stopped) here
with ``.ci/services.sh``.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cancel_soak import cancellation_soak, servers
from _harness import Row, print_table
from _rss_soak import rss_soak

from tinyctx import (
    Agent,
    AssistantMessage,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
    SqliteStore,
    ToolCall,
    ToolResult,
    Usage,
    tool,
)
from tinyctx.middleware import (
    BudgetGuard,
    ControlOutcomes,
    Inherit,
    RuleExtractor,
    SessionMemory,
    ToolResultBudget,
    default_policies,
)
from tinyctx.middleware.extractors import ExtractionJob
from tinyctx.stores import Store
from tinyctx.tools import Injected

RUNS_PER_SESSION = 2
BATCH = 10  # notes per atomic batch in the process and kill tests


# ---------------------------------------------------------------------------------------
# 1. load


async def _model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    """Calls ``save`` once per run (the key is the run's user text), then answers."""
    await anyio.sleep(random.random() * 0.002)  # a provider takes a moment
    last = request.messages[-1]
    if isinstance(last, ToolResult):
        return ModelResponse(AssistantMessage("Noted."), usage=Usage(400, 5))
    key = last.text
    call = ToolCall(f"call_{len(request.messages)}", "save", {"key": key})
    return ModelResponse(AssistantMessage("", (call,)), usage=Usage(300, 10))


@tool
async def save(key: str, store: Injected[Store], ctx: Injected[RunContext[Any]]) -> str:
    """Write one value (a write that must never be lost).

    Args:
        key: what to save
    """
    await store.put(f"load:{ctx.thread_id}", key, {"key": key})
    return f"saved {key}"


class SlowRules(RuleExtractor):
    """The offline extractor, taking a moment as a model would: the next run of a session
    often ends while its extraction is still running (the queue's case)."""

    async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
        await anyio.sleep(0.005 + random.random() * 0.03)
        return await super().extract(job, ctx)


def _agent(store: Store) -> Agent:
    memory = SessionMemory(
        SlowRules(), store=store, min_tokens=0, min_tool_calls=0, min_turns=1, name="memory"
    )
    return Agent(
        model=_model,
        tools=[save],
        middleware=[
            Inherit(),
            ToolResultBudget(),
            BudgetGuard(max_tokens=200_000, policies=default_policies()),
            ControlOutcomes(),
            memory,
        ],
    )


async def _load(store: Store, sessions: int) -> dict[str, Any]:
    agent = _agent(store)
    errors: list[str] = []

    async def one(index: int) -> None:
        try:
            async with Session(
                agent, thread_id=f"t{index}", stores={"store": store}, grace_period=60
            ) as session:
                for run in range(RUNS_PER_SESSION):
                    await session.run(f"I prefer option {index}-{run}.")
        except Exception as exc:  # counted, never hidden
            errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for index in range(sessions):
            group.start_soon(one, index)
    seconds = time.perf_counter() - started
    lost = never = 0
    for index in range(sessions):
        notes = {n.text for n in await store.notes(f"session_memory:thread:t{index}")}
        for run in range(RUNS_PER_SESSION):
            key = f"I prefer option {index}-{run}."
            if await store.get(f"load:t{index}", key) != {"key": key}:
                lost += 1
            if f"User preference: {key}" not in notes:
                never += 1
    return {
        "seconds": seconds,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "lost_writes": lost,
        "never_extracted": never,
        "facts": sessions * RUNS_PER_SESSION,
    }


def _load_on(backend: str, sessions: int, sqlite: bool) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        if not sqlite:
            return await _load(MemoryStore(), sessions)
        with tempfile.TemporaryDirectory() as tmp:
            async with SqliteStore(Path(tmp) / "load.db") as store:
                return await _load(store, sessions)

    return anyio.run(main, backend=backend)


# ---------------------------------------------------------------------------------------
# 2. many processes, 3. kills: the writer is this file run with --writer


def _writer(path: str, name: str, batches: int) -> None:
    async def main() -> None:
        async with SqliteStore(path) as store:
            for index in range(batches):
                texts = [f"{name} batch {index} note {k}" for k in range(BATCH)]
                await store.append_notes(f"proc:{name}", texts)
                await store.put(f"proc:{name}", f"k{index}", index)

    anyio.run(main, backend="trio")


def _spawn_writer(path: Path, name: str, batches: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--writer", str(path), name, str(batches)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _processes(count: int, batches: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shared.db"
        started = time.perf_counter()
        procs = [_spawn_writer(path, f"p{i}", batches) for i in range(count)]
        errors = 0
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            if proc.returncode != 0:
                errors += 1
                print(err.decode(errors="replace")[-400:], file=sys.stderr)
        seconds = time.perf_counter() - started

        async def check() -> int:
            lost = 0
            async with SqliteStore(path) as store:
                for i in range(count):
                    notes = await store.notes(f"proc:p{i}")
                    lost += batches * BATCH - len(notes)
                    for index in range(batches):
                        if await store.get(f"proc:p{i}", f"k{index}") != index:
                            lost += 1
            return lost

        lost = anyio.run(check, backend="trio")
    return {"seconds": seconds, "errors": errors, "lost_writes": lost, "processes": count}


def _kills(count: int) -> dict[str, Any]:
    corrupt = partial = 0
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(count):
            path = Path(tmp) / f"killed{attempt}.db"
            proc = _spawn_writer(path, "victim", 10_000)
            # let it get going, then kill it wherever it is (often inside a transaction)
            deadline = time.monotonic() + 10
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05 + random.random() * 0.2)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            conn = sqlite3.connect(path)
            try:
                ok = conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                rows = conn.execute(
                    "SELECT count(*) FROM tinyctx_notes WHERE namespace = 'proc:victim'"
                ).fetchone()[0]
            except sqlite3.DatabaseError:
                ok, rows = False, 0
            finally:
                conn.close()
            corrupt += not ok
            partial += rows % BATCH != 0

            async def reopen(store_path: Path = path) -> int:
                async with SqliteStore(store_path) as store:  # usable again after the kill
                    await store.append_note("after", "still works")
                    return len(await store.notes("after"))

            corrupt += anyio.run(reopen, backend="trio") != 1
    return {"kills": count, "corrupt_stores": corrupt, "partial_batches": partial}


# ---------------------------------------------------------------------------------------


def run(quick: bool = False) -> list[Row]:
    sessions = 200 if quick else 1000
    rows: list[Row] = []
    for backend in ("trio", "asyncio"):
        base = _load_on(backend, sessions, sqlite=False)
        load = _load_on(backend, sessions, sqlite=True)
        clean = load["errors"] == load["lost_writes"] == load["never_extracted"] == 0
        rows.append(
            Row(
                "load",
                f"{sessions} sessions, {backend}, SQLite",
                load["seconds"] / sessions,
                "same on MemoryStore",
                base["seconds"] / sessions,
                target="0 errors, 0 lost, 0 never extracted",
                met=clean and base["errors"] == base["never_extracted"] == 0,
                extra={"sqlite": load, "memory": base},
            )
        )
    procs = _processes(16, 5 if quick else 20)
    rows.append(
        Row(
            "processes",
            "16 processes, one SQLite file",
            procs["seconds"],
            target="0 errors, 0 lost",
            met=procs["errors"] == procs["lost_writes"] == 0,
            extra=procs,
        )
    )
    kills = _kills(5 if quick else 20)
    rows.append(
        Row(
            "kills",
            f"{kills['kills']} SIGKILLs mid-write",
            0.0,
            target="0 corrupt, 0 partial batches",
            met=kills["corrupt_stores"] == kills["partial_batches"] == 0,
            extra=kills,
        )
    )
    rows += _cancellation_rows(200 if quick else 2000)
    rows += _rss_rows(1000 if quick else 5000)
    return rows


def _cancellation_rows(trials: int) -> list[Row]:
    with servers("bench_load") as urls:
        figures = cancellation_soak(trials, urls)
    return [
        Row(
            "cancellations",
            f"{f['cancelled']} deadlines at random points in {f['requests']} requests, "
            f"{f['loop']}, {f['store']}",
            f["seconds"] / f["requests"],
            target="0 leases held, 0 orphan calls, 0 errors",
            met=f["held"] == f["orphan calls"] == f["unpaired threads"] == f["errors"] == 0,
            extra=f,
        )
        for f in figures
    ]


def _rss_rows(sessions: int) -> list[Row]:
    rows = []
    for f in rss_soak(sessions):
        f.pop("samples")
        before = f["config"].endswith("(before)")
        rows.append(
            Row(
                "memory",
                f"RSS {f['rss_mb'][0]} -> {f['rss_mb'][1]} MB over {f['sessions']} sessions, "
                f"page cache {f['page_cache_mb']} MB, {f['config']}, {f['loop']}",
                0.0,
                # flat: what the process holds beyond the page cache does not grow with
                # sessions, and nothing of the file is mapped (the map grew with the file)
                target="the map grows" if before else "held beyond the page cache < 100 B/session",
                met=True
                if before
                else f["held_beyond_page_cache_per_session_b"] < 100 and not f["mapped_file_mb"],
                extra=f,
            )
        )
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--writer":
        _writer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        sys.exit(0)
    import structlog

    # an application configures logging; this one wants only warnings
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    results = run(quick="--quick" in sys.argv)
    print_table(results)
    for row in results:
        print(f"  {row.group} / {row.case}: {row.extra}")

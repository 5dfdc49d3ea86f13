"""How long a store call takes to answer the caller's deadline, and the session's write bound.

Issue #32 asked that every store call answer a cancellation within 0.1 s of the caller's
deadline and that a write to a stalled server end at the write bound (5 s), not when the
server comes back. Measured here on real processes, on trio and asyncio:

- SQLite: a write waiting for another connection's write lock (busy timeout 30 s);
- PostgreSQL and Redis frozen with SIGSTOP (private servers started here with
  ``.ci/services.sh start --no-install``): a read;
- a TCP server that accepts and never answers: opening a PostgresStore / RedisStore;
- (full run only) a Session's run whose write meets a frozen server: the write bound.

Each row is the median time from the call to its return under a ``DEADLINE`` second
``move_on_after``; the baseline is ``anyio.sleep`` under the same deadline (the event
loop's own lateness). The target is the deadline plus 0.1 s for the slowest trial (the
write-bound rows: the bound plus 0.1 s). Without the servers' programs those rows are
skipped and said so.

    python benchmarks/bench_store_deadline.py [--quick]
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, print_table

from tinyctx import Agent, Session, SqliteStore
from tinyctx.backends.postgres import PostgresStore
from tinyctx.backends.redis import RedisStore
from tinyctx.stores import WriteOutcomeUnknown
from tinyctx.testing import ScriptedModel

HERE = Path(__file__).resolve().parent
SERVICES = HERE.parent / ".ci" / "services.sh"
DEADLINE = 0.2
SLACK = 0.1


@contextlib.contextmanager
def private_servers() -> Iterator[dict[str, str] | None]:
    """A PostgreSQL and a Redis of this run's own (so freezing them disturbs nobody)."""
    done = subprocess.run(
        ["bash", str(SERVICES), "start", "--no-install"],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode != 0:
        print(f"no private servers (rows skipped): {done.stderr.strip()[-300:]}")
        yield None
        return
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    try:
        yield found
    finally:
        subprocess.run(
            ["bash", str(SERVICES), "stop", found["TINYCTX_SERVICES_DIR"]],
            capture_output=True,
            timeout=120,
            check=False,
        )


def server_pids(found: dict[str, str], kind: str) -> list[int]:
    directory = Path(found["TINYCTX_SERVICES_DIR"])
    if kind == "redis":
        return [int((directory / "redis" / "redis.pid").read_text().split()[0])]
    postmaster = int((directory / "pg" / "data" / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a backend that just ended
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A loopback server that accepts and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(server.accept()[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


async def timed(call: Callable[[], Awaitable[Any]], deadline: float) -> float:
    started = time.perf_counter()
    with anyio.move_on_after(deadline):
        with contextlib.suppress(Exception):
            await call()
    return time.perf_counter() - started


async def trials(call: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    return [await timed(call, DEADLINE) for _ in range(count)]


def row(group: str, case: str, times: list[float], baseline: float, limit: float) -> Row:
    return Row(
        group,
        case,
        statistics.median(times),
        baseline="anyio.sleep",
        baseline_seconds=baseline,
        target=f"max <= {limit:g} s",
        met=max(times) <= limit,
        extra={"max": max(times), "trials": len(times)},
    )


async def sqlite_rows(count: int, baseline: float, backend: str) -> list[Row]:
    path = Path(tempfile.mkdtemp()) / "locked.db"
    store = SqliteStore(path)
    await store.put("ns", "k", 0)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        times = await trials(lambda: store.put("ns", "k", 1), count)
    finally:
        other.execute("ROLLBACK")
        other.close()
    await store.aclose()
    return [
        row(f"deadline {backend}", "sqlite write, file locked", times, baseline, DEADLINE + SLACK)
    ]


def networked(kind: str, url: str, **options: Any) -> PostgresStore | RedisStore:
    tag = f"bench_{os.getpid()}_{time.monotonic_ns()}"
    if kind == "postgres":
        return PostgresStore(url, schema=tag, **options)
    return RedisStore(url, prefix=tag + ":", **options)


async def frozen_rows(
    found: dict[str, str], count: int, baseline: float, backend: str, quick: bool
) -> list[Row]:
    rows = []
    for kind in ("postgres", "redis"):
        url = found[f"TINYCTX_TEST_{kind.upper()}_URL"]
        store = networked(kind, url, timeout=5)
        await store.put("ns", "k", 1)
        with frozen(server_pids(found, kind)):
            times = await trials(lambda: store.get("ns", "k"), count)
        rows.append(
            row(
                f"deadline {backend}",
                f"{kind} read, server frozen",
                times,
                baseline,
                DEADLINE + SLACK,
            )
        )
        if not quick:
            rows.append(
                await write_bound_row(store, lambda: server_pids(found, kind), kind, backend)
            )
        await store.aclose()
    return rows


async def write_bound_row(
    store: Any, pids: Callable[[], list[int]], kind: str, backend: str
) -> Row:
    stack = contextlib.ExitStack()

    def freeze_then_answer(request: Any, ctx: Any) -> str:
        stack.enter_context(frozen(pids()))  # the processes now (the pool's backends too)
        return "answer"

    agent = Agent(model=ScriptedModel([freeze_then_answer]))
    with stack:
        async with Session(agent, thread_id="bound", store=store, grace_period=0.5) as session:
            started = time.perf_counter()
            with contextlib.suppress(WriteOutcomeUnknown):
                await session.run("hello")
            took = time.perf_counter() - started
            stack.close()
    return Row(
        f"write bound {backend}",
        f"{kind} run, server frozen",
        took,
        baseline="the bound",
        baseline_seconds=5.0,
        target=f"<= {5 + SLACK:g} s",
        met=took <= 5 + SLACK,
    )


async def silent_rows(count: int, baseline: float, backend: str) -> list[Row]:
    rows = []
    for kind, scheme in (("postgres", "postgresql://u@"), ("redis", "redis://")):
        with silent_port() as port:
            store = networked(kind, f"{scheme}127.0.0.1:{port}/0", timeout=2)
            times = await trials(store.open, count)
            await store.aclose()  # once the abandoned connect ends (its own timeout)
        rows.append(
            row(
                f"deadline {backend}",
                f"{kind} open, server silent",
                times,
                baseline,
                DEADLINE + SLACK,
            )
        )
    return rows


async def measure(found: dict[str, str] | None, quick: bool, backend: str) -> list[Row]:
    count = 5 if quick else 20
    baseline = statistics.median(await trials(lambda: anyio.sleep(10), count))
    rows = await sqlite_rows(count, baseline, backend)
    rows += await silent_rows(3 if quick else 5, baseline, backend)
    if found is not None:
        rows += await frozen_rows(found, count, baseline, backend, quick)
    return rows


def run(quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    with private_servers() as found:
        for backend in ("trio", "asyncio"):
            rows += anyio.run(measure, found, quick, backend, backend=backend)
    return rows


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

"""The worker process of the Temporal crash test (not a test module).

``python tests/temporal_worker.py ADDRESS DIR RUNS`` connects to the test's Temporal dev
server, runs a worker for the engine's task queue, prints ``ready``, starts every run's
workflow that was never started (idempotent), waits for all of them and writes
``DIR/done``. The test SIGKILLs it at random points and starts it again; Temporal
retries the activity a dead worker had in flight and replays the workflow elsewhere.

``python tests/temporal_worker.py stall ADDRESS DIR``: runs the thread ``fence`` and,
inside the write activity storing call ``w2``'s result, prints ``stalled TOKEN`` and
stops itself (SIGSTOP) while the workflow holds the thread's lease. Continued (SIGCONT),
the write goes to the store with that lease: a refusal prints ``fenced write TOKEN
CURRENT``. It waits for the workflow's result and prints ``ended ...``.
``python tests/temporal_worker.py takeover ADDRESS DIR``: a second worker of the same
task queue; Temporal retries the stalled write here (the first attempt timed out) and
the workflow goes on here; prints ``result TEXT`` when it ends.

``python tests/temporal_worker.py subagent ADDRESS DIR``: runs the thread ``sub`` on
:func:`~tests.engine_app.delegating_agent`, whose sub-agent kills this worker (SIGKILL)
inside the workflow before its second tool call, the first time (``DIR/killed`` marks
it); run again, this worker replays the workflow and prints ``result TEXT``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.client import Client  # noqa: E402

from tests.engine_app import StopBefore, delegating_agent, work_agent  # noqa: E402
from tests.engine_worker import FENCE_THREAD, StallingStore  # noqa: E402
from tinyctx import SqliteStore  # noqa: E402
from tinyctx.engines.temporal import TemporalEngine  # noqa: E402

TOOL_PAUSE = 0.02


async def main(address: str, directory: Path, runs: int) -> None:
    client = await Client.connect(address)
    store = SqliteStore(directory / "threads.db")
    engine = TemporalEngine(
        work_agent(directory / "effects", pause=TOOL_PAUSE),
        store,
        name="crash",
        task_queue="crash",
        lease_ttl=5.0,
        # a loaded CI machine can stall an activity past a second or two: a timeout that
        # short would fail live attempts (and run their tools twice) without any kill
        activity_timeout=5.0,
        attempts=10,
    )
    worker = engine.worker(
        client,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        graceful_shutdown_timeout=timedelta(seconds=1),
    )
    async with worker:
        print("ready", flush=True)
        ids = [
            await engine.start(client, f"run{n}", "go", request_id="request") for n in range(runs)
        ]
        for workflow_id in ids:
            await engine.result(client, workflow_id)
        (directory / "done").write_text("done")
    await store.aclose()


FENCE_TTL = 3.0
"""The fencing workers' lease, and their activity timeout: the stalled write's attempt
times out after it and Temporal retries it on the other worker."""


async def fence(mode: str, address: str, directory: Path) -> None:
    client = await Client.connect(address)
    store = (StallingStore if mode == "stall" else SqliteStore)(directory / "threads.db")
    engine = TemporalEngine(
        # the takeover's tools take a while: the stalled worker, continued as soon as the
        # takeover holds the thread, writes while the takeover still holds it
        work_agent(directory / "effects", pause=0.3),
        store,
        name="fence",
        task_queue="fence",
        lease_ttl=FENCE_TTL,
        activity_timeout=FENCE_TTL,
        # a retry the frozen worker's open polls receive times out again: room for those
        attempts=10,
    )
    worker = engine.worker(
        client,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        graceful_shutdown_timeout=timedelta(seconds=1),
        # the stalled worker keeps its open activity polls while frozen, and each one takes
        # (and times out) a retry of the write: by default five, which used up the attempts
        max_concurrent_activity_task_polls=1 if mode == "stall" else None,
    )
    async with worker:
        workflow_id = await engine.start(client, FENCE_THREAD, "go", request_id="r")
        result = await engine.result(client, workflow_id)
        print("result" if mode == "takeover" else "ended", result.final_text, flush=True)
    await store.aclose()


async def subagent(address: str, directory: Path) -> None:
    killed = directory / "killed"

    async def die_once() -> None:
        if not killed.exists():
            killed.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)

    client = await Client.connect(address)
    store = SqliteStore(directory / "threads.db")
    agent = delegating_agent(directory / "effects", sub_middleware=(StopBefore(die_once),))
    engine = TemporalEngine(agent, store, name="sub", task_queue="sub", lease_ttl=5.0)
    worker = engine.worker(
        client,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        graceful_shutdown_timeout=timedelta(seconds=1),
    )
    async with worker:
        workflow_id = await engine.start(client, "sub", "go", request_id="r")
        result = await engine.result(client, workflow_id)
        print("result", result.final_text, flush=True)
    await store.aclose()


if __name__ == "__main__":
    if sys.argv[1] == "subagent":
        asyncio.run(subagent(sys.argv[2], Path(sys.argv[3])))
    elif sys.argv[1] in ("stall", "takeover"):
        asyncio.run(fence(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
    else:
        asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))

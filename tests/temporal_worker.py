"""The worker process of the Temporal crash test (not a test module).

``python tests/temporal_worker.py ADDRESS DIR RUNS`` connects to the test's Temporal dev
server, runs a worker for the engine's task queue, prints ``ready``, starts every run's
workflow that was never started (idempotent), waits for all of them and writes
``DIR/done``. The test SIGKILLs it at random points and starts it again; Temporal
retries the activity a dead worker had in flight and replays the workflow elsewhere.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.client import Client  # noqa: E402

from tests.engine_app import work_agent  # noqa: E402
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


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))

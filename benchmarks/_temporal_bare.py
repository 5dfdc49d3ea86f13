"""The bare Temporal workflow ``bench_engines`` compares tinyctx with (not a benchmark):
per turn, a model activity, a thread write, a tool activity and a thread write, the I/O a
tinyctx turn makes, with none of tinyctx's layers, loop or session."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

TIMEOUT = timedelta(seconds=30)
ONCE = RetryPolicy(maximum_attempts=1)


@workflow.defn(name="bench.bare")
class BareWorkflow:
    """Turns of model, write, tool, write activities on one thread."""

    @workflow.run
    async def run(self, thread_id: str, turns: int) -> int:
        version = await self._write(thread_id, ["user: go"], 0)
        for done in range(turns + 1):
            await workflow.execute_activity(
                "bench.model", [done, turns], start_to_close_timeout=TIMEOUT, retry_policy=ONCE
            )
            if done == turns:
                break
            version = await self._write(thread_id, [f"call c{done}"], version)
            await workflow.execute_activity(
                "bench.tool", done, start_to_close_timeout=TIMEOUT, retry_policy=ONCE
            )
            version = await self._write(thread_id, [f"result c{done}"], version)
        return version

    async def _write(self, thread_id: str, docs: list[str], version: int) -> int:
        written: int = await workflow.execute_activity(
            "bench.write",
            {"thread_id": thread_id, "docs": docs, "version": version},
            start_to_close_timeout=TIMEOUT,
            retry_policy=ONCE,
        )
        return written


def bare_activities(write: Any) -> list[Any]:
    """The bare workflow's activities; ``write(thread_id, docs, version)`` is the same
    store write tinyctx makes."""

    @activity.defn(name="bench.model")
    async def model(args: list[int]) -> str:
        done, turns = args
        return f"call c{done}" if done < turns else "done"

    @activity.defn(name="bench.tool")
    async def tool(n: int) -> str:
        return f"worked {n}"

    @activity.defn(name="bench.write")
    async def write_activity(arg: dict[str, Any]) -> int:
        version: int = await write(arg["thread_id"], arg["docs"], arg["version"])
        return version

    return [model, tool, write_activity]

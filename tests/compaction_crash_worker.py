"""The worker of the compaction crash test (not a test module).

``python tests/compaction_crash_worker.py DB SEEN KIND`` runs one thread on the SQLite file
``DB`` through a persistent compaction layer (``KIND``: summarize, microcompact or budget).
At each model call it writes the request's history to ``SEEN`` (atomically, encoded by the
codec), and at the sixth call, after the layer compacted, it SIGKILLs itself: the test then
reads the thread from the file and compares it with what the killed model saw.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from tinyctx import Agent, ModelRequest, ModelResponse, RunConfig, RunContext, Session, SqliteStore
from tinyctx.codec import encode_messages
from tinyctx.middleware import BudgetGuard, ExtractiveSummarizer, Microcompact, Summarize
from tinyctx.testing import FakeTool, call, reply

KILL_AT = 6


def layer(kind: str) -> Any:
    if kind == "summarize":
        return Summarize(ExtractiveSummarizer(), trigger_tokens=200, keep_recent=2)
    if kind == "microcompact":
        return Microcompact(keep_recent=1)
    return BudgetGuard(max_tokens=600, low_water=0.3)


async def main(db: str, seen: Path, kind: str) -> None:
    calls = 0

    async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        nonlocal calls
        calls += 1
        partial = seen.with_suffix(".tmp")
        partial.write_text(json.dumps(list(encode_messages(request.messages))))
        os.replace(partial, seen)
        if calls == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        return reply("", call("read", id=f"r{calls}"))

    agent = Agent(
        model=model,
        tools=[FakeTool("read", returns="line of output " * 30).tool],
        middleware=[layer(kind)],
    )
    store = SqliteStore(db)
    config = RunConfig(thread_id="c", max_model_calls=10)
    async with Session(agent, config=config, store=store) as session:
        await session.run("read a lot")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], Path(sys.argv[2]), sys.argv[3], backend=sys.argv[4])

"""An OpenAI Agents SDK runner on a TinyctxSession, for the two-process lease test (not a
test module).

``python tests/agents_session_worker.py KIND WHERE SCOPE NAME MODE DIR``: one
``Runner.run`` on session ``s`` of the store ``KIND`` (``sqlite``: WHERE is the file;
``postgres``/``redis``: WHERE is the URL and SCOPE the schema or key prefix). Its model
calls the tool ``step`` once, then answers ``NAME done``; ``step`` writes ``DIR/NAME.step``
and waits (at most 240 s) for ``DIR/NAME.go``.

MODE ``hold``: the run goes inside ``async with session`` (the lease held for the whole
run; ``DIR/NAME.leased`` is written once it is held). MODE ``wait``: the same, waiting up
to 240 s for the lease. MODE ``once``: no block, ``wait=0``: a held lease refuses the
run's first write. The last line printed is ``done``, or ``busy OWNER`` for a refused
write (exit status 3).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
from agents import Agent, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from tinyctx.integrations.openai_agents import TinyctxSession
from tinyctx.threads import LeaseHeld

BOUND = 240.0  # seconds any wait of a worker lasts at most (a loaded machine starts slowly)


def _store(kind: str, where: str, scope: str) -> Any:
    if kind == "sqlite":
        from tinyctx.stores import SqliteStore

        return SqliteStore(where)
    if kind == "postgres":
        from tinyctx.backends.postgres import PostgresStore

        return PostgresStore(where, schema=scope)
    from tinyctx.backends.redis import RedisStore

    return RedisStore(where, prefix=scope)


async def main(kind: str, where: str, scope: str, name: str, mode: str, folder: str) -> int:
    directory = Path(folder)

    @function_tool
    async def step() -> str:
        """Do this run's one step."""
        (directory / f"{name}.step").write_text("")
        deadline = time.monotonic() + BOUND
        # the test process makes the file: no Event reaches across processes
        while not (directory / f"{name}.go").exists() and time.monotonic() < deadline:  # noqa: ASYNC110
            await anyio.sleep(0.02)
        return f"{name} stepped"

    model = ScriptedModel(
        [[function_call("step", {}, call_id=f"{name}-call")], [assistant_message(f"{name} done")]]
    )
    agent = Agent(name=name, model=model, tools=[step])
    config = RunConfig(tracing_disabled=True)
    store = _store(kind, where, scope)
    session = TinyctxSession("s", store, wait=BOUND if mode == "wait" else 0, owner=name)
    try:
        if mode == "once":
            await Runner.run(agent, f"{name} asks", session=session, run_config=config)
        else:
            async with session:
                (directory / f"{name}.leased").write_text("")
                await Runner.run(agent, f"{name} asks", session=session, run_config=config)
    except LeaseHeld as busy:
        print("busy", busy.owner, flush=True)
        return 3
    finally:
        await store.aclose()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, *sys.argv[1:7]))

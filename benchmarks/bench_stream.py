"""A streamed run read with ``Session.stream`` against the same run with ``Session.run``.

The model is a scripted stream of N text deltas and a tool call (the fake answers at once),
so what is measured is what reading a run as typed events costs: translating each event,
the memory stream between the run's task and the reader, and the run's task itself.
The run side still emits every delta to the session's event sink, as streaming adapters
do. Reported per run and per delta; the target is a stream costing at most 2× the run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, abest_of, print_table

from tinyctx import Agent, EventSink, Session
from tinyctx.testing import FakeTool, ScriptedModel, call, reply, stream

TOOL = FakeTool("search", returns="found")


def _agent(deltas: int) -> Agent:
    pieces = [f"w{i} " for i in range(deltas)]
    script = [stream(reply("", call("search", id="c1", q="x"))), stream(*pieces)]
    return Agent(ScriptedModel(script, repeat_last=False), tools=[TOOL.tool])


async def _run_once(deltas: int) -> None:
    async with Session(_agent(deltas), events=EventSink(logger=None)) as session:
        await session.run("go")


async def _stream_once(deltas: int) -> None:
    session = Session(_agent(deltas), events=EventSink(logger=None))
    async with session, session.stream("go") as events:
        async for _ in events:
            pass


async def _measure(quick: bool) -> list[Row]:
    number = 50 if quick else 300
    rows: list[Row] = []
    for deltas in (10, 200):
        base = await abest_of(lambda d=deltas: _run_once(d), number=number)
        seconds = await abest_of(lambda d=deltas: _stream_once(d), number=number)
        rows.append(
            Row(
                "stream",
                f"Session.stream, {deltas} deltas + a tool call",
                seconds,
                baseline="Session.run of the same run",
                baseline_seconds=base,
                target="<= 2x",
                met=seconds <= 2 * base,
                extra={"per_delta_seconds": (seconds - base) / deltas},
            )
        )
    return rows


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    for row in rows:
        per = row.extra["per_delta_seconds"]
        print(f"  {row.case}: {per * 1e6:.1f} µs more per delta than run()")

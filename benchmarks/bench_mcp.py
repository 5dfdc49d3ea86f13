"""Per-call cost of an MCP tool through tinyctx next to the SDK's bare ``call_tool``.

Both sides call the ``add`` tool of the same server process (tests/mcp_server.py, the
SDK's own server over stdio) on the same connection, in one event loop:

- **bare**: ``ClientSession.call_tool("add", {...})`` on the SDK session the connection
  opened (``server.client_session``);
- **tinyctx**: the agent's tool onion with :class:`~tinyctx.mcp.MCPTools` in it, as the
  loop runs a call: the registry lookup, the argument check against the server's schema,
  the call (raced against the run's cancellation token), the result as a ToolResult and
  the ``mcp.call`` event.

The sides take turns call by call (who goes first flips each pair), so a slow spell of
the shared machine falls on both alike; the median round of each is compared.
Target: tinyctx <= 1.1 x bare + 20 µs per call. A last row isolates tinyctx's own work:
the same onion with the server's answer replayed instead of sent over the wire.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, abest_of, fmt_seconds, print_table
from mcp import ClientSession

from tinyctx import Agent, EventSink, RunContext, ToolCall
from tinyctx.mcp import MCPServerStdio, MCPTools
from tinyctx.testing import ScriptedModel

SERVER = str(Path(__file__).resolve().parents[1] / "tests" / "mcp_server.py")
ARGUMENTS = {"a": 20, "b": 22}


async def _round(
    session: ClientSession, agent: Agent, ctx: RunContext[Any], number: int, flip: int
) -> tuple[float, float]:
    """Seconds per call of each side over ``number`` pairs of calls; the sides alternate
    call by call (who goes first flips each pair), so load spells fall on both alike."""
    onion, clock = agent.tool_onion, time.perf_counter
    calls = [ToolCall(f"call_{i}", "add", ARGUMENTS) for i in range(number)]
    bare = ours = 0.0
    for index, call in enumerate(calls):
        if (index + flip) % 2:
            t0 = clock()
            await session.call_tool("add", ARGUMENTS)
            t1 = clock()
            await onion(call, ctx)
            t2 = clock()
            bare, ours = bare + (t1 - t0), ours + (t2 - t1)
        else:
            t0 = clock()
            await onion(call, ctx)
            t1 = clock()
            await session.call_tool("add", ARGUMENTS)
            t2 = clock()
            ours, bare = ours + (t1 - t0), bare + (t2 - t1)
    return bare / number, ours / number


async def _measure(quick: bool) -> list[Row]:
    rounds, number = (6, 50) if quick else (20, 200)
    server = MCPServerStdio(sys.executable, [SERVER, "stdio"], name="bench")
    layer = MCPTools(server)
    agent = Agent(ScriptedModel(), middleware=[layer])  # the model is never called
    bare_times: list[float] = []
    ours: list[float] = []
    with anyio.fail_after(600):
        async with server:
            session = server.client_session
            assert session is not None
            ctx = RunContext.new(events=EventSink(logger=None))
            layer.sync(ctx)
            await _round(session, agent, ctx, number, 0)  # warm both sides up, unmeasured
            for index in range(rounds):
                bare_round, our_round = await _round(session, agent, ctx, number, index)
                bare_times.append(bare_round)
                ours.append(our_round)
            answer = await session.call_tool("add", ARGUMENTS)

            async def replay(name: str, arguments: Any, ctx: Any = None) -> Any:
                return answer

            server.call_tool = replay  # type: ignore[method-assign]
            one = ToolCall("c", "add", ARGUMENTS)
            own = await abest_of(lambda: agent.tool_onion(one, ctx), number=number * 10)
    bare = statistics.median(bare_times)
    mine = statistics.median(ours)
    allowed = 1.1 * bare + 20e-6
    return [
        Row("mcp", "bare ClientSession.call_tool", bare, extra={"rounds": bare_times}),
        Row(
            "mcp",
            "MCP tool via tinyctx tool onion",
            mine,
            baseline="bare call_tool",
            baseline_seconds=bare,
            target="<= 1.1x + 20 µs",
            met=mine <= allowed,
            extra={"rounds": ours, "allowed": allowed},
        ),
        Row(
            "mcp",
            "tinyctx's own work (answer replayed)",
            own,
            target="<= 0.1x bare + 20 µs",
            met=own <= 0.1 * bare + 20e-6,
        ),
    ]


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    bare, mine = rows[0].seconds, rows[1].seconds
    verdict = "MET" if rows[1].met else "NOT MET"
    print(
        f"\nper call: tinyctx {fmt_seconds(mine)}, bare {fmt_seconds(bare)}, "
        f"ratio {mine / bare:.3f}x, overhead {(mine - bare) * 1e6:+.1f} µs; "
        f"target <= 1.1x + 20 µs ({fmt_seconds(1.1 * bare + 20e-6)}): {verdict}"
    )

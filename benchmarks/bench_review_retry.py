"""What human review and tool retry cost when they have nothing to do.

* ``Approvals`` on a model response whose calls need no review, next to a no-op layer
  in the same place: target <= 1 µs over it.
* ``ToolRetry`` around a tool call that succeeds the first time, next to the same tool
  onion without it (the floor): target <= 2 µs over it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, abest_of, print_table

from tinyctx import (
    AssistantMessage,
    EventSink,
    Layer,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.chain import compose
from tinyctx.middleware import Approvals, Review, ToolRetry

CALLS = (
    ToolCall("c1", "search", {"q": "weather"}),
    ToolCall("c2", "read_file", {"path": "notes.md"}),
)
WITH_CALLS = ModelResponse(AssistantMessage("", tool_calls=CALLS))
NO_CALLS = ModelResponse(AssistantMessage("done"))
REQUEST = ModelRequest(messages=(UserMessage("hi"),))
CALL = ToolCall("c1", "search", {"q": "weather"})
RESULT = ToolResult.for_call(CALL, "sunny")


class NoopLayer(Layer):
    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await call_next(request, ctx)


def model_core(response: ModelResponse) -> Any:
    async def core(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        return response

    return core


async def tool_core(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    return RESULT


async def _measure(quick: bool) -> list[Row]:
    ctx = RunContext.new(events=EventSink(logger=None))
    number = 20_000 if quick else 100_000
    rows: list[Row] = []
    approvals = Approvals({"deploy": True, "delete_file": Review(allowed=("approve", "reject"))})
    for label, response in (("2 calls, none reviewed", WITH_CALLS), ("no calls", NO_CALLS)):
        core = model_core(response)
        noop = compose([NoopLayer()], core)
        review = compose([approvals], core)
        floor = await abest_of(lambda o=noop: o(REQUEST, ctx), number=number)
        seconds = await abest_of(lambda o=review: o(REQUEST, ctx), number=number)
        over = seconds - floor
        rows.append(
            Row(
                "review",
                f"Approvals, response with {label}",
                seconds,
                baseline="a no-op layer",
                baseline_seconds=floor,
                target="<= 1 µs over the no-op layer",
                met=over <= 1e-6,
                extra={"over_seconds": over},
            )
        )
    bare = compose([], tool_core, hook="tool")
    retried = compose([ToolRetry()], tool_core, hook="tool")
    chosen = compose([ToolRetry(tools=["fetch"])], tool_core, hook="tool")
    floor = await abest_of(lambda: bare(CALL, ctx), number=number)
    for label, onion in (("every tool", retried), ("another tool (skipped)", chosen)):
        seconds = await abest_of(lambda o=onion: o(CALL, ctx), number=number)
        over = seconds - floor
        rows.append(
            Row(
                "tool retry",
                f"ToolRetry ({label}), tool succeeds",
                seconds,
                baseline="the tool onion without it",
                baseline_seconds=floor,
                target="<= 2 µs over the floor",
                met=over <= 2e-6,
                extra={"over_seconds": over},
            )
        )
    return rows


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    for row in rows:
        print(f"  {row.case}: {row.extra['over_seconds'] * 1e9:.0f} ns over its baseline")

"""Cost per call of an onion of 0, 1, 4 and 8 no-op layers, next to hand-nested awaits.

The floor is the same chain written by hand (each level an ``async def`` awaiting the
next); the per-layer overhead is (onion(n) - onion(0)) / n. Target: <= 1 µs per layer.
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
    UserMessage,
)
from tinyctx.chain import compose

RESPONSE = ModelResponse(AssistantMessage("ok"))
REQUEST = ModelRequest(messages=(UserMessage("hi"),))


async def core(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return RESPONSE


async def noop_fn(
    request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
) -> ModelResponse:
    return await call_next(request, ctx)


class NoopLayer(Layer):
    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await call_next(request, ctx)


def hand_nested(depth: int) -> Any:
    """The floor: ``depth`` async functions each awaiting the next, then the core."""
    fn = core
    for _ in range(depth):
        inner = fn

        async def level(
            request: ModelRequest, ctx: RunContext[Any], inner: Any = inner
        ) -> ModelResponse:
            return await inner(request, ctx)

        fn = level
    return fn


async def _measure(quick: bool) -> list[Row]:
    ctx = RunContext.new(events=EventSink(logger=None))
    number = 20_000 if quick else 100_000
    rows: list[Row] = []
    base0 = None
    for depth in (0, 1, 4, 8):
        floor_fn = hand_nested(depth)
        floor = await abest_of(lambda f=floor_fn: f(REQUEST, ctx), number=number)
        for kind, make in (("function", lambda: noop_fn), ("class", NoopLayer)):
            onion = compose(
                [make() for _ in range(depth)] if kind == "class" else [noop_fn] * depth, core
            )
            seconds = await abest_of(lambda o=onion: o(REQUEST, ctx), number=number)
            if depth == 0 and kind == "function":
                base0 = seconds
            per_layer = (seconds - base0) / depth if depth and base0 is not None else None
            rows.append(
                Row(
                    "onion",
                    f"{depth} no-op {kind} layers",
                    seconds,
                    baseline=f"{depth} hand-nested awaits",
                    baseline_seconds=floor,
                    target="<= 1 µs/layer" if per_layer is not None else None,
                    met=per_layer <= 1e-6 if per_layer is not None else None,
                    extra={"per_layer_seconds": per_layer},
                )
            )
    return rows


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    for row in rows:
        per = row.extra.get("per_layer_seconds")
        if per is not None:
            print(f"  {row.case}: {per * 1e9:.0f} ns per layer")

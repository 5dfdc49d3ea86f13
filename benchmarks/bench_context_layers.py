"""Per-call cost of the inheritance, context-view, control, limit, retry and fallback layers.

Each case is one model call through a small onion around a core that answers at once. Each
layer is compared with its floor, measured in the same run, round by round (every floor and
every case once per round; the best round of each counts):

* inheriting layers with a layer that only calls ``ctx.derive()`` (a kernel cost);
* Retry and Fallback (one event per attempt) with a layer that only emits one event;
* the control and limit layers with a no-op layer.

Targets: Inherit without a view <= 1.25x its floor, with a view <= 2x; Retry and Fallback
<= 1.5x theirs; ControlOutcomes and CallLimits add <= 5 µs per call.
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
    RunConfig,
    RunContext,
    UserMessage,
)
from tinyctx.chain import compose
from tinyctx.middleware import CallLimits, ContextPolicy, ControlOutcomes, Fallback, Inherit, Retry
from tinyctx.middleware.context_view import VIEW_GLOBAL_KEY
from tinyctx.middleware.retry import RetryAttempt

RESPONSE = ModelResponse(AssistantMessage("ok"))
REQUEST = ModelRequest(messages=(UserMessage("hi"),), system_prompt="You are helpful.")


async def core(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return RESPONSE


class NoopLayer(Layer):
    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await call_next(request, ctx)


class DeriveOnly(Layer):
    """The floor of an inheriting layer: one ``ctx.derive`` per call."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await call_next(request, ctx.derive(tags=("x",)))


class EmitOnly(Layer):
    """The floor of a layer that reports each attempt: one event per call."""

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        response = await call_next(request, ctx)
        ctx.emit(RetryAttempt())
        return response


def cases() -> list[tuple[str, Layer, str, float | None, float | None]]:
    """(case, layer, floor, max ratio to the floor, max added seconds)."""
    policy = ContextPolicy(exclude=["extra.api_key"])
    return [
        ("Inherit(view=False)", Inherit(tags=("x",), view=False), "derive", 1.25, None),
        ("Inherit() with a view", Inherit(tags=("x",)), "derive", 2.0, None),
        ("Inherit(policy)", Inherit(tags=("x",), view=policy), "derive", 2.0, None),
        ("Retry()", Retry(), "emit", 1.5, None),
        ("Fallback(core)", Fallback(core), "emit", 1.5, None),
        ("ControlOutcomes()", ControlOutcomes(), "noop", None, 5e-6),
        ("CallLimits(model_calls)", CallLimits(model_calls=10**9), "noop", None, 5e-6),
    ]


FLOORS = {
    "noop": ("1 no-op layer", NoopLayer),
    "derive": ("ctx.derive() per call", DeriveOnly),
    "emit": ("one event per call", EmitOnly),
}


async def _measure(quick: bool) -> list[Row]:
    config = RunConfig(
        configurable={
            VIEW_GLOBAL_KEY: {
                "project_root": "/repo",
                "work_dir": "/repo/pkg",
                "task_metadata": {"ticket": "T-1"},
                "api_key": "secret",
                "region": "eu",
            }
        }
    )
    ctx = RunContext.new(config, events=EventSink(logger=None))
    number, rounds = (2_000, 3) if quick else (6_000, 5)
    onions = {key: compose([make()], core) for key, (_, make) in FLOORS.items()}
    onions |= {name: compose([layer], core) for name, layer, *_ in cases()}
    # round by round, each floor and each case once: a machine's slow spell hits them alike
    best = dict.fromkeys(onions, float("inf"))
    for _ in range(rounds):
        for key, onion in onions.items():
            seconds = await abest_of(lambda o=onion: o(REQUEST, ctx), number=number, repeat=1)
            best[key] = min(best[key], seconds)
    floors = {key: best[key] for key in FLOORS}
    rows: list[Row] = []
    for name, _layer, floor, max_ratio, max_added in cases():
        seconds = best[name]
        base = floors[floor]
        if max_ratio is not None:
            target, met = f"<= {max_ratio}x floor", seconds <= max_ratio * base
        else:
            assert max_added is not None
            target = f"<= +{max_added * 1e6:.0f} µs"
            met = seconds - base <= max_added
        rows.append(
            Row(
                "context layers",
                name,
                seconds,
                baseline=FLOORS[floor][0],
                baseline_seconds=base,
                target=target,
                met=met,
                extra={"added_seconds": seconds - base},
            )
        )
    return rows


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    for row in rows:
        print(f"  {row.case}: +{row.extra['added_seconds'] * 1e6:.1f} µs over its floor")

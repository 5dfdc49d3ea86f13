"""What the OpenTelemetry exporter adds to a run, per model call.

A run of five model calls (four answer with a tool call, the last with text) through a real
``Session``, with the event sink bare (the baseline) and with :class:`tinyctx.otel.OtelExporter`
subscribed. Each model call's share is its chat span, its tool span and a fifth of the run
span and of the run's events.

- ``no-op tracer``: the OpenTelemetry API without an SDK: what the exporter itself adds
  (turning events into span calls);
- ``sdk, spans dropped``: an SDK ``TracerProvider`` without processors: the SDK builds and
  ends every span (ids, attributes, locks) and drops it;
- ``sdk, in-memory export``: each span also goes through a ``SimpleSpanProcessor`` to an
  ``InMemorySpanExporter`` (what the tests see; a real exporter batches in the background).

``events of one model call`` hands the exporter the events a model call produces (its
``model.call`` and the ``tool.call`` of its tool) in a tight loop, under an open run span:
the exporter's added time per model call without the noise of a whole run (the target,
<= 3 µs with the no-op tracer). Its model call carries what a provider adapter reports
(provider, requested and answered model, response id, finish reason, temperature, output
limit, server, cached and reasoning tokens), in a thread. ``sdk span alone`` times one
SDK span start/end with four attributes outside tinyctx, so the SDK's own share of the
other rows can be read off. Every row counts CPU time (best of 5 rounds): on a shared
machine the wall clock also counts the time the process waited for a core. Without the
``otel`` extra the benchmark prints nothing.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, print_table

from tinyctx import Agent, EventSink, RunContext, Session, Tool
from tinyctx.testing import ScriptedModel, call, reply

CALLS = 5
TARGET_SECONDS = 3e-6


async def _echo(arguments: Any, ctx: RunContext[Any]) -> str:
    return "ok"


TOOL = Tool("search", "Search.", handler=_echo)


def _script() -> list[Any]:
    return [
        reply("", call("search", id=f"c{i}", q="x"), usage=(100, 5)) for i in range(CALLS - 1)
    ] + [reply("done", usage=(120, 3))]


async def _measure(subscribers: list[Any], number: int) -> float:
    script = _script()

    async def one_run() -> None:
        agent = Agent(model=ScriptedModel(script), tools=[TOOL])
        async with Session(agent, events=EventSink(logger=None, subscribers=subscribers)) as s:
            await s.run("go")

    best = float("inf")
    for _ in range(5):
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            for _ in range(number):
                await one_run()
            best = min(best, (time.process_time() - start) / number)
        finally:
            gc.enable()
    return best


def cpu_best_of(fn: Any, *, number: int, repeat: int = 5) -> float:
    """CPU seconds per call of ``fn``: best of ``repeat`` rounds of ``number`` calls."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            for _ in range(number):
                fn()
            best = min(best, (time.process_time() - start) / number)
        finally:
            gc.enable()
    return best


def _sdk_span_seconds(number: int) -> float:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("bench")
    parent = trace.set_span_in_context(tracer.start_span("run"))
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 5,
    }

    def one() -> None:
        span = tracer.start_span("chat m", context=parent, attributes=attributes, start_time=1)
        span.end(end_time=2)

    return cpu_best_of(one, number=number)


def _per_call_rows(number: int) -> list[Row]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import NoOpTracerProvider

    from tinyctx.events import ModelCallFinished, RunStarted, ToolCallFinished
    from tinyctx.otel import OtelExporter

    ids = {"run_id": "r1", "root_run_id": "r1", "thread_id": "t1"}
    chat = ModelCallFinished(
        model="m-2025-01-01",
        request_model="m",
        provider="openai",
        messages=3,
        input_tokens=100,
        output_tokens=5,
        cached_tokens=64,
        reasoning_tokens=2,
        response_id="resp_1",
        finish_reasons=("stop",),
        temperature=0.2,
        max_tokens=512,
        server_address="api.example.com",
        server_port=443,
        tool_calls=1,
        seconds=0.01,
        **ids,
    )
    tool = ToolCallFinished(tool="search", tool_call_id="c1", seconds=0.001, **ids)

    def nothing(event: object) -> None:
        pass

    def baseline() -> None:
        nothing(chat)
        nothing(tool)

    base = cpu_best_of(baseline, number=number)
    rows = []
    for case, provider in (("no-op tracer", NoOpTracerProvider()), ("sdk", TracerProvider())):
        exporter = OtelExporter(tracer_provider=provider)
        exporter(RunStarted(agent="bench", **ids))

        def one_call(exporter: OtelExporter = exporter) -> None:
            exporter(chat)
            exporter(tool)

        seconds = cpu_best_of(one_call, number=number)
        is_target = case == "no-op tracer"
        rows.append(
            Row(
                "otel exporter",
                f"events of one model call, {case}",
                seconds,
                baseline="an empty subscriber",
                baseline_seconds=base,
                target="<= 3 µs per model call" if is_target else None,
                met=seconds - base <= TARGET_SECONDS if is_target else None,
                extra={"added_per_model_call_seconds": seconds - base},
            )
        )
    return rows


def run(quick: bool = False) -> list[Row]:
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.trace import NoOpTracerProvider

        from tinyctx.otel import OtelExporter
    except ModuleNotFoundError:
        return []
    number = 40 if quick else 300

    async def main() -> list[Row]:
        bare = await _measure([], number)
        cases = [
            ("no-op tracer", OtelExporter(tracer_provider=NoOpTracerProvider())),
            ("sdk, spans dropped", OtelExporter(tracer_provider=TracerProvider())),
        ]
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        cases.append(("sdk, in-memory export", OtelExporter(tracer_provider=provider)))
        rows = []
        for case, exporter in cases:
            seconds = await _measure([exporter], number)
            memory.clear()
            per_call = (seconds - bare) / CALLS
            rows.append(
                Row(
                    "otel exporter",
                    f"run of {CALLS} calls, {case}",
                    seconds,
                    baseline="no exporter",
                    baseline_seconds=bare,
                    target=f"+{per_call * 1e6:.1f} µs/model call",
                    extra={"added_per_model_call_seconds": per_call},
                )
            )
        rows += _per_call_rows(number * 20)
        span = _sdk_span_seconds(number * 10)
        rows.append(Row("otel exporter", "sdk span alone (start + end)", span))
        return rows

    return anyio.run(main, backend="trio")


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

"""What a durable thread costs a Session step, next to the same step without a store.

A step is one ``session.run`` on a real history (the bundled transcript, repeated with
fresh call ids): the user message and the model's answer are written (changes tracked by
the conversation, encoded, one atomic write under the lease, layer state when it changed).
Measured in the same run:

- without a store (the baseline: sessions without ``store=`` are unchanged);
- with ``MemoryStore`` and ``SqliteStore``, at 100 and at 2000 messages of history: what
  the store adds to a step must not grow with the history (printed for both lengths);
- loading a 2000-message thread into a Session (enter + load + decode).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, abest_of, best_of, print_table, sqlite_read_floor

from tinyctx import (
    Agent,
    AssistantMessage,
    EventSink,
    MemoryStore,
    Message,
    ModelRequest,
    ModelResponse,
    RunConfig,
    RunContext,
    Session,
    SqliteStore,
    ToolCall,
    ToolResult,
)
from tinyctx.cli import bundled_transcript
from tinyctx.codec import encode_messages
from tinyctx.formats import load_transcript
from tinyctx.middleware import BudgetGuard, CallLimits
from tinyctx.threads import ThreadWrite

ANSWER = ModelResponse(AssistantMessage("ok"))


async def instant_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return ANSWER


def history(length: int) -> tuple[Message, ...]:
    """``length`` messages of the real transcript, repeated with fresh call ids."""
    source = load_transcript(bundled_transcript())
    out: list[Message] = []
    round_ = 0
    while len(out) < length:
        for message in source:
            if isinstance(message, AssistantMessage) and message.tool_calls:
                calls = tuple(
                    ToolCall(f"{c.id}-{round_}", c.name, c.arguments) for c in message.tool_calls
                )
                message = message.evolve(tool_calls=calls)
            elif isinstance(message, ToolResult):
                message = message.evolve(tool_call_id=f"{message.tool_call_id}-{round_}")
            out.append(message)
        round_ += 1
    cut = length
    while cut > 0 and isinstance(out[cut - 1], AssistantMessage) and out[cut - 1].tool_calls:
        cut -= 1
    while cut < len(out) and isinstance(out[cut], ToolResult):
        cut += 1
    return tuple(out[:cut])


def agent() -> Agent:
    return Agent(
        model=instant_model,
        middleware=[CallLimits(model_calls=1000, scope="thread"), BudgetGuard()],
    )


CONFIG = RunConfig(max_model_calls=None, max_tokens=10_000_000)


async def step_cost(store: Any, thread: str, messages: tuple[Message, ...], number: int) -> float:
    if store is not None:
        await store.write(thread, ThreadWrite(append=encode_messages(messages)), expected_version=0)
    options: dict[str, Any] = {"store": store} if store is not None else {}
    async with Session(
        agent(), config=CONFIG.evolve(thread_id=thread), events=EventSink(logger=None), **options
    ) as session:
        if store is None:
            session.ctx.conversation.replace(messages, emit_new=False)

        async def step() -> None:
            await session.run("what next?")

        return await abest_of(step, number=number, repeat=3)


async def load_cost(store: Any, thread: str, number: int) -> float:
    async def load() -> None:
        async with Session(agent(), config=CONFIG.evolve(thread_id=thread), store=store):
            pass

    return await abest_of(load, number=number, repeat=3)


async def _measure(quick: bool) -> list[Row]:
    n = 50 if quick else 300
    short, long = history(100), history(2000)
    rows: list[Row] = []
    base = await step_cost(None, "none", short, n)
    rows.append(Row("durable step", f"no store, {len(short)} messages", base))
    memory = await step_cost(MemoryStore(), "m", short, n)
    rows.append(
        Row(
            "durable step",
            f"MemoryStore, {len(short)} messages",
            memory,
            baseline="no store",
            baseline_seconds=base,
        )
    )
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteStore(Path(folder) / "bench.db")
        try:
            sqlite_short = await step_cost(store, "s100", short, n)
            rows.append(
                Row(
                    "durable step",
                    f"SqliteStore, {len(short)} messages",
                    sqlite_short,
                    baseline="no store",
                    baseline_seconds=base,
                )
            )
            base_long = await step_cost(None, "none-long", long, n)
            rows.append(Row("durable step", f"no store, {len(long)} messages", base_long))
            sqlite_long = await step_cost(store, "s2000", long, n)
            rows.append(
                Row(
                    "durable step",
                    f"SqliteStore, {len(long)} messages",
                    sqlite_long,
                    baseline=f"no store, {len(long)} messages",
                    baseline_seconds=base_long,
                    target="store overhead at 2000 <= 1.15x at 100",
                    met=sqlite_long - base_long <= 1.15 * max(sqlite_short - base, 0.0),
                    extra={
                        "overhead_short_seconds": sqlite_short - base,
                        "overhead_long_seconds": sqlite_long - base_long,
                    },
                )
            )
            print(
                f"store overhead per step: {(sqlite_short - base) * 1e6:.0f} µs at "
                f"{len(short)} messages, {(sqlite_long - base_long) * 1e6:.0f} µs at {len(long)}"
            )
            load = await load_cost(store, "s2000", 5 if quick else 20)
            query = "SELECT doc FROM tinyctx_messages WHERE thread_id = ? ORDER BY pos"
            with sqlite_read_floor(Path(folder) / "bench.db", query, ("s2000",), 0) as raw:
                raw_load = best_of(raw, number=5 if quick else 20, repeat=3)
            rows.append(
                Row(
                    "durable load",
                    f"Session enter, {len(long)}+ messages",
                    load,
                    "raw SELECT + orjson, same rows",
                    raw_load,
                )
            )
        finally:
            await store.aclose()
    return rows


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

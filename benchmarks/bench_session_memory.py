"""Session memory: what the layer adds to a model call, and SQLite note throughput.

- per model call: ``SessionMemory.wrap_model`` (count usage; with and without an injected
  section) next to a no-op layer, through the same composed onion;
- per tool call: ``SessionMemory.wrap_tool`` next to a no-op tool layer;
- notes: ``SqliteStore.append_note`` (one transaction, off the event loop) and a batch of
  10 via ``append_notes``, next to ``MemoryStore.append_note``.
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
    AssistantMessage,
    EventSink,
    Layer,
    MemoryStore,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    SqliteStore,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.chain import ToolCallHandler, compose
from tinyctx.middleware import SessionMemory

RESPONSE = ModelResponse(AssistantMessage("ok"), usage=Usage(1200, 40))
REQUEST = ModelRequest(messages=(UserMessage("hi"),), system_prompt="You are helpful.")
CALL = ToolCall("c1", "search", {"q": "x"})
RESULT = ToolResult.for_call(CALL, "found")


async def model_core(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return RESPONSE


async def tool_core(call: ToolCall, ctx: RunContext[Any]) -> ToolResult:
    return RESULT


class Noop(Layer):
    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        return await call_next(request, ctx)

    async def wrap_tool(
        self, call: ToolCall, ctx: RunContext[Any], call_next: ToolCallHandler
    ) -> ToolResult:
        return await call_next(call, ctx)


async def _layer_rows(quick: bool) -> list[Row]:
    number = 20_000 if quick else 100_000
    ctx = RunContext.new(events=EventSink(logger=None))
    rows: list[Row] = []
    noop_model = compose([Noop()], model_core)
    floor = await abest_of(lambda: noop_model(REQUEST, ctx), number=number)
    bare = SessionMemory(store=MemoryStore(), inject=False)
    store = MemoryStore()
    facts = [f"remembered fact number {i}" for i in range(20)]
    await store.append_notes(f"session_memory:thread:{ctx.thread_id}", facts)
    injecting = SessionMemory(store=store, name="injecting")
    await injecting.on_run_start(ctx)  # loads the notes: every call now carries the section
    assert injecting.section(ctx) is not None
    for label, layer in (("count only", bare), ("count + inject 20 notes", injecting)):
        onion = compose([layer], model_core)
        seconds = await abest_of(lambda o=onion: o(REQUEST, ctx), number=number)
        rows.append(Row("session memory", f"model call: {label}", seconds, "no-op layer", floor))
    noop_tool = compose([Noop()], tool_core, hook="tool")
    tool_floor = await abest_of(lambda: noop_tool(CALL, ctx), number=number)
    tool_onion = compose([bare], tool_core, hook="tool")
    seconds = await abest_of(lambda: tool_onion(CALL, ctx), number=number)
    rows.append(Row("session memory", "tool call: count", seconds, "no-op layer", tool_floor))
    return rows


async def _store_rows(quick: bool) -> list[Row]:
    number = 200 if quick else 1000
    memory = MemoryStore()
    floor = await abest_of(lambda: memory.append_note("ns", "a note"), number=number)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as folder:
        async with SqliteStore(Path(folder) / "bench.db") as store:
            one = await abest_of(lambda: store.append_note("ns", "a note"), number=number)
            rows.append(Row("notes", "SqliteStore.append_note", one, "MemoryStore", floor))
            texts = [f"note {i}" for i in range(10)]
            batch = await abest_of(
                lambda: store.append_notes("ns", texts), number=max(number // 10, 20)
            )
            rows.append(
                Row("notes", "SqliteStore.append_notes x10", batch, "MemoryStore x1", floor)
            )
            read = await abest_of(lambda: store.notes("ns", limit=200), number=number // 4)
            query = (
                "SELECT seq, text, created_at, metadata FROM tinyctx_notes "
                "WHERE namespace = ? ORDER BY seq DESC LIMIT ?"
            )
            with sqlite_read_floor(Path(folder) / "bench.db", query, ("ns", 200), 3) as raw:
                raw_read = best_of(raw, number=number // 4)
            rows.append(
                Row(
                    "notes",
                    "SqliteStore.notes(limit=200)",
                    read,
                    "raw SELECT + orjson, same rows",
                    raw_read,
                )
            )
    return rows


async def _measure(quick: bool) -> list[Row]:
    return [*(await _layer_rows(quick)), *(await _store_rows(quick))]


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

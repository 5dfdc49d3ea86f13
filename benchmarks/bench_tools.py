"""Cost of calling a ``@tool`` (validate, convert, inject, call) next to a raw ``Tool``.

The baseline is a hand-written ``Tool`` handler that reads the same arguments from the
dict without checking them. The difference is what validation and injection cost per call.
Target: <= 5 µs over the raw handler for a tool of three scalar parameters.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import anyio
import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, abest_of, best_of, print_table

from tinyctx import EventSink, MemoryStore, RunContext, Tool, tool
from tinyctx.stores import Store
from tinyctx.tools import Injected


@attrs.frozen
class Filter:
    tags: list[str]
    limit: int = 10
    mode: Literal["any", "all"] = "any"


async def raw(arguments: Mapping[str, Any], ctx: RunContext[Any]) -> str:
    return f"{arguments['q']}{arguments.get('limit', 5)}{arguments.get('ratio', 0.5)}"


async def search(q: str, limit: int = 5, ratio: float = 0.5) -> str:
    """Search."""
    return f"{q}{limit}{ratio}"


async def search_injected(
    q: str,
    ctx: Injected[RunContext[Any]],
    notes: Injected[Store],
    limit: int = 5,
    ratio: float = 0.5,
) -> str:
    return f"{q}{limit}{ratio}"


async def search_nested(q: str, filters: Filter, extra: dict[str, list[int]]) -> str:
    return q


def search_sync(q: str, limit: int = 5, ratio: float = 0.5) -> str:
    return f"{q}{limit}{ratio}"


ARGS = {"q": "tinyctx", "limit": 3, "ratio": 1}
NESTED = {
    "q": "x",
    "filters": {"tags": ["a", "b", "c"], "limit": 3, "mode": "all"},
    "extra": {"k": [1, 2, 3]},
}


async def _measure(quick: bool) -> list[Row]:
    ctx = RunContext.new(events=EventSink(logger=None), stores={"notes": MemoryStore()})
    number = 5_000 if quick else 50_000
    baseline_tool = Tool("search", handler=raw)
    base = await abest_of(lambda: baseline_tool.invoke(ARGS, ctx), number=number)
    rows = [Row("tools", "raw Tool handler", base)]
    cases = [
        ("@tool 3 scalar params", tool(search), ARGS),
        ("@tool + 2 injected params", tool(search_injected), ARGS),
        ("@tool nested attrs + dict args", tool(search_nested), NESTED),
        ("@tool sync, in_thread=False", tool(in_thread=False)(search_sync), ARGS),
    ]
    for case, built, arguments in cases:
        seconds = await abest_of(lambda t=built, a=arguments: t.invoke(a, ctx), number=number)
        target = "<= 5 µs over raw" if case == "@tool 3 scalar params" else None
        rows.append(
            Row(
                "tools",
                case,
                seconds,
                baseline="raw Tool handler",
                baseline_seconds=base,
                target=target,
                met=(seconds - base) <= 5e-6 if target else None,
            )
        )
    threaded = tool(search_sync)
    seconds = await abest_of(lambda: threaded.invoke(ARGS, ctx), number=number // 10)
    rows.append(Row("tools", "@tool sync, worker thread", seconds, "raw Tool handler", base))
    define = best_of(lambda: tool(search_nested), number=number // 50)
    rows.append(Row("tools", "define @tool (nested types, once)", define))
    return rows


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

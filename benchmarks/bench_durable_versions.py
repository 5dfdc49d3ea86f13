"""Time travel on a long thread: loading as of an old version against loading it now.

A 20,000-message thread is written to SQLite (and the in-memory store) the way a session
writes it: 2,000 steps of 10 messages, with a compaction every 100 steps that clears old
tool results (one range replaced by as many placeholders, the originals archived). Then
``load_thread`` + decode (what a session does on entering) is timed beside
``tinyctx.versions.load_as_of`` + decode at an old version (half way, with 1,000 later
writes to undo) and at version 1. Target: as of an old version costs at most 1.5 times
the current load (issue 37).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, print_table

from tinyctx import MemoryStore, SqliteStore, UserMessage, codec
from tinyctx.codec import decode_messages
from tinyctx.threads import Compaction, ThreadWrite
from tinyctx.versions import load_as_of

TARGET = 1.5


def _step(index: int) -> tuple[str, ...]:
    return codec.encode_messages(
        UserMessage(f"step {index} message {k}: " + "some tool output text " * 8) for k in range(10)
    )


async def _fill(store: Any, thread: str, steps: int) -> int:
    placeholder = codec.encode_messages([UserMessage("[Old tool result content cleared]")])[0]
    version = 0
    for index in range(steps):
        compaction = None
        if index and index % 100 == 0:
            start = (index - 100) * 10
            compaction = Compaction(start, start + 50, (placeholder,) * 50)
        version = await store.write(
            thread, ThreadWrite(_step(index), compaction), expected_version=version
        )
    return version


async def _best(fn: Callable[[], Awaitable[Any]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        await fn()
        best = min(best, time.perf_counter() - started)
    return best


async def _measure(quick: bool) -> list[Row]:
    steps = 200 if quick else 2_000
    repeat = 3 if quick else 7
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as folder:
        for name, store in (
            ("sqlite", SqliteStore(Path(folder) / "v.db")),
            ("memory", MemoryStore()),
        ):
            current = await _fill(store, "long", steps)

            async def now(store: Any = store) -> None:
                decode_messages((await store.load_thread("long")).messages)

            base = await _best(now, repeat)
            rows.append(Row("time travel", f"{name}: load now ({steps * 10} msgs)", base))
            for label, version in (("half way", current // 2), ("version 1", 1)):

                async def old(store: Any = store, version: int = version) -> None:
                    decode_messages((await load_as_of(store, "long", version)).messages)

                seconds = await _best(old, repeat)
                ratio = seconds / base
                rows.append(
                    Row(
                        "time travel",
                        f"{name}: as of {label}",
                        seconds,
                        baseline="load now",
                        baseline_seconds=base,
                        target=f"<= {TARGET}x",
                        met=ratio <= TARGET,
                    )
                )
            await store.aclose()
    return rows


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="asyncio")


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

"""Memory: RSS over many sessions that share the default token counter.

Each session runs one model call through a ``BudgetGuard`` (which counts the history with
the shared ``default_counter()``) on its own ~0.5 MB history, then ends. A shared memo
that kept finished sessions' histories alive shows as RSS that climbs with the number of
sessions; the baseline is the same loop clearing the counter after every session (the old
workaround). The row's time is per session; ``extra`` has the RSS at checkpoints and how
many finished sessions' histories are still alive (exact, by weak references).
"""

from __future__ import annotations

import gc
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Row, print_table

from tinyctx import (
    Agent,
    AssistantMessage,
    Message,
    ModelRequest,
    ModelResponse,
    RunContext,
    Session,
    UserMessage,
)
from tinyctx.middleware import BudgetGuard
from tinyctx.tokens import default_counter

OK = ModelResponse(AssistantMessage("ok"))


async def model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    """A model that remembers nothing (a scripted fake records every request)."""
    return OK


HISTORY_MESSAGES = 20
MESSAGE_BYTES = 25_000  # 20 x 25 KB = 0.5 MB of text per session


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * 4096 / 2**20


def _history(session: int) -> list[Message]:
    out: list[Message] = []
    for index in range(HISTORY_MESSAGES // 2):
        body = f"session {session} message {index} " + "x" * MESSAGE_BYTES
        out += [UserMessage(body), AssistantMessage(body)]
    return out


async def _sessions(count: int, *, clear: bool) -> tuple[float, dict[str, Any]]:
    agent = Agent(
        model=model,
        middleware=[BudgetGuard(max_tokens=2_000_000)],
    )
    alive: list[weakref.ref[Message]] = []
    checkpoints = {count // 4, count // 2, count}
    rss: dict[str, float] = {}
    gc.collect()
    start_rss = _rss_mb()
    started = time.perf_counter()
    for index in range(1, count + 1):
        history = _history(index)
        alive.append(weakref.ref(history[0]))
        async with Session(agent) as session:
            await session.run(history)
        del history, session
        if clear:
            default_counter().clear()
        if index in checkpoints:
            gc.collect()
            rss[f"rss_after_{index}_mb"] = round(_rss_mb() - start_rss, 1)
    seconds = (time.perf_counter() - started) / count
    gc.collect()
    retained = sum(1 for ref in alive[:-1] if ref() is not None)
    return seconds, {**rss, "finished_histories_alive": retained}


async def _measure(quick: bool) -> list[Row]:
    count = 200 if quick else 2000
    base_seconds, base_extra = await _sessions(count, clear=True)
    seconds, extra = await _sessions(count, clear=False)
    growth = extra[f"rss_after_{count}_mb"] - extra[f"rss_after_{count // 4}_mb"]
    extra["rss_growth_last_three_quarters_mb"] = round(growth, 1)
    extra["baseline"] = base_extra
    return [
        Row(
            "memory",
            f"{count} sessions, 0.5 MB each",
            seconds,
            "counter cleared each session",
            base_seconds,
            target="<= 1 finished history alive, RSS flat (< 16 MB growth)",
            met=extra["finished_histories_alive"] <= 1 and growth < 16,
            extra=extra,
        )
    ]


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    import structlog

    # an application configures logging; this one wants only warnings
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    for row in rows:
        print(f"  RSS and retained histories: {row.extra}")

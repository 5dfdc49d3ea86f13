"""What a durable thread costs a whole Session step, at 100, 2,000 and 20,000 messages.

A step is one ``session.run`` on a real history (the bundled transcript, repeated with
fresh call ids) with the layers a durable agent runs (a thread-scoped call limit and the
budget guard): the user message and the model's answer are appended and written (the
conversation's changes encoded, atomic writes under the lease, the layers' state when it
changed). Measured round by round in the same run, each configuration taking its turn
(the order flips every round), at each length:

- without a store (sessions without ``store=`` are unchanged);
- with ``SqliteStore`` at ``synchronous=NORMAL`` (its default) and at ``FULL`` (the
  peers' default, an fsync per commit): both shown, equal durability in each comparison;
- the floor: the same writes the steps made (recorded from the store over as many
  consecutive steps as a round runs, replayed in order), as raw ``sqlite3`` INSERT +
  UPDATE + COMMIT of the same bytes on a table of the same length, at the same sync mode,
  on the event loop (no thread hop, no codec, no checks). Replaying one recorded step
  over and over would rewrite the same layer state every time, and SQLite skips writing
  a page an UPDATE leaves byte for byte as it was: the floor would then not write the
  state the real steps change (a third fewer WAL pages per step).

Targets: a step at 20,000 messages within 1.15x of the same step at 2,000 (flat in the
thread's length), and what the store adds to a step (the step with it minus without it)
within 1.5x of the raw writes' floor. ``--cpu`` times the process's CPU (both threads)
instead of the wall clock: steadier on a shared machine, but blind to waits (an fsync
at ``FULL``, a thread hop). Then loading a 2000-message thread into a Session
(enter + load + decode) beside a raw SELECT + orjson of the same rows.
"""

from __future__ import annotations

import contextlib
import gc
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    FullSqliteStore,
    Row,
    abest_of,
    best_of,
    fmt_seconds,
    print_table,
    sqlite_read_floor,
)

from tinyctx import (
    Agent,
    AssistantMessage,
    EventSink,
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
from tinyctx.threads import ThreadWrite, Unchanged
from tinyctx.tokens import HeuristicCounter

ANSWER = ModelResponse(AssistantMessage("ok"))
SIZES = (100, 2000, 20_000)
FLAT = 1.15
FLOOR = 1.5


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
    """The durable agent; its own token counter (a real server's sessions share the
    default one): the rows time one thread's step, not the shared memo handing over
    between the threads this benchmark interleaves (issue #39's cold paths)."""
    return Agent(
        model=instant_model,
        middleware=[
            CallLimits(model_calls=1_000_000, scope="thread"),
            BudgetGuard(counter=HeuristicCounter()),
        ],
    )


CONFIG = RunConfig(max_model_calls=None, max_tokens=10_000_000)


class _Recording:
    """Keeps the writes a store made while ``on`` (what the floor writes again)."""

    def __init__(self) -> None:
        self.on = False
        self.writes: list[ThreadWrite] = []


class RecordingStore(SqliteStore):
    """``SqliteStore`` at its default ``NORMAL``, remembering the writes of a step."""

    recording: _Recording

    async def write(self, thread_id: str, change: ThreadWrite, **options: Any) -> int:
        if self.recording.on:
            self.recording.writes.append(change)
        return await super().write(thread_id, change, **options)


class RecordingFullStore(FullSqliteStore, RecordingStore):
    """The same at the peers' ``synchronous=FULL``."""


class RawFloor:
    """The bare writes: each recorded write as INSERT of its documents, UPDATE of the
    state (when the write had one), COMMIT; same file layout, same sync mode."""

    def __init__(self, path: Path, synchronous: str, prefill: list[str]) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.execute(
            "CREATE TABLE m (thread_id TEXT NOT NULL, pos INTEGER NOT NULL, doc TEXT NOT NULL, "
            "PRIMARY KEY (thread_id, pos)) WITHOUT ROWID"
        )
        self.conn.execute("CREATE TABLE t (thread_id TEXT PRIMARY KEY, version INT, state TEXT)")
        self.conn.execute("INSERT INTO t VALUES ('t', 0, NULL)")
        self.pos = 0
        self.conn.execute("BEGIN")
        self._insert(prefill)
        self.conn.execute("COMMIT")

    def _insert(self, docs: list[str]) -> None:
        first = self.pos
        self.pos += len(docs)
        self.conn.executemany(
            "INSERT INTO m VALUES ('t', ?, ?)", [(first + i, d) for i, d in enumerate(docs)]
        )

    def step(self, writes: list[ThreadWrite]) -> None:
        conn = self.conn
        for write in writes:
            conn.execute("BEGIN IMMEDIATE")
            self._insert(list(write.append))
            if isinstance(write.state, Unchanged):
                conn.execute("UPDATE t SET version = version + 1 WHERE thread_id = 't'")
            else:
                conn.execute(
                    "UPDATE t SET version = version + 1, state = ? WHERE thread_id = 't'",
                    (write.state,),
                )
            conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


async def _open(
    stack: contextlib.AsyncExitStack, store: SqliteStore | None, thread: str, msgs: Any
) -> Session[Any]:
    options: dict[str, Any] = {}
    if store is not None:
        await store.write(thread, ThreadWrite(append=encode_messages(msgs)), expected_version=0)
        options["store"] = store
    session = await stack.enter_async_context(
        Session(
            agent(),
            config=CONFIG.evolve(thread_id=thread),
            events=EventSink(logger=None),
            **options,
        )
    )
    if store is None:
        session.ctx.conversation.replace(msgs, emit_new=False)
    for _ in range(60):  # the usage record at its steady size (its newest 50 runs)
        await session.run("what next?")
    return session


CLOCK = time.process_time if "--cpu" in sys.argv else time.perf_counter


async def _steps(session: Session[Any], count: int) -> float:
    start = CLOCK()
    for _ in range(count):
        await session.run("what next?")
    return (CLOCK() - start) / count


def _floor_steps(floor: RawFloor, writes: list[ThreadWrite], count: int) -> float:
    """The mean time of ``count`` steps: ``writes`` holds the writes of ``count``
    consecutive steps, in order."""
    start = CLOCK()
    floor.step(writes)
    return (CLOCK() - start) / count


async def measure_steps(folder: Path, quick: bool) -> dict[tuple[str, int], list[float]]:
    """Per configuration and length, the mean step time of every round."""
    count, rounds = (10, 3) if quick else (25, 15)
    out: dict[tuple[str, int], list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        recording = _Recording()
        stores: dict[str, SqliteStore] = {}
        for mode, cls in (("NORMAL", RecordingStore), ("FULL", RecordingFullStore)):
            store = cls(folder / f"steps-{mode}.db")
            store.recording = recording
            stores[mode] = await stack.enter_async_context(store)
        runs: list[tuple[tuple[str, int], Callable[[], Any]]] = []
        for size in SIZES:
            msgs = history(size)
            none = await _open(stack, None, f"none-{size}", msgs)
            runs.append((("none", size), lambda s=none: _steps(s, count)))
            for mode, store in stores.items():
                session = await _open(stack, store, f"{mode}-{size}", msgs)
                recording.on, recording.writes = True, []
                for _ in range(count):  # what a round's steps write, each its own state
                    await session.run("what next?")
                recording.on = False
                writes = recording.writes
                floor = RawFloor(folder / f"floor-{mode}-{size}.db", mode, encode_messages(msgs))
                stack.callback(floor.close)
                runs.append(((mode, size), lambda s=session: _steps(s, count)))
                runs.append(
                    ((f"raw {mode}", size), lambda f=floor, w=writes: _floor_async(f, w, count))
                )
                out[(f"writes {mode}", size)] = [len(writes) / count]
        for index in range(rounds):
            for key, fn in runs if index % 2 == 0 else runs[::-1]:
                gc.collect()  # as abest_of does: no collection of another chunk's garbage
                gc.disable()
                try:
                    out.setdefault(key, []).append(await fn())
                finally:
                    gc.enable()
    return out


async def _floor_async(floor: RawFloor, writes: list[ThreadWrite], count: int) -> float:
    return _floor_steps(floor, writes, count)


def _med(values: list[float]) -> float:
    return statistics.median(values)


def step_rows(times: dict[tuple[str, int], list[float]]) -> list[Row]:
    """Rows per length: no store, then each sync mode with its floor and targets."""
    rows: list[Row] = []
    for size in SIZES:
        base = _med(times[("none", size)])
        rows.append(Row("durable step", f"no store, {size} msgs", base))
        for mode in ("NORMAL", "FULL"):
            step, raw = _med(times[(mode, size)]), _med(times[(f"raw {mode}", size)])
            # per round (the configurations of a round ran side by side), then the median
            added = _med(
                [s - b for s, b in zip(times[(mode, size)], times[("none", size)], strict=True)]
            )
            label = f"{mode}{' (default)' if mode == 'NORMAL' else ''}"
            rows.append(
                Row(
                    "durable step",
                    f"SqliteStore {label}, {size} msgs",
                    step,
                    baseline=f"no store, {size}",
                    baseline_seconds=base,
                    extra={"writes_per_step": times[(f"writes {mode}", size)][0]},
                )
            )
            rows.append(
                Row(
                    "durable step",
                    f"store's share {mode}, {size} msgs",
                    added,
                    baseline=f"raw insert+commit {mode}",
                    baseline_seconds=raw,
                    target=f"<= {FLOOR}x the raw writes",
                    met=added <= FLOOR * raw,
                )
            )
    for mode in ("NORMAL", "FULL"):
        long, short = _med(times[(mode, 20_000)]), _med(times[(mode, 2000)])
        rows.append(
            Row(
                "durable step",
                f"SqliteStore {mode}, 20000 vs 2000",
                long,
                baseline=f"{mode}, 2000 msgs",
                baseline_seconds=short,
                target=f"<= {FLAT}x (flat)",
                met=long <= FLAT * short,
            )
        )
    return rows


async def load_cost(store: Any, thread: str, number: int) -> float:
    async def load() -> None:
        async with Session(agent(), config=CONFIG.evolve(thread_id=thread), store=store):
            pass

    return await abest_of(load, number=number, repeat=3)


async def load_rows(folder: Path, quick: bool) -> list[Row]:
    msgs = history(2000)
    async with SqliteStore(folder / "load.db") as store:
        await store.write("load", ThreadWrite(append=encode_messages(msgs)), expected_version=0)
        load = await load_cost(store, "load", 5 if quick else 20)
    query = "SELECT doc FROM tinyctx_messages WHERE thread_id = ? ORDER BY pos"
    with sqlite_read_floor(folder / "load.db", query, ("load",), 0) as raw:
        raw_load = best_of(raw, number=5 if quick else 20, repeat=3)
    return [
        Row(
            "durable load",
            f"Session enter, {len(msgs)} messages",
            load,
            "raw SELECT + orjson, same rows",
            raw_load,
        )
    ]


async def _measure(quick: bool) -> list[Row]:
    with tempfile.TemporaryDirectory() as folder:
        times = await measure_steps(Path(folder), quick)
        rows = step_rows(times)
        for size in SIZES:
            print(
                f"{size:>6} msgs: no store {fmt_seconds(_med(times[('none', size)]))}; "
                + "; ".join(
                    f"{mode} {fmt_seconds(_med(times[(mode, size)]))} "
                    f"({int(times[(f'writes {mode}', size)][0])} commits/step, raw "
                    f"{fmt_seconds(_med(times[(f'raw {mode}', size)]))})"
                    for mode in ("NORMAL", "FULL")
                )
            )
        rows += await load_rows(Path(folder), quick)
    return rows


def run(quick: bool = False) -> list[Row]:
    return anyio.run(_measure, quick, backend="trio")


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

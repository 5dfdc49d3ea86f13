"""Durable threads on SQLite: per-step persistence cost and the time to load a long thread.

Side by side in the same run, on the same real transcript (``../shared/data/transcripts``,
read with :mod:`tinyctx.formats`, repeated with fresh call ids up to 2000 messages):

- tinyctx: ``SqliteStore.write`` of one step's encoded messages (codec included) under a
  lease; load = ``load_thread`` + ``decode_messages`` into message objects;
- the OpenAI Agents SDK: ``SQLiteSession.add_items`` / ``get_items`` (``openai-agents``);
- LangGraph: a ``MessagesState`` graph compiled with ``AsyncSqliteSaver``; a step is one
  ``ainvoke`` adding the step's messages, load = ``aget_tuple`` (``langgraph``,
  ``langgraph-checkpoint-sqlite``).

Equal durability: tinyctx's store runs SQLite at ``synchronous=NORMAL`` (its default: in WAL
mode a commit survives a crash of the process, and a power loss can lose only the last
commits, never corrupt the file; each commit skips an fsync, which is most of a step's
cost), while both peers run SQLite's default ``FULL`` (an fsync per commit). So tinyctx is
measured twice, at NORMAL and at FULL, and the verdict against the peers is taken at FULL,
equal durability; the NORMAL rows have tinyctx's own target only.

A step is one agent turn: an assistant message with its tool results (2-10 messages).
Bytes per step are the growth of the database file (WAL checkpointed before and after), at
a short (100 messages) and a long (2000) history: ours must not depend on the length.
The last section runs two writers on one thread and prints what each library does.
Peers are skipped (and said so) when the ``bench`` extra is not installed.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio.lowlevel
from _harness import FullSqliteStore, Row, fmt_seconds, print_table

from tinyctx import AssistantMessage, Message, SqliteStore, ToolCall, ToolResult, UserMessage
from tinyctx.codec import C_READER, decode_messages, encode_messages
from tinyctx.documents import SplitDocuments
from tinyctx.formats import read_transcript, to_openai
from tinyctx.messages import pending_tool_calls
from tinyctx.threads import LeaseHeld, StaleThreadVersion, ThreadWrite

try:
    from agents import SQLiteSession

    HAVE_OPENAI_AGENTS = True
except ImportError:  # pragma: no cover - the bench extra is optional
    HAVE_OPENAI_AGENTS = False

try:
    from langchain_core.messages import convert_to_messages
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    HAVE_LANGGRAPH = True
except ImportError:  # pragma: no cover - the bench extra is optional
    HAVE_LANGGRAPH = False

LONG = 2000
SHORT = 100
STEP_TARGET = 0.2e-3
LOAD_TARGET = 12e-3


# ---------------------------------------------------------------------------------------
# the transcript


def _data_dir() -> Path | None:
    here = Path(__file__).resolve().parents[1]
    for candidate in (
        os.environ.get("TINYCTX_SHARED_DATA", ""),
        str(here.parent / "shared" / "data"),
        "/work/shared/data",
    ):
        path = Path(candidate) / "transcripts" / "openai" if candidate else None
        if path is not None and path.is_dir():
            return path
    return None


def _complete(messages: list[Message]) -> list[Message]:
    while pending_tool_calls(messages):
        last = max(i for i, m in enumerate(messages) if isinstance(m, AssistantMessage))
        del messages[last:]
    return messages


def _renamed(messages: Sequence[Message], suffix: str) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        if isinstance(m, AssistantMessage) and m.tool_calls:
            calls = tuple(
                ToolCall(
                    f"{c.id}~{suffix}", c.name, c.arguments, invalid_arguments=c.invalid_arguments
                )
                for c in m.tool_calls
            )
            out.append(m.evolve(tool_calls=calls))
        elif isinstance(m, ToolResult):
            out.append(m.evolve(tool_call_id=f"{m.tool_call_id}~{suffix}"))
        else:
            out.append(m)
    return out


def build_thread(size: int) -> tuple[list[Message], str]:
    """``size`` messages (a few less, to end on a complete turn) of real transcripts."""
    folder = _data_dir()
    if folder is None:
        raise SystemExit("bench_durable needs ../shared/data/transcripts (TINYCTX_SHARED_DATA)")
    sources = [_complete(list(read_transcript(p).messages)) for p in sorted(folder.glob("*.jsonl"))]
    out: list[Message] = []
    round_ = 0
    while len(out) < size:
        for source in sources:
            out += _renamed(source, str(round_))
        round_ += 1
    return _complete(out[:size]), f"{len(sources)} real transcripts"


def split_steps(messages: Sequence[Message]) -> list[list[Message]]:
    """One step per assistant turn (with its results) or user message."""
    steps: list[list[Message]] = []
    for m in messages:
        if isinstance(m, ToolResult) and steps:
            steps[-1].append(m)
        else:
            steps.append([m])
    return steps


# ---------------------------------------------------------------------------------------
# file size


def _db_bytes(path: Path) -> int:
    """The database's size once the WAL is folded into it."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path.stat().st_size


# ---------------------------------------------------------------------------------------
# one backend's measurement


class Backend:
    """What the benchmark does with one library: prefill, step, load."""

    name = ""

    def __init__(self, folder: Path) -> None:
        self.path = folder / f"{type(self).__name__}.db"

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def prefill(self, thread: str, messages: Sequence[Message]) -> None:
        raise NotImplementedError

    def prepare(self, step: Sequence[Message]) -> Any:
        """The step as the library's own values (converted outside the timing)."""
        return step

    async def step(self, thread: str, prepared: Any) -> None:
        raise NotImplementedError

    async def load(self, thread: str) -> int:
        raise NotImplementedError

    def size_bytes(self) -> int:
        """What the library's storage holds now (a server backend measures its database)."""
        return _db_bytes(self.path)


class Ours(Backend):
    name = "tinyctx SqliteStore"
    store_class: type[SqliteStore] = SqliteStore

    async def open(self) -> None:
        self.store = self.store_class(self.path)
        await self.store.open()
        self.versions: dict[str, int] = {}
        self.leases: dict[str, Any] = {}

    async def close(self) -> None:
        await self.store.aclose()

    async def prefill(self, thread: str, messages: Sequence[Message]) -> None:
        lease = self.leases[thread] = await self.store.acquire_lease(thread, "bench", 600)
        self.versions[thread] = await self.store.write(
            thread, ThreadWrite(encode_messages(messages)), expected_version=0, lease=lease
        )

    async def step(self, thread: str, prepared: Any) -> None:
        self.versions[thread] = await self.store.write(
            thread,
            ThreadWrite(encode_messages(prepared)),
            expected_version=self.versions[thread],
            lease=self.leases[thread],
        )

    async def load(self, thread: str) -> int:
        record = await self.store.load_thread(thread)
        return len(decode_messages(record.messages))

    async def load_parts(self, thread: str, repeat: int) -> dict[str, float]:
        """Where the load's time goes: reading the rows, the whole decode, and (for scale)
        orjson parsing the same heads."""
        record = await self.store.load_thread(thread)
        docs = record.messages

        # what the decode parses: each stored document (a split one's head: its text is
        # read from its own column as text, not parsed)
        parsed = docs.rows if isinstance(docs, SplitDocuments) else [(d, None) for d in docs]

        async def parse() -> None:
            for doc, _ in parsed:
                orjson.loads(doc)

        async def decode() -> None:
            decode_messages(docs)

        return {
            "load_read": await _best(lambda: self.store.load_thread(thread), repeat),
            "load_parse": await _best(parse, repeat),
            "load_decode": await _best(decode, repeat),
        }


class OpenAIAgents(Backend):
    name = "OpenAI Agents SQLiteSession"

    async def open(self) -> None:
        self.sessions: dict[str, Any] = {}

    def session(self, thread: str) -> Any:
        if thread not in self.sessions:
            self.sessions[thread] = SQLiteSession(thread, self.path)
        return self.sessions[thread]

    async def close(self) -> None:
        for session in self.sessions.values():
            session.close()

    async def prefill(self, thread: str, messages: Sequence[Message]) -> None:
        await self.session(thread).add_items(to_openai(messages))

    def prepare(self, step: Sequence[Message]) -> Any:
        return to_openai(step)

    async def step(self, thread: str, prepared: Any) -> None:
        await self.session(thread).add_items(prepared)

    async def load(self, thread: str) -> int:
        return len(await self.session(thread).get_items())


class OursFull(Ours):
    name = "tinyctx SqliteStore (FULL)"
    store_class = FullSqliteStore


class LangGraph(Backend):
    name = "LangGraph AsyncSqliteSaver"

    async def open(self) -> None:
        self._saver_cm = AsyncSqliteSaver.from_conn_string(str(self.path))
        self.saver = await self._saver_cm.__aenter__()
        builder = StateGraph(MessagesState)
        builder.add_node("agent", _no_change)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        self.graph = builder.compile(checkpointer=self.saver)

    async def close(self) -> None:
        await self._saver_cm.__aexit__(None, None, None)

    @staticmethod
    def config(thread: str) -> Any:
        return {"configurable": {"thread_id": thread}}

    async def prefill(self, thread: str, messages: Sequence[Message]) -> None:
        await self.graph.ainvoke({"messages": self.prepare(messages)}, self.config(thread))

    def prepare(self, step: Sequence[Message]) -> Any:
        return convert_to_messages(to_openai(step, for_api=True))

    async def step(self, thread: str, prepared: Any) -> None:
        await self.graph.ainvoke({"messages": prepared}, self.config(thread))

    async def load(self, thread: str) -> int:
        found = await self.saver.aget_tuple(self.config(thread))
        assert found is not None
        return len(found.checkpoint["channel_values"]["messages"])


def _no_change(state: Any) -> dict[str, Any]:
    return {}


async def _best(fn: Callable[[], Awaitable[Any]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        best = min(best, time.perf_counter() - start)
    return best


def _in_turn(backends: Sequence[Backend], index: int) -> Sequence[Backend]:
    """The order of round ``index``: flipped every other round, so no backend always
    runs right after another one."""
    return backends if index % 2 == 0 else backends[::-1]


async def measure_backends(
    backends: Sequence[Backend],
    history: list[Message],
    steps: list[list[Message]],
    count: int,
    rounds: int,
    repeat: int,
) -> dict[str, dict[str, float]]:
    """Per-step time (best round's mean) and bytes at a short and a long history, and the
    best time to load the long thread, for each backend.

    The backends take turns round by round (the order flips every round), so a slow spell
    of the machine falls on all of them alike instead of on whichever ran then: the
    ratios compare the libraries, not two moments of the machine."""
    out: dict[str, dict[str, float]] = {b.name: {} for b in backends}
    for backend in backends:
        await backend.open()
    try:
        for label, size in (("short", SHORT), ("long", len(history))):
            thread = f"bench-{label}"
            prepared: dict[str, list[Any]] = {}
            before: dict[str, int] = {}
            best = dict.fromkeys(out, float("inf"))
            for backend in backends:
                await backend.prefill(thread, history[:size])
                mine = [backend.prepare(s) for s in steps[: count * (rounds + 1)]]
                # one round unmeasured first, so no timed round carries a library's
                # warm-up (prepared statements, pages read, allocator growth)
                for item in mine[count * rounds :]:
                    await backend.step(thread, item)
                prepared[backend.name] = mine[: count * rounds]
                before[backend.name] = backend.size_bytes()
            for index in range(rounds):
                for backend in _in_turn(backends, index):
                    chunk = prepared[backend.name][index * count : (index + 1) * count]
                    start = time.perf_counter()
                    for item in chunk:
                        await backend.step(thread, item)
                    elapsed = (time.perf_counter() - start) / len(chunk)
                    best[backend.name] = min(best[backend.name], elapsed)
            for backend in backends:
                measured = out[backend.name]
                measured[f"step_{label}"] = best[backend.name]
                added = backend.size_bytes() - before[backend.name]
                measured[f"bytes_{label}"] = added / (count * rounds)
        load_thread = "bench-load"
        for backend in backends:
            await backend.prefill(load_thread, history)
            out[backend.name]["loaded"] = await backend.load(load_thread)
        loads: dict[str, list[float]] = {name: [] for name in out}
        for index in range(repeat):
            for backend in _in_turn(backends, index):
                start = time.perf_counter()
                await backend.load(load_thread)
                loads[backend.name].append(time.perf_counter() - start)
        for backend in backends:
            out[backend.name]["load"] = min(loads[backend.name])
            out[backend.name]["load_median"] = statistics.median(loads[backend.name])
            if isinstance(backend, Ours):
                out[backend.name].update(await backend.load_parts(load_thread, repeat))
    finally:
        for backend in backends:
            await backend.close()
    return out


# ---------------------------------------------------------------------------------------
# two writers on one thread


async def two_writers_ours(folder: Path, turns: int) -> str:
    path = folder / "writers-ours.db"
    first, second = SqliteStore(path), SqliteStore(path)
    try:
        lease = await first.acquire_lease("t", "worker-1", 60)
        try:
            await second.acquire_lease("t", "worker-2", 60)
            lease_line = "second worker got the lease (WRONG)"
        except LeaseHeld as exc:
            lease_line = f"second worker refused: LeaseHeld({exc})"
        await first.release_lease(lease)
        # without leases, optimistic versions: each writer loads, then writes its turn
        landed = refused = 0

        async def writer(store: SqliteStore, name: str) -> None:
            nonlocal landed, refused
            for turn in range(turns):
                record = await store.load_thread("t")
                docs = encode_messages(
                    [UserMessage(f"{name} asks {turn}"), AssistantMessage(f"{name} answer {turn}")]
                )
                try:
                    await store.write("t", ThreadWrite(docs), expected_version=record.version)
                    landed += 1
                except StaleThreadVersion:
                    refused += 1

        async with anyio.create_task_group() as group:
            group.start_soon(writer, first, "A")
            group.start_soon(writer, second, "B")
        messages = decode_messages((await first.load_thread("t")).messages)
        split = _split_turns([m.text for m in messages])
        return (
            f"{lease_line}\n    versions: {landed} turns landed, {refused} refused "
            f"(StaleThreadVersion, the writer knows), {2 * turns - landed - refused} lost "
            f"silently, {split} turns interleaved"
        )
    finally:
        await first.aclose()
        await second.aclose()


def _split_turns(texts: list[str]) -> int:
    """Turns whose question and answer are not adjacent in the stored log."""
    split = 0
    for index, text in enumerate(texts):
        if " asks " in text:
            who, _, turn = text.partition(" asks ")
            follow = texts[index + 1] if index + 1 < len(texts) else ""
            split += follow != f"{who} answer {turn}"
    return split


async def two_writers_openai(folder: Path, turns: int) -> str:
    path = folder / "writers-openai.db"
    first, second = SQLiteSession("t", path), SQLiteSession("t", path)

    async def writer(session: Any, name: str) -> None:
        for turn in range(turns):
            await session.add_items([{"role": "user", "content": f"{name} asks {turn}"}])
            await anyio.lowlevel.checkpoint()  # the model call between question and answer
            await session.add_items([{"role": "assistant", "content": f"{name} answer {turn}"}])

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(writer, first, "A")
            group.start_soon(writer, second, "B")
        items = await first.get_items()
    finally:
        first.close()
        second.close()
    texts = [str(item["content"]) for item in items]
    return (
        f"both writers accepted; {len(texts)} of {4 * turns} items stored, "
        f"{_split_turns(texts)} of {2 * turns} turns interleaved with the other writer's"
    )


async def two_writers_langgraph(folder: Path, turns: int) -> str:
    path = folder / "writers-langgraph.db"
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        builder = StateGraph(MessagesState)
        builder.add_node("agent", _no_change)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        graph = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "t"}}

        async def writer(name: str) -> None:
            for turn in range(turns):
                await graph.ainvoke(
                    {"messages": [{"role": "user", "content": f"{name} {turn}"}]}, config
                )

        async with anyio.create_task_group() as group:
            group.start_soon(writer, "A")
            group.start_soon(writer, "B")
        found = await saver.aget_tuple(config)
        stored = len(found.checkpoint["channel_values"]["messages"]) if found else 0
    return (
        f"both writers accepted, no error; {stored} of {2 * turns} appends kept, "
        f"{2 * turns - stored} dropped silently"
    )


# ---------------------------------------------------------------------------------------
# the run


def _fmt_bytes(value: float) -> str:
    if value >= 1 << 20:
        return f"{value / (1 << 20):.1f} MB"
    if value >= 1 << 10:
        return f"{value / (1 << 10):.1f} KB"
    return f"{value:.0f} B"


def _verdict_rows(
    results: dict[str, dict[str, float]], case: str, key: str, target: float, unit: str
) -> list[Row]:
    """A step's rows: tinyctx at NORMAL (its default) with its own target, then at FULL
    against the best peer (which runs FULL); a load (no sync mode enters): one row."""
    ours, full = results[Ours.name], results[OursFull.name]
    peers = {k: v for k, v in results.items() if k not in (Ours.name, OursFull.name)}
    best_peer = min(peers.items(), key=lambda kv: kv[1][key]) if peers else None
    base_name, base = (best_peer[0], best_peer[1][key]) if best_peer else (None, None)
    label = f"{base_name} (FULL)" if base_name else None
    rows: list[Row] = []
    mine = ours
    if key.startswith("step"):
        rows.append(
            Row(
                "durable",
                f"{case}, NORMAL (default)",
                ours[key],
                baseline=label,
                baseline_seconds=base,
                target=f"<= {unit}",
                met=ours[key] <= target,
                extra=dict(ours.items()),
            )
        )
        mine, case = full, f"{case}, FULL (= peers)"
    met = mine[key] <= target and (base is None or mine[key] * 2 <= base)
    rows.append(
        Row(
            "durable",
            case,
            mine[key],
            baseline=label,
            baseline_seconds=base,
            target=f"<= {unit} and >= 2x better" if base is not None else f"<= {unit}",
            met=met,
            extra=dict(mine.items()),
        )
    )
    return rows


async def _measure(quick: bool) -> tuple[list[Row], list[str]]:
    history, source = build_thread(LONG)
    steps = split_steps(build_thread(LONG + 1200)[0][len(history) :])
    # best of many short rounds: a busy machine inflates some rounds, never deflates one
    count, rounds = (10, 2) if quick else (10, 30)
    repeat = 3 if quick else 30
    backends: list[type[Backend]] = [Ours, OursFull]
    if HAVE_OPENAI_AGENTS:
        backends.append(OpenAIAgents)
    if HAVE_LANGGRAPH:
        backends.append(LangGraph)
    results: dict[str, dict[str, float]] = {}
    notes = [
        f"history: {len(history)} messages from {source}; steps: the next real turns "
        f"(mean {sum(len(s) for s in steps[:count]) / count:.1f} messages), best round of "
        f"{rounds} x {count} after one unmeasured, loads best of {repeat}; tinyctx and OpenAI "
        "taking turns (LangGraph: 3 steps, apart)"
    ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # tinyctx and the OpenAI SDK take turns; LangGraph rewrites every message at every
        # step, so it runs apart, with fewer steps to keep it bounded
        side_by_side = [cls(folder) for cls in backends if cls is not LangGraph]
        results.update(await measure_backends(side_by_side, history, steps, count, rounds, repeat))
        if LangGraph in backends:
            results.update(await measure_backends([LangGraph(folder)], history, steps, 3, 1, 3))
        writers = 5 if quick else 100
        notes.append(f"two writers on one thread, {writers} turns each:")
        notes.append(f"  tinyctx: {await two_writers_ours(folder, writers)}")
        if HAVE_OPENAI_AGENTS:
            notes.append(f"  OpenAI Agents: {await two_writers_openai(folder, writers)}")
        if HAVE_LANGGRAPH:
            notes.append(f"  LangGraph: {await two_writers_langgraph(folder, writers)}")
    for name, r in results.items():
        notes.insert(
            1,
            f"  {name:<30} step@{SHORT} {fmt_seconds(r['step_short']):>10} "
            f"{_fmt_bytes(r['bytes_short']):>9}   step@{len(history)} "
            f"{fmt_seconds(r['step_long']):>10} {_fmt_bytes(r['bytes_long']):>9}   "
            f"load {int(r['loaded'])} msgs {fmt_seconds(r['load']):>10} "
            f"(median {fmt_seconds(r['load_median'])})",
        )
    ours = results[Ours.name]
    rows: list[Row] = []

    def row(case: str, key: str, target: float, unit: str) -> None:
        rows.extend(_verdict_rows(results, case, key, target, unit))

    parse = fmt_seconds(ours["load_parse"])
    decode = (
        f"in C (tinyctx._speedups), reading the JSON text itself; orjson alone takes {parse} "
        "to parse the same heads"
        if C_READER
        else f"in Python (no C reader here), of which orjson parsing {parse}"
    )
    notes.append(
        f"tinyctx load, apart: read the rows {fmt_seconds(ours['load_read'])}, decode "
        f"{fmt_seconds(ours['load_decode'])} ({decode}; texts are read as text from their "
        "own column)"
    )
    row(f"step @{len(history)} msgs (store)", "step_long", STEP_TARGET, "0.2 ms")
    row(f"step @{SHORT} msgs (store)", "step_short", STEP_TARGET, "0.2 ms")
    row(f"load {int(ours['loaded'])} msgs", "load", LOAD_TARGET, "12 ms")
    same = abs(ours["bytes_long"] - ours["bytes_short"]) <= 0.25 * max(ours["bytes_short"], 1)
    notes.append(
        f"tinyctx bytes per step: {_fmt_bytes(ours['bytes_short'])} at {SHORT} messages, "
        f"{_fmt_bytes(ours['bytes_long'])} at {len(history)}: "
        f"{'independent of the history length' if same else 'DEPENDS on the history length'}"
    )
    return rows, notes


def run(quick: bool = False) -> list[Row]:
    rows, notes = anyio.run(_measure, quick, backend="asyncio")
    for line in notes:
        print(line)
    return rows


if __name__ == "__main__":
    print_table(run(quick="--quick" in sys.argv))

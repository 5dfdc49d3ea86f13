"""Microcompaction and the summarize split on 100 / 2,000 / 20,000-message histories.

Histories are real agent transcripts (``../shared/data/transcripts/openai/*.jsonl``) repeated
with fresh tool-call ids until they reach the size; without the data a generated history of
the same shape is used. Each case is printed next to LangChain's equivalent, measured in the
same run on the same history, with its own verdict at every size:

* microcompact: ``ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=0, keep=5)])``
  through its own ``awrap_model_call`` (deepcopy + edit, as it runs before every call). It
  is transient, so every call is a cold start. tinyctx persists, so its steady state is
  "warm" (older results already cleared, the memo answers); its cold twin is the first call
  on a history never seen (a fresh copy decoded off the clock, a new counter and layer).
  Targets: each <= LangChain; 2,000 messages warm <= 0.5 ms too.
* summarize split: ``SummarizationMiddleware._determine_cutoff_index`` (keep 10 messages)
  next to :func:`tinyctx.middleware.summary_split` (target <= 2x); the per-call check below
  the trigger (``abefore_model`` counting every message) next to the ``Summarize`` layer's,
  warm and cold; and a whole summarization with an instant summarizer (no model), both
  sides (targets <= LangChain).

``python benchmarks/bench_compaction.py [--quick]``. LangChain is optional (the ``bench``
extra); without it the tinyctx numbers print alone with "LangChain not installed".
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Row,
    abest_of,
    abest_of_fresh,
    best_of,
    best_of_fresh,
    fmt_seconds,
    fresh_copy,
    print_table,
    verdict,
)

from tinyctx import (
    AssistantMessage,
    EventSink,
    Message,
    ModelRequest,
    ModelResponse,
    RunContext,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.messages import pending_tool_calls
from tinyctx.middleware import Microcompact, Summarize
from tinyctx.middleware.microcompact import microcompact_history
from tinyctx.middleware.summarize import summarize_history
from tinyctx.middleware.summarize import summary_split as tinyctx_split
from tinyctx.tokens import HeuristicCounter

SIZES = (100, 2000, 20_000)
KEEP_TURNS = 5
KEEP_MESSAGES = 10

try:  # the peer, measured in the same run when installed (pip install -e '.[bench]')
    from langchain.agents.middleware import (
        ClearToolUsesEdit,
        ContextEditingMiddleware,
        SummarizationMiddleware,
    )
    from langchain.agents.middleware.types import ModelRequest as LCRequest
    from langchain.agents.middleware.types import ModelResponse as LCResponse
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.messages import AIMessage as LCAssistant
    from langchain_core.messages import BaseMessage
    from langchain_core.messages import HumanMessage as LCUser
    from langchain_core.messages import SystemMessage as LCSystem
    from langchain_core.messages import ToolMessage as LCTool

    HAVE_LANGCHAIN = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_LANGCHAIN = False


# ---------------------------------------------------------------------------------------
# histories


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


def load_transcript(path: Path) -> list[Message]:
    """One OpenAI-normalized JSONL transcript as tinyctx messages (a trailing call that was
    never answered is dropped, so the transcript can be repeated)."""
    out: list[Message] = []
    names: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        role, content = item["role"], item.get("content") or ""
        if role == "system":
            out.append(SystemMessage(content))
        elif role == "user":
            out.append(UserMessage(content))
        elif role == "assistant":
            calls = []
            for raw in item.get("tool_calls") or ():
                function = raw["function"]
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except json.JSONDecodeError:
                    arguments = {"raw": function.get("arguments")}
                if not isinstance(arguments, dict):
                    arguments = {"value": arguments}
                names[raw["id"]] = function["name"]
                calls.append(ToolCall(raw["id"], function["name"], arguments))
            out.append(AssistantMessage(content, tuple(calls)))
        elif role == "tool":
            call_id = item["tool_call_id"]
            out.append(ToolResult(call_id, content, names.get(call_id, "")))
    while pending_tool_calls(out):
        last = max(i for i, m in enumerate(out) if isinstance(m, AssistantMessage))
        del out[last:]
    return out


def _generated() -> list[Message]:
    """A transcript-shaped history when the real data is not available."""
    out: list[Message] = [SystemMessage("You are a coding agent."), UserMessage("Fix the bug.")]
    for turn in range(150):
        calls = tuple(
            ToolCall(f"g{turn}_{k}", ("bash", "read_file")[k % 2], {"cmd": f"grep -n x f{k}.py"})
            for k in range(1 + turn % 3)
        )
        out.append(AssistantMessage(f"Step {turn}: checking.", calls))
        out += [
            ToolResult(c.id, f"{c.name} output line\n" * (20 + turn % 90), c.name) for c in calls
        ]
    out.append(AssistantMessage("Fixed."))
    return out


def _renamed(messages: Sequence[Message], suffix: str) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        if isinstance(m, AssistantMessage) and m.tool_calls:
            calls = tuple(ToolCall(f"{c.id}~{suffix}", c.name, c.arguments) for c in m.tool_calls)
            out.append(AssistantMessage(m.content, calls))
        elif isinstance(m, ToolResult):
            out.append(ToolResult(f"{m.tool_call_id}~{suffix}", m.content, m.name, m.is_error))
        else:
            out.append(m)
    return out


def build_history(size: int) -> tuple[Message, ...]:
    """``size`` messages (or a few less, to end on a complete turn) of real transcripts."""
    folder = _data_dir()
    sources = (
        [load_transcript(p) for p in sorted(folder.glob("*.jsonl"))]
        if folder is not None
        else [_generated()]
    )
    out: list[Message] = []
    round_ = 0
    while len(out) < size:
        for source in sources:
            out += _renamed(source, str(round_))
        round_ += 1
    out = out[:size]
    while pending_tool_calls(out):
        last = max(i for i, m in enumerate(out) if isinstance(m, AssistantMessage))
        del out[last:]
    return tuple(out)


def to_langchain(messages: Sequence[Message]) -> list[Any]:
    out: list[BaseMessage] = []
    for m in messages:
        if isinstance(m, SystemMessage):
            out.append(LCSystem(content=m.content))
        elif isinstance(m, UserMessage):
            out.append(LCUser(content=m.content))
        elif isinstance(m, AssistantMessage):
            calls = [
                {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
                for c in m.tool_calls
            ]
            out.append(LCAssistant(content=m.content, tool_calls=calls))
        elif isinstance(m, ToolResult):
            out.append(LCTool(content=m.content, tool_call_id=m.tool_call_id, name=m.name))
    return out


# ---------------------------------------------------------------------------------------
# measuring


def _number(fn: Callable[[], Any], quick: bool) -> int:
    """How many calls make one timing round of about 50 ms (10 ms quick)."""
    started = time.perf_counter()
    fn()
    once = max(time.perf_counter() - started, 1e-7)
    return max(1, min(20_000, int((0.01 if quick else 0.05) / once)))


async def _anumber(fn: Callable[[], Any], quick: bool) -> int:
    started = time.perf_counter()
    await fn()
    once = max(time.perf_counter() - started, 1e-7)
    return max(1, min(20_000, int((0.01 if quick else 0.05) / once)))


def sync_time(fn: Callable[[], Any], quick: bool) -> float:
    return best_of(fn, number=_number(fn, quick), repeat=3 if quick else 5)


async def async_time(fn: Callable[[], Any], quick: bool) -> float:
    return await abest_of(fn, number=await _anumber(fn, quick), repeat=3 if quick else 5)


class Instant:
    """A summarizer that answers at once: measures everything around the model call."""

    async def summarize(self, messages: Sequence[Message], ctx: RunContext[Any]) -> str:
        return "summary"


async def _core(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return ModelResponse(AssistantMessage("ok"))


def cold_number(quick: bool, n: int) -> int:
    """Cold calls per round: each needs its own fresh copy, built off the clock."""
    return max(2, (200 if quick else 2_000) // n)


async def _langchain_times(history: tuple[Message, ...], quick: bool) -> dict[str, float]:
    """LangChain's edit, cutoff, check below the trigger and whole summarization on
    ``history`` (each recomputes from scratch on every call); empty when not installed."""
    if not HAVE_LANGCHAIN:
        return {}
    lc_messages = to_langchain(history)
    fake = FakeListChatModel(responses=["summary"])
    editing = ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=0, keep=5)])
    request = LCRequest(model=fake, messages=lc_messages)

    async def handler(req: Any) -> Any:
        return LCResponse(result=[LCAssistant(content="ok")])

    async def instant(messages: Sequence[Any]) -> str:
        return "summary"

    summarizing = SummarizationMiddleware(
        fake, trigger=("tokens", 10**9), keep=("messages", KEEP_MESSAGES)
    )
    always = SummarizationMiddleware(
        fake, trigger=("messages", 1), keep=("messages", KEEP_MESSAGES), summarizer=instant
    )
    state = {"messages": lc_messages}
    return {
        "edit": await async_time(lambda: editing.awrap_model_call(request, handler), quick),
        "split": sync_time(lambda: summarizing._determine_cutoff_index(lc_messages), quick),
        "check": await async_time(lambda: summarizing.abefore_model(state, None), quick),
        "summary": await async_time(lambda: always.abefore_model(state, None), quick),
    }


async def _microcompact_rows(
    history: tuple[Message, ...], quick: bool, lc: dict[str, float], ctx: RunContext[Any]
) -> list[Row]:
    """Warm (steady state, the memo answers) and cold (a fresh copy, a new counter and
    layer: a history never seen) next to LangChain's edit, which is cold every call."""
    n = len(history)
    counter = HeuristicCounter()
    counter.count_messages(history)  # the memo is warm in a live session
    compacted, stats = microcompact_history(history, KEEP_TURNS, counter=counter)
    warm = sync_time(lambda: microcompact_history(compacted, KEEP_TURNS, counter=counter), quick)
    repeat = 3 if quick else 5
    cold = best_of_fresh(
        lambda made: microcompact_history(made[0], KEEP_TURNS, counter=made[1]),
        lambda: (fresh_copy(history), HeuristicCounter()),
        number=cold_number(quick, n),
        repeat=repeat,
    )
    layer = Microcompact(keep_recent=KEEP_TURNS, counter=counter)
    # each call gets a new snapshot tuple of the (already compacted) conversation, as in
    # a session: the layer checks the prefix it compacted before and walks the rest
    same_messages = list(compacted)  # tuple() of a tuple is that tuple: copy via a list
    snapshots = [ModelRequest(messages=tuple(same_messages)) for _ in range(2)]
    assert snapshots[0].messages is not snapshots[1].messages
    flip = iter(range(10**9))

    def next_call() -> Any:
        return layer.wrap_model(snapshots[next(flip) % 2], ctx, _core)

    per_call = await async_time(next_call, quick)

    async def first_call(made: tuple[Microcompact, ModelRequest]) -> Any:
        return await made[0].wrap_model(made[1], ctx, _core)

    per_call_cold = await abest_of_fresh(
        first_call,
        lambda: (
            Microcompact(keep_recent=KEEP_TURNS, counter=HeuristicCounter()),
            ModelRequest(messages=fresh_copy(history)),
        ),
        number=cold_number(quick, n),
        repeat=repeat,
    )
    peer = lc.get("edit")
    base = "LangChain ClearToolUsesEdit" if peer is not None else None
    extra = {"messages": n, "results_cleared": stats.results_cleared}
    warm_verdict = verdict(warm, peer)
    if len(history) == len(build_history(2000)):  # issue #20's absolute target, at its size
        ok = warm <= 0.5e-3 and (warm_verdict["met"] is not False)
        warm_verdict = {"target": f"<= 0.5 ms{' and <= LangChain' if peer else ''}", "met": ok}
    cases = (
        (f"{n} msgs warm (steady state)", warm, warm_verdict),
        (f"{n} msgs cold (first clear, fresh copy)", cold, verdict(cold, peer)),
        (f"{n} msgs layer per call (warm)", per_call, verdict(per_call, peer)),
        (f"{n} msgs layer first call (cold)", per_call_cold, verdict(per_call_cold, peer)),
    )
    return [
        Row("microcompact", case, seconds, base, peer, extra=extra, **judged)
        for case, seconds, judged in cases
    ]


async def _summarize_rows(
    history: tuple[Message, ...], quick: bool, lc: dict[str, float], ctx: RunContext[Any]
) -> list[Row]:
    """The split (target <= 2x LangChain's cutoff), the check below the trigger warm and
    cold, and a whole summarization, each next to LangChain's on the same history."""
    n = len(history)
    counter = HeuristicCounter()
    counter.count_messages(history)  # the memo is warm in a live session
    split = sync_time(lambda: tinyctx_split(history, KEEP_MESSAGES), quick)
    quiet = Summarize(Instant(), trigger_tokens=10**9, counter=counter)
    request = ModelRequest(messages=history)
    check = await async_time(lambda: quiet.wrap_model(request, ctx, _core), quick)

    async def first_check(made: tuple[Summarize, ModelRequest]) -> Any:
        return await made[0].wrap_model(made[1], ctx, _core)

    check_cold = await abest_of_fresh(
        first_check,
        lambda: (
            Summarize(Instant(), trigger_tokens=10**9, counter=HeuristicCounter()),
            ModelRequest(messages=fresh_copy(history)),
        ),
        number=cold_number(quick, n),
        repeat=3 if quick else 5,
    )
    whole = await async_time(
        lambda: summarize_history(history, Instant(), ctx, KEEP_MESSAGES, counter=counter),
        quick,
    )
    peer_split = lc.get("split")
    split_verdict = verdict(split / 2, peer_split, "<= 2x LangChain")
    cases = (
        (f"{n} msgs split", split, "LangChain cutoff index", "split", split_verdict),
        (f"{n} msgs below trigger (warm)", check, "LangChain abefore_model", "check", None),
        (f"{n} msgs below trigger (cold)", check_cold, "LangChain abefore_model", "check", None),
        (f"{n} msgs instant summarizer", whole, "LangChain abefore_model", "summary", None),
    )
    rows: list[Row] = []
    for case, seconds, base, key, judged in cases:
        peer = lc.get(key)
        judged = judged or verdict(seconds, peer)
        rows.append(Row("summarize", case, seconds, base if peer else None, peer, **judged))
    return rows


async def _measure(quick: bool) -> list[Row]:
    rows: list[Row] = []
    ctx: RunContext[Any] = RunContext.new(events=EventSink(logger=None))
    for size in SIZES:
        history = build_history(size)
        lc = await _langchain_times(history, quick)
        rows += await _microcompact_rows(history, quick, lc, ctx)
        rows += await _summarize_rows(history, quick, lc, ctx)
    return rows


def run(quick: bool = False) -> list[Row]:
    # asyncio: LangChain's runnables expect it (tinyctx runs on trio and asyncio alike)
    return anyio.run(_measure, quick, backend="asyncio")


if __name__ == "__main__":
    if not HAVE_LANGCHAIN:
        print("LangChain not installed (pip install -e '.[bench]'): tinyctx numbers only")
    source = "real transcripts" if _data_dir() is not None else "generated histories"
    print(f"histories: {source}")
    rows = run(quick="--quick" in sys.argv)
    print_table(rows)
    for row in rows:
        if row.ratio is not None:
            how = f"{1 / row.ratio:,.1f}x faster" if row.ratio <= 1 else f"{row.ratio:,.1f}x slower"
            print(
                f"  {row.group} {row.case}: {fmt_seconds(row.seconds)} = {how} than {row.baseline}"
            )

"""Session memory reads every committed message as it was committed, whatever compaction
rewrote in the conversation since (``Conversation.tap``), on trio and asyncio."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.servers import make_backend
from tinyctx import (
    Agent,
    AssistantMessage,
    Conversation,
    LayerLike,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunConfig,
    RunContext,
    Session,
    ToolResult,
    UserMessage,
    tool,
)
from tinyctx.middleware import (
    BudgetGuard,
    ExtractiveSummarizer,
    Microcompact,
    SessionMemory,
    Summarize,
)
from tinyctx.middleware.extractors import ExtractionJob
from tinyctx.testing import call, reply


class Recording:
    """An extractor that keeps every job's new messages; it may yield a few times first
    (so runs go on meanwhile and extractions queue)."""

    def __init__(self, pauses: Sequence[int] = (0,)) -> None:
        self.jobs: list[tuple[Any, ...]] = []
        self.pauses = list(pauses)

    async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> Sequence[str]:
        pause = self.pauses[len(self.jobs) % len(self.pauses)]
        for _ in range(pause):
            await anyio.lowlevel.checkpoint()
        self.jobs.append(job.new_messages)
        return [f"note {len(self.jobs)}"]

    def tool_results(self) -> Counter[tuple[str, str]]:
        """(call id, content) of every tool result the extractor was shown, with counts."""
        return Counter(
            (m.tool_call_id, m.text)
            for messages in self.jobs
            for m in messages
            if isinstance(m, ToolResult)
        )


class Script:
    """A model that asks for ``steps[i]`` reads in the i-th step of a run, then answers;
    and the read tool, whose every output is unique (so each original is recognizable)."""

    def __init__(self, runs: Sequence[Sequence[int]]) -> None:
        self.runs = [list(steps) for steps in runs]
        self.pages = 0
        self.step = 0

    async def __call__(self, request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
        steps = self.runs[0]
        if not steps:
            self.runs.pop(0)
            return reply("done")
        count = steps.pop(0)
        self.step += 1
        return reply("", *(call("read", id=f"s{self.step}c{i}") for i in range(count)))

    def read_tool(self) -> Any:
        @tool
        async def read() -> str:
            """Read the next page."""
            self.pages += 1
            return f"page {self.pages}: " + "tool output " * (8 + self.pages % 12)

        return read


def stack(kind: str) -> list[LayerLike]:
    """The compaction layers of a stack (persistent: they rewrite the conversation)."""
    micro = Microcompact(keep_recent=1)
    summary = Summarize(ExtractiveSummarizer(max_tokens=60), trigger_tokens=250, keep_recent=2)
    guard = BudgetGuard(max_tokens=1000, low_water=0.3)
    return {
        "microcompact": [micro],
        "summarize": [summary],
        "budget": [guard],
        "all": [guard, summary, micro],
    }[kind]


async def run_all(
    runs: Sequence[Sequence[int]], kind: str, pauses: Sequence[int], store: Any = None
) -> tuple[Recording, list[ToolResult]]:
    """Run ``runs`` in one session under ``kind``; the extractor and every tool result as
    the loop committed it (recorded by a tap opened before the first run)."""
    script = Script(runs)
    extractor = Recording(pauses)
    notes = store if store is not None else MemoryStore()  # fenced by the thread's lease
    memory = SessionMemory(extractor, store=notes, min_tokens=0, min_tool_calls=0, min_turns=1)
    agent = Agent(model=script, tools=[script.read_tool()], middleware=[memory, *stack(kind)])
    config = RunConfig(thread_id="m", max_model_calls=50)
    async with Session(agent, config=config, store=store) as session:
        witness = session.ctx.conversation.tap()
        for index in range(len(runs)):
            await session.run(f"task {index}")
        committed = [m for m in witness.messages if isinstance(m, ToolResult)]
    return extractor, committed


runs_strategy = st.lists(
    st.lists(st.integers(1, 3), min_size=0, max_size=4), min_size=1, max_size=5
)


class TestTheExtractorSeesTheOriginals:
    """Every tool result committed reaches the extractor once, with its original content,
    whatever compaction cleared or summarized before the extraction ran."""

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        runs=runs_strategy,
        kind=st.sampled_from(["microcompact", "summarize", "budget", "all"]),
        pauses=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    )
    async def test_every_tool_result_reaches_the_extractor_as_committed(
        self, runs: list[list[int]], kind: str, pauses: list[int]
    ) -> None:
        """Runs of reads under compaction, extractions queued behind slow ones: each
        committed tool result is in exactly one job, with the content the tool returned."""
        extractor, committed = await run_all(runs, kind, pauses)
        seen = extractor.tool_results()
        expected = Counter((m.tool_call_id, m.text) for m in committed)
        assert seen == expected
        assert all("[Old tool result content cleared]" not in text for _, text in seen)

    @pytest.mark.parametrize("kind", ["microcompact", "summarize", "budget", "all"])
    async def test_under_pressure_no_tool_result_is_missed(self, kind: str) -> None:
        """Many reads in a small window, extraction lagging behind: none is missed (the
        issue saw 9000 of 12000 never shown to the extractor)."""
        runs = [[3] * 9] * 3
        extractor, committed = await run_all(runs, kind, [4, 0, 9])
        assert len(committed) == 81
        assert extractor.tool_results() == Counter((m.tool_call_id, m.text) for m in committed)


class TestMessageTap:
    """Conversation.tap() records what is committed as committed, not what a rewrite makes."""

    async def test_a_tap_keeps_originals_across_a_rewrite(self) -> None:
        """append and add are recorded; replace(emit_new=False) rewrites are not."""
        conversation = Conversation()
        tap = conversation.tap()
        first = UserMessage("hello")
        await conversation.append(first)
        conversation.add(AssistantMessage("hi"))
        conversation.replace([UserMessage("[summary]")], emit_new=False)
        assert [m.text for m in tap.messages] == ["hello", "hi"]
        assert tap.messages[0] is first

    async def test_replace_with_new_messages_records_them(self) -> None:
        """replace(emit_new=True) commits its new messages: they are recorded once."""
        conversation = Conversation([UserMessage("a")])
        tap = conversation.tap(backlog=conversation.messages)
        conversation.replace([*conversation.messages, UserMessage("b")])
        assert [m.text for m in tap.messages] == ["a", "b"]

    async def test_drop_and_close(self) -> None:
        """drop forgets the oldest; more than held is an error naming the count; a closed
        tap records nothing more and the conversation forgets it."""
        conversation = Conversation()
        tap = conversation.tap()
        for text in "abc":
            await conversation.append(UserMessage(text))
        tap.drop(2)
        assert [m.text for m in tap.messages] == ["c"]
        with pytest.raises(ValueError, match="count 5 is more than the 1"):
            tap.drop(5)
        with pytest.raises(ValueError, match="count must be an integer >= 0"):
            tap.drop(-1)
        tap.close()
        await conversation.append(UserMessage("d"))
        assert tap.closed and len(tap) == 0
        assert conversation._taps == []


class TestAcrossAStoredThread:
    """With a thread store (SQLite), the same holds within each session."""

    async def test_sqlite_thread(self, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        """A stored thread compacted by every layer: the extractor still sees originals."""
        store = make_backend("sqlite", request, tmp_path)
        try:
            extractor, committed = await run_all([[3, 3, 3]] * 4, "all", [5, 0], store=store)
        finally:
            await store.aclose()
        assert extractor.tool_results() == Counter((m.tool_call_id, m.text) for m in committed)

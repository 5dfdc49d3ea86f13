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
from tinyctx.chain import LayerLike
from tinyctx.conversation import Conversation
from tinyctx.middleware import (
    BudgetGuard,
    ExtractiveSummarizer,
    Microcompact,
    SessionMemory,
    Summarize,
    _unread,
)
from tinyctx.middleware._unread import Unread
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
    runs: Sequence[Sequence[int]],
    kind: str,
    pauses: Sequence[int],
    store: Any = None,
    *,
    sessions: Sequence[int] = (),
    min_turns: int = 1,
) -> tuple[Recording, list[ToolResult]]:
    """Run ``runs`` under ``kind``, in one session, or a new one (on ``store``) before
    each run whose index is in ``sessions``; then, with ``min_turns`` above 1, as many
    runs without tools as make the last extraction start. The extractor, and every tool
    result as the loop committed it (recorded by a tap opened in each session)."""
    flush = [[] for _ in range(min_turns - 1)]
    script = Script([*runs, *flush])
    extractor = Recording(pauses)
    notes = store if store is not None else MemoryStore()  # fenced by the thread's lease
    memory = SessionMemory(
        extractor, store=notes, min_tokens=0, min_tool_calls=0, min_turns=min_turns
    )
    agent = Agent(model=script, tools=[script.read_tool()], middleware=[memory, *stack(kind)])
    config = RunConfig(thread_id="m", max_model_calls=50)
    starts = sorted({0, *(i for i in sessions if 0 < i < len(runs)), len(runs)})
    committed: list[ToolResult] = []
    for first, end in zip(starts, starts[1:], strict=False):
        async with Session(agent, config=config, store=store) as session:
            witness = session.ctx.conversation.tap()
            for index in range(first, end):
                await session.run(f"task {index}")
            if end == len(runs):
                for index in range(len(flush)):
                    await session.run(f"wrap up {index}")
            committed += [m for m in witness.messages if isinstance(m, ToolResult)]
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

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        runs=runs_strategy,
        kind=st.sampled_from(["microcompact", "summarize", "budget", "all"]),
        pauses=st.lists(st.integers(0, 6), min_size=1, max_size=4),
        sessions=st.lists(st.integers(1, 4), max_size=4),
        min_turns=st.integers(1, 3),
    )
    async def test_across_sessions_of_a_stored_thread(
        self,
        runs: list[list[int]],
        kind: str,
        pauses: list[int],
        sessions: list[int],
        min_turns: int,
    ) -> None:
        """The same with the runs spread over sessions of a stored thread and extraction
        every ``min_turns`` runs: what one session left unread and compacted, a later
        one's extraction reads as committed."""
        store = MemoryStore()
        extractor, committed = await run_all(
            runs, kind, pauses, store, sessions=sessions, min_turns=min_turns
        )
        assert extractor.tool_results() == Counter((m.tool_call_id, m.text) for m in committed)

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

    async def test_is_displaced_follows_rewrites(self) -> None:
        """A held message a rewrite took out is displaced, and again not once it is back;
        a backlog message the conversation does not hold is displaced from the start."""
        conversation = Conversation()
        elsewhere = UserMessage("restored from a store")
        tap = conversation.tap(backlog=[elsewhere])
        assert tap.is_displaced(elsewhere)
        first, second = UserMessage("a"), AssistantMessage("b")
        await conversation.append(first)
        await conversation.append(second)
        assert not tap.is_displaced(first)
        conversation.replace([UserMessage("[summary of a]"), second], emit_new=False)
        assert tap.is_displaced(first) and not tap.is_displaced(second)
        conversation.replace([first, second], emit_new=False)
        assert not tap.is_displaced(first)
        tap.drop(2)
        assert not tap.is_displaced(elsewhere)

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


STORES = ["memory", "sqlite", "postgres", "redis"]


@pytest.fixture(params=STORES)
async def thread_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A new, empty store of each kind (real PostgreSQL and Redis)."""
    backend = make_backend(request.param, request, tmp_path)
    yield backend
    await backend.aclose()


class TestAcrossSessions:
    """One session per request, extraction every third: what a session left unread, a
    compaction cleared or summarized meanwhile, reaches a later session's extraction as it
    was committed (the layer's thread state keeps it), on every store."""

    @pytest.mark.parametrize("kind", ["microcompact", "all"])
    async def test_originals_left_unread_reach_a_later_session(
        self, thread_store: Any, kind: str
    ) -> None:
        """Six requests, each its own Session and run; two extractions see all 36 results
        once, with their original content."""
        script = Script([[2, 2, 2]] * 6)
        extractor = Recording([3, 0])
        memory = SessionMemory(
            extractor, store=thread_store, min_tokens=0, min_tool_calls=0, min_turns=3
        )
        agent = Agent(model=script, tools=[script.read_tool()], middleware=[memory, *stack(kind)])
        committed: list[ToolResult] = []
        for index in range(6):
            config = RunConfig(thread_id="x", max_model_calls=50)
            async with Session(agent, config=config, store=thread_store) as session:
                witness = session.ctx.conversation.tap()
                await session.run(f"request {index}")
                committed += [m for m in witness.messages if isinstance(m, ToolResult)]
        assert len(extractor.jobs) >= 2 and len(committed) == 36
        assert extractor.tool_results() == Counter((m.tool_call_id, m.text) for m in committed)

    async def test_originals_are_kept_over_several_session_boundaries(
        self, thread_store: Any
    ) -> None:
        """Extraction every fourth request: a result cleared in the first session is kept
        through three session boundaries and read once, as committed."""
        extractor, committed = await run_all(
            [[2, 2]] * 4, "microcompact", [0], thread_store, sessions=[1, 2, 3], min_turns=4
        )
        assert extractor.jobs and len(committed) == 16  # one, or more queued behind it
        assert extractor.tool_results() == Counter((m.tool_call_id, m.text) for m in committed)


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


class TestStoredUnreadState:
    """The unread part of the layer's thread state reads back, and a malformed one is a
    clear error naming the entry."""

    async def test_round_trip_through_json(self) -> None:
        """An entry per message: a fingerprint, or the document of a displaced one."""
        conversation = Conversation()
        unread = Unread()
        unread.open(conversation, 0)
        kept, cleared = UserMessage("kept"), UserMessage("original text")
        await conversation.append(kept)
        await conversation.append(cleared)
        conversation.replace([kept], emit_new=False)  # the store holds `kept` only
        assert unread.to_json() is None  # no record before the first snapshot
        unread.snapshot(conversation)
        data = unread.to_json()
        assert data is not None and data["upto"] == 1
        assert [list(entry) for entry in data["entries"]] == [["seen"], ["message"]]
        again = Unread.from_json(data)
        assert again.to_json() == data
        later = UserMessage("committed after the snapshot")
        await conversation.append(later)  # a run a crash cut short
        again.open(conversation, 0)
        assert again.messages == (kept, cleared, later)

    async def test_after_a_rewrite_past_the_mark_the_record_still_finds_the_rest(
        self,
    ) -> None:
        """When the history was rewritten after the snapshot (a crash before the next run
        end took the newer record with it), the recorded messages still in it, and what
        follows the newest of them, are read; one the rewrite took out went with the
        crash (before this record, every such one did)."""
        conversation = Conversation()
        unread = Unread()
        unread.open(conversation, 0)
        first, second = UserMessage("first"), UserMessage("second")
        await conversation.append(first)
        await conversation.append(second)
        unread.snapshot(conversation)
        record = unread.to_json()
        later = UserMessage("later")
        conversation.replace([UserMessage("[summary of first]"), second], emit_new=False)
        await conversation.append(later)
        again = Unread.from_json(record)
        again.open(conversation, 0)
        assert [m.text for m in again.messages] == ["second", "later"]

    async def test_the_durable_form_is_bounded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """At most the newest KEEP_MESSAGES entries, in at most KEEP_BYTES."""
        monkeypatch.setattr(_unread, "KEEP_MESSAGES", 3)
        conversation = Conversation()
        unread = Unread()
        unread.open(conversation, 0)
        results = [UserMessage(f"output {i} " * 20) for i in range(5)]
        for result in results:
            await conversation.append(result)
        conversation.replace([], emit_new=False)  # every one displaced
        unread.snapshot(conversation)
        data = unread.to_json()
        assert data is not None and len(data["entries"]) == 3
        restored = Unread.from_json(data).restored
        assert restored is not None and restored[0] == results[2:]
        document = len(data["entries"][0]["message"])
        monkeypatch.setattr(_unread, "KEEP_BYTES", document * 2 + 1)
        unread.snapshot(conversation)
        restored = Unread.from_json(unread.to_json()).restored
        assert restored is not None and restored[0] == results[3:]

    @pytest.mark.parametrize(
        ("data", "problem"),
        [
            ("x", "unread must be an object with entries, upto and last"),
            ({"entries": [], "upto": -1, "last": None}, r"unread\.upto must be"),
            ({"entries": [], "upto": 0, "last": 3}, r"unread\.last must be"),
            ({"entries": {}, "upto": 0, "last": None}, r"unread\.entries must be a list"),
            ({"entries": [{"seen": 1}], "upto": 0, "last": None}, r"entries\[0\] must be"),
            ({"entries": [{"other": "x"}], "upto": 0, "last": None}, r"entries\[0\] must"),
            (
                {"entries": [{"seen": "a", "message": "b"}], "upto": 0, "last": None},
                r"entries\[0\] must be",
            ),
            (
                {"entries": [{"message": "{not json"}], "upto": 0, "last": None},
                r"entries\[0\]\.message",
            ),
        ],
    )
    def test_a_malformed_state_names_the_entry(self, data: Any, problem: str) -> None:
        """Not a list, a bad entry, a document that does not decode: named."""
        with pytest.raises((TypeError, ValueError), match=problem):
            Unread.from_json(data)

    def test_a_state_without_unread_reads_the_history_after_its_mark(self) -> None:
        """A state written before unread messages were kept: the backlog is the history."""
        conversation = Conversation([UserMessage("a"), UserMessage("b")])
        unread = Unread.from_json(None)
        assert unread.to_json() is None
        unread.open(conversation, 1)
        assert [m.text for m in unread.messages] == ["b"]

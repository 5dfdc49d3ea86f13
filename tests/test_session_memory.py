"""SessionMemory: counting, background extraction, fault injection, injection into later
calls and sessions, the extractors, and many sessions on one SQLite file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    AssistantMessage,
    ConfigError,
    Event,
    EventSink,
    Interrupt,
    Interrupted,
    Layer,
    MemoryStore,
    Message,
    ModelRequest,
    ModelResponse,
    RunCancelled,
    RunConfig,
    RunContext,
    Session,
    SqliteStore,
    ToolResult,
    Usage,
    UserMessage,
)
from tinyctx.chain import has_hook
from tinyctx.middleware import ModelExtractor, RuleExtractor, SessionMemory
from tinyctx.middleware.extractors import (
    ExtractionJob,
    bullet_key,
    dedupe_bullets,
    parse_bullets,
    render_transcript,
)
from tinyctx.middleware.session_memory import (
    EXTRACTION_TAG,
    SECTION_HEADER,
    Counts,
    MemoryCounters,
    MemoryExtractionCompleted,
    MemoryExtractionFailed,
    MemoryExtractionSkipped,
    MemoryExtractionStarted,
)
from tinyctx.stores import Note, Store
from tinyctx.tasks import BackgroundTasks
from tinyctx.testing import (
    HANG,
    FakeTool,
    ScriptedModel,
    assert_events_form_tree,
    call,
    capture_events,
    reply,
)
from tinyctx.testing.strategies import histories
from tinyctx.tokens import HeuristicCounter

# ---------------------------------------------------------------------------------------
# helpers


def memory(store: Store | str | None = None, **options: Any) -> SessionMemory:
    """A layer that extracts after every run unless told otherwise."""
    settings: dict[str, Any] = {"min_tokens": 0, "min_tool_calls": 0, "min_turns": 1}
    settings.update(options)
    return SessionMemory(store=store if store is not None else MemoryStore(), **settings)


def background(session: Session[Any]) -> BackgroundTasks:
    tasks = session.ctx.background
    assert tasks is not None
    return tasks


async def settle(session: Session[Any]) -> None:
    """Wait until the session's background extractions are done."""
    await background(session).wait_idle()


def of_kind(events: Sequence[Event], kind: str) -> list[Any]:
    return [e for e in events if e.kind == kind]


async def notes_of(store: Store, thread: str) -> list[str]:
    return [n.text for n in await store.notes(f"session_memory:thread:{thread}")]


class Gate:
    """An extractor that waits for ``release`` (or forever), then answers or raises."""

    name = "gate"

    def __init__(self, bullets: Sequence[str] = ("gated note",), error: Exception | None = None):
        self.bullets = list(bullets)
        self.error = error
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.jobs: list[ExtractionJob] = []
        self.contexts: list[RunContext[Any]] = []
        self.cancelled = False

    async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
        self.jobs.append(job)
        self.contexts.append(ctx)
        self.entered.set()
        try:
            await self.release.wait()
        except BaseException:
            self.cancelled = True
            raise
        if self.error is not None:
            raise self.error
        return self.bullets


class Failing:
    """Raises ``errors`` in turn, then behaves like a RuleExtractor."""

    name = "failing"

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.jobs: list[ExtractionJob] = []

    async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> Sequence[str]:
        self.jobs.append(job)
        await anyio.lowlevel.checkpoint()
        if self.errors:
            raise self.errors.pop(0)
        return await RuleExtractor().extract(job, ctx)


# ---------------------------------------------------------------------------------------
# configuration


class TestConfiguration:
    """Bad settings fail at construction, naming the field and what is allowed."""

    @pytest.mark.parametrize(
        ("options", "field"),
        [
            ({"min_tokens": -1}, "SessionMemory.min_tokens"),
            ({"min_tool_calls": "8"}, "SessionMemory.min_tool_calls"),
            ({"min_turns": True}, "SessionMemory.min_turns"),
            ({"store": ""}, "SessionMemory.store"),
            ({"store": object()}, "SessionMemory.store"),
            ({"inject": "yes"}, "SessionMemory.inject"),
            ({"enabled": 1}, "SessionMemory.enabled"),
            ({"inject_max_tokens": 0}, "SessionMemory.inject_max_tokens"),
            ({"scan_notes": -5}, "SessionMemory.scan_notes"),
            ({"scope": "global"}, "SessionMemory.scope"),
            ({"namespace": "fixed"}, "SessionMemory.namespace"),
            ({"prefix": ""}, "SessionMemory.prefix"),
            ({"counter": object()}, "SessionMemory.counter"),
            ({"extractor": object()}, "SessionMemory.extractor"),
        ],
    )
    def test_invalid_option_is_a_config_error(self, options: dict[str, Any], field: str) -> None:
        with pytest.raises(ConfigError) as info:
            SessionMemory(**options)
        assert str(info.value).startswith(f"{field}=")
        assert "allowed" in str(info.value)

    def test_defaults(self) -> None:
        layer = SessionMemory()
        assert (
            layer.thresholds.min_tokens,
            layer.thresholds.min_tool_calls,
            layer.thresholds.min_turns,
        ) == (4000, 8, 4)
        assert isinstance(layer.extractor, RuleExtractor)
        assert (layer.store, layer.inject, layer.enabled, layer.scope) == (
            "memory",
            True,
            True,
            "thread",
        )

    @pytest.mark.parametrize(
        ("make", "field"),
        [
            (lambda: RuleExtractor(max_bullets=0), "RuleExtractor.max_bullets"),
            (lambda: ModelExtractor(ScriptedModel(), max_bullets=-1), "ModelExtractor.max_bullets"),
            (lambda: ModelExtractor("model"), "ModelExtractor.model"),  # type: ignore[arg-type]
            (lambda: ModelExtractor(ScriptedModel(), prompt="no slot"), "ModelExtractor.prompt"),
        ],
    )
    def test_invalid_extractor_option(self, make: Any, field: str) -> None:
        with pytest.raises(ConfigError, match=rf"^{field}="):
            make()


# ---------------------------------------------------------------------------------------
# counting


class TestCounting:
    """Usage after each model response, tool calls after each tool call, a turn per run."""

    async def test_usage_tool_calls_and_turns_are_counted(self) -> None:
        layer = memory(min_turns=99)
        search = FakeTool("search", returns="found it")
        model = ScriptedModel(
            [
                reply("", call("search"), call("search"), usage=(100, 10)),
                reply("done", usage=(300, 20)),
            ]
        )
        async with Session(Agent(model=model, tools=[search.tool], middleware=[layer])) as s:
            await s.run("go")
            counters = layer.counters(s.ctx)
            assert counters.totals == Counts(tokens=320, tool_calls=2, turns=1)
            assert counters.deltas() == counters.totals
        async with Session(Agent(model=ScriptedModel(["x"]), middleware=[layer])) as other:
            assert layer.counters(other.ctx).totals == Counts()  # per session

    async def test_tokens_count_context_growth_and_never_go_down(self) -> None:
        layer = memory(min_turns=99)
        sizes = [(1000, 0), (200, 0), (500, 0), (500, 50)]
        model = ScriptedModel([reply("a", usage=u) for u in sizes])
        async with Session(Agent(model=model, middleware=[layer])) as s:
            seen = []
            for _ in sizes:
                await s.run("next")
                seen.append(layer.counters(s.ctx).totals.tokens)
        # 1000, a compaction to 200 adds nothing, then +300, then +50
        assert seen == [1000, 1000, 1300, 1350]

    async def test_failed_tool_calls_count_and_responses_without_usage_do_not(self) -> None:
        layer = memory(min_turns=99)
        broken = FakeTool("broken", returns=RuntimeError("nope"))
        model = ScriptedModel([reply("", call("broken")), reply("ok")])
        async with Session(Agent(model=model, tools=[broken.tool], middleware=[layer])) as s:
            await s.run("go")
            assert layer.counters(s.ctx).totals == Counts(tokens=0, tool_calls=1, turns=1)

    async def test_disabled_memory_does_no_bookkeeping_and_never_extracts(self) -> None:
        store = MemoryStore()
        layer = memory(store, enabled=False, min_turns=0)
        tool = FakeTool("search")
        model = ScriptedModel(
            [reply("", call("search"), usage=(5000, 5)), reply("I prefer nothing", usage=(9000, 9))]
        )
        with capture_events() as events:
            async with Session(Agent(model=model, tools=[tool.tool], middleware=[layer])) as s:
                await s.run("I always want this remembered. Please.")
                counters = layer.counters(s.ctx)
                assert counters.totals == Counts()
                assert not counters.should_extract()
        kinds = {e.kind for e in events if e.kind.startswith("session_memory.")}
        assert kinds <= {"session_memory.loaded"}  # injection is inject's business
        assert await notes_of(store, s.ctx.thread_id) == []

    async def test_disable_and_enable_at_run_time(self) -> None:
        layer = memory(min_turns=99)
        usages = [(100, 0), (5000, 0), (5100, 0), (5200, 0)]
        model = ScriptedModel([reply("a", usage=u) for u in usages])
        with capture_events() as events:
            async with Session(Agent(model=model, middleware=[layer])) as s:
                await s.run("1")
                layer.disable(s.ctx)
                layer.disable(s.ctx)  # idempotent: one event
                await s.run("2")
                assert layer.counters(s.ctx).totals == Counts(tokens=100, tool_calls=0, turns=1)
                layer.enable(s.ctx)
                await s.run("3")  # a new baseline: growth while disabled is not counted
                await s.run("4")
                assert layer.counters(s.ctx).totals == Counts(tokens=200, tool_calls=0, turns=3)
        toggles = [e.enabled for e in of_kind(events, "session_memory.toggled")]
        assert toggles == [False, True]


# ---------------------------------------------------------------------------------------
# triggering


class TestTriggering:
    """Extraction starts in the background when every threshold is reached, never before."""

    async def test_skipped_event_names_the_unmet_thresholds_at_debug_level(self) -> None:
        layer = SessionMemory(store=MemoryStore())
        with capture_events() as events:
            async with Session(
                Agent(model=ScriptedModel([reply("a", usage=(100, 10))]), middleware=[layer])
            ) as s:
                await s.run("hi")
        (skipped,) = of_kind(events, "session_memory.skipped")
        assert isinstance(skipped, MemoryExtractionSkipped)
        assert skipped.level == "debug"
        assert (skipped.reason, skipped.unmet) == ("thresholds", ("tokens", "tool_calls", "turns"))
        assert skipped.detail == "tokens 110/4000, tool_calls 0/8, turns 1/4"

    async def test_extraction_starts_only_when_all_three_are_reached(self) -> None:
        store = MemoryStore()
        layer = SessionMemory(store=store, min_tokens=100, min_tool_calls=2, min_turns=2)
        tool = FakeTool("search", returns="Paris is the capital")
        model = ScriptedModel(
            [
                reply("", call("search"), call("search"), usage=(150, 10)),
                reply("ok", usage=(200, 5)),
                reply("fine", usage=(220, 5)),
            ]
        )
        agent = Agent(model=model, tools=[tool.tool], middleware=[layer])
        with capture_events() as events:
            async with Session(agent) as s:
                await s.run("I prefer metric units.")
                assert of_kind(events, "session_memory.started") == []
                (first,) = of_kind(events, "session_memory.skipped")
                assert first.unmet == ("turns",)
                await s.run("thanks")
                (started,) = of_kind(events, "session_memory.started")
                assert (started.tokens, started.tool_calls, started.turns) == (225, 2, 2)
                assert started.level == "info"
        assert await notes_of(store, s.ctx.thread_id) == [
            "User preference: I prefer metric units.",
            "From search: Paris is the capital",
        ]

    async def test_the_run_returns_without_waiting_for_the_extraction(self) -> None:
        store = MemoryStore()
        gate = Gate(["a note"])
        layer = memory(store, extractor=gate)
        async with Session(Agent(model=ScriptedModel(["answer"]), middleware=[layer])) as s:
            result = await s.run("hello")
            assert result.final_text == "answer"
            counters = layer.counters(s.ctx)
            assert counters.in_progress
            await gate.entered.wait()
            assert await notes_of(store, s.ctx.thread_id) == []
            gate.release.set()
            await settle(s)
            assert not counters.in_progress
            assert counters.extractions == 1
        assert await notes_of(store, s.ctx.thread_id) == ["a note"]

    async def test_an_extraction_in_progress_queues_the_next_one(self) -> None:
        """A trigger while one runs is queued and extracted right after it, once."""
        gate = Gate(["first"])
        layer = memory(extractor=gate)
        model = ScriptedModel(["a", "b", "c", "d"])
        with capture_events() as events:
            async with Session(Agent(model=model, middleware=[layer])) as s:
                await s.run("1")
                await s.run("2")
                await s.run("3")  # two triggers while one runs: one queued extraction
                queued = of_kind(events, "session_memory.queued")
                assert [e.behind for e in queued] == [1, 1]
                assert of_kind(events, "session_memory.skipped") == []
                assert layer.pending(s.ctx)
                gate.release.set()
                await settle(s)
                assert not layer.pending(s.ctx)
                assert [len(job.new_messages) for job in gate.jobs] == [2, 4]
                await s.run("4")
                await settle(s)
        assert [e.extraction for e in of_kind(events, "session_memory.started")] == [1, 2, 3]
        assert len(gate.jobs) == 3

    async def test_the_last_facts_of_a_session_reach_memory(self) -> None:
        """Issue #15 D2: "dark mode" said while "tea" is being extracted is stored too."""
        store = MemoryStore()

        class Slow(RuleExtractor):
            def __init__(self) -> None:
                super().__init__()
                self.release = anyio.Event()

            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
                await self.release.wait()  # a model takes a moment
                return await super().extract(job, ctx)

        slow = Slow()
        layer = memory(store, extractor=slow)
        async with Session(Agent(model=ScriptedModel(["ok", "ok"]), middleware=[layer])) as s:
            await s.run("I prefer tea.")
            await s.run("I prefer dark mode.")
            slow.release.set()
            # leaving the session flushes the queue within the grace period
        assert await notes_of(store, s.ctx.thread_id) == [
            "User preference: I prefer tea.",
            "User preference: I prefer dark mode.",
        ]

    async def test_a_queue_cut_off_by_the_grace_period_stays_pending(self) -> None:
        """Cancelled at exit, the queued work is reported pending (for the next session)."""
        gate = Gate(["never"])
        layer = memory(extractor=gate)
        with capture_events() as events:
            async with Session(
                Agent(model=ScriptedModel(["a", "b"]), middleware=[layer]), grace_period=0.01
            ) as s:
                await s.run("1")
                await s.run("2")
        assert layer.pending(s.ctx)
        (failed,) = of_kind(events, "session_memory.failed")
        assert failed.cancelled

    async def test_a_failed_run_ticks_a_turn_but_starts_nothing(self) -> None:
        layer = memory()
        model = ScriptedModel([ValueError("provider down"), "ok"])
        with capture_events() as events:
            async with Session(Agent(model=model, middleware=[layer])) as s:
                with pytest.raises(ValueError):
                    await s.run("1")
                assert layer.counters(s.ctx).totals.turns == 1
                (skipped,) = of_kind(events, "session_memory.skipped")
                assert (skipped.reason, skipped.detail) == (
                    "run_failed",
                    "ValueError: provider down",
                )
                await s.run("2")
                await settle(s)
        assert len(of_kind(events, "session_memory.completed")) == 1

    async def test_an_interrupted_run_ticks_once_when_it_resumes(self) -> None:
        layer = memory(min_turns=99)
        tool = FakeTool("approve", control=Interrupt("review", "approve?"))
        model = ScriptedModel([reply("", call("approve")), "done"])
        async with Session(Agent(model=model, tools=[tool.tool], middleware=[layer])) as s:
            with pytest.raises(Interrupted) as info:
                await s.run("go")
            assert layer.counters(s.ctx).totals.turns == 0
            await s.resume(info.value.checkpoint)
            assert layer.counters(s.ctx).totals.turns == 1


# ---------------------------------------------------------------------------------------
# no lost updates


class TestNoLostUpdates:
    """Success moves the marks to the counters at the start: growth during it stays."""

    async def test_updates_during_an_extraction_stay_counted(self) -> None:
        gate = Gate(["n1"])
        layer = memory(extractor=gate)
        tool = FakeTool("search", returns="result line")
        model = ScriptedModel(
            [
                reply("first", usage=(100, 10)),
                reply("", call("search"), usage=(200, 10)),
                reply("second", usage=(260, 10)),
                reply("third", usage=(300, 10)),
            ]
        )
        async with Session(Agent(model=model, tools=[tool.tool], middleware=[layer])) as s:
            await s.run("one")
            counters = layer.counters(s.ctx)
            ticket = counters.ticket
            assert ticket is not None
            assert ticket.at == Counts(tokens=110, tool_calls=0, turns=1)
            messages_at_start = len(s.conversation_messages)
            await s.run("two")  # arrives while the extraction runs
            # not complete before the work ends: nothing moved yet
            assert (counters.marks, counters.extractions, counters.in_progress) == (
                Counts(),
                0,
                True,
            )
            gate.release.set()
            await settle(s)
            # "two" triggered while the first ran: queued, it ran right after, with the
            # growth that arrived during the first one
            assert counters.extractions == 2
            assert counters.marks == Counts(tokens=270, tool_calls=1, turns=2)
            assert counters.deltas() == Counts()
            gate.bullets = ["n2"]
            await s.run("three")
            await settle(s)
        # the queued extraction read exactly what the first did not
        assert [gate.jobs[0].since, gate.jobs[1].since] == [0, messages_at_start]
        assert [m.text for m in gate.jobs[1].new_messages][:1] == ["two"]
        assert gate.jobs[2].since == len(gate.jobs[1].messages)

    async def test_a_rewritten_history_is_read_again_from_the_start(self) -> None:
        gate = Gate(["n"])
        gate.release.set()
        layer = memory(extractor=gate)
        async with Session(Agent(model=ScriptedModel(["a", "b"]), middleware=[layer])) as s:
            await s.run("one")
            await settle(s)
            # a compaction replaced the history with new message objects
            s.ctx.conversation.replace([UserMessage("summary of one")], emit_new=False)
            await s.run("two")
            await settle(s)
        assert gate.jobs[1].since == 0


# ---------------------------------------------------------------------------------------
# fault injection


class TestFaultInjection:
    """A raising, hanging or slow extractor: the run never waits, the deltas stay, the
    store is unchanged, and the next turn retries."""

    async def test_a_raising_extractor_keeps_the_deltas_and_the_next_turn_retries(self) -> None:
        store = MemoryStore()
        extractor = Failing(RuntimeError("model down"))
        layer = memory(store, extractor=extractor)
        model = ScriptedModel([reply("a", usage=(100, 0)), reply("b", usage=(150, 0))])
        with capture_events() as events:
            async with Session(Agent(model=model, middleware=[layer])) as s:
                await s.run("I prefer tea.")
                await settle(s)
                counters = layer.counters(s.ctx)
                assert (counters.in_progress, counters.failures, counters.extractions) == (
                    False,
                    1,
                    0,
                )
                assert counters.marks == Counts()
                assert counters.deltas() == Counts(tokens=100, tool_calls=0, turns=1)
                assert await notes_of(store, s.ctx.thread_id) == []
                await s.run("I never drink coffee.")
                await settle(s)
                assert counters.extractions == 1
        (failed,) = of_kind(events, "session_memory.failed")
        assert isinstance(failed, MemoryExtractionFailed)
        assert (failed.error, failed.cancelled, failed.level) == (
            "RuntimeError: model down",
            False,
            "warning",
        )
        assert of_kind(events, "background.failed") == []  # reported once, as what it is
        # the retry read everything the failed attempt had not stored
        assert extractor.jobs[1].since == 0
        assert await notes_of(store, s.ctx.thread_id) == [
            "User preference: I prefer tea.",
            "User preference: I never drink coffee.",
        ]

    @pytest.mark.parametrize(
        "returned",
        ["I prefer tea.", {"a note": 1, "another": 2}, 42, ["ok", 3]],
        ids=["str", "dict", "int", "mixed"],
    )
    async def test_a_bad_extractor_return_is_a_clear_error_and_writes_nothing(
        self, returned: object
    ) -> None:
        """An extractor must return a sequence of str: anything else fails, nothing stored."""

        class Bad:
            name = "bad"

            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> Any:
                await anyio.lowlevel.checkpoint()
                return returned

        store = MemoryStore()
        layer = memory(store, extractor=Bad())
        model = ScriptedModel([reply("a", usage=(100, 0))])
        with capture_events() as events:
            async with Session(Agent(model=model, middleware=[layer])) as s:
                await s.run("I prefer tea.")
                await settle(s)
                counters = layer.counters(s.ctx)
                assert (counters.failures, counters.extractions) == (1, 0)
        assert await notes_of(store, s.ctx.thread_id) == []
        (failed,) = of_kind(events, "session_memory.failed")
        assert "Bad.extract must return a list or tuple of str" in failed.error

    async def test_a_lone_surrogate_never_poisons_the_threads_memory(self, tmp_path: Path) -> None:
        """'caf\\udce9' from the user: later facts are still stored on SQLite."""
        async with SqliteStore(tmp_path / "memory.db") as store:
            layer = memory(store)
            model = ScriptedModel(["a", "b", "c"])
            with capture_events() as events:
                async with Session(Agent(model=model, middleware=[layer]), thread_id="t") as s:
                    await s.run("I prefer caf\udce9 au lait.")
                    await settle(s)
                    await s.run("I prefer dark mode.")
                    await settle(s)
                    await s.run("I always use tabs.")
                    await settle(s)
            assert of_kind(events, "session_memory.failed") == []
            assert await notes_of(store, "t") == [
                "User preference: I prefer caf\ufffd au lait.",
                "User preference: I prefer dark mode.",
                "User preference: I always use tabs.",
            ]

    async def test_a_hanging_extractor_is_cancelled_when_the_session_ends(self) -> None:
        store = MemoryStore()
        gate = Gate(["never"])
        layer = memory(store, extractor=gate)
        model = ScriptedModel([reply("a", usage=(80, 5))])
        with capture_events() as events, anyio.fail_after(10):
            async with Session(Agent(model=model, middleware=[layer]), grace_period=0.05) as s:
                result = await s.run("hello")
                assert result.final_text == "a"
                await gate.entered.wait()
                counters = layer.counters(s.ctx)
        assert gate.cancelled
        (failed,) = of_kind(events, "session_memory.failed")
        assert failed.cancelled is True
        assert "cancelled" in failed.error
        assert (counters.in_progress, counters.failures) == (False, 1)
        assert counters.deltas() == Counts(tokens=85, tool_calls=0, turns=1)
        assert await notes_of(store, s.ctx.thread_id) == []

    async def test_a_slow_extractor_finishes_within_the_grace_period(self) -> None:
        store = MemoryStore()

        class Slow:
            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
                await anyio.sleep(0.05)
                return ["slow but sure"]

        layer = memory(store, extractor=Slow())
        async with Session(Agent(model=ScriptedModel(["a"]), middleware=[layer])) as s:
            await s.run("hello")
            assert layer.counters(s.ctx).in_progress  # the run did not wait
        assert layer.counters(s.ctx).extractions == 1
        assert await notes_of(store, s.ctx.thread_id) == ["slow but sure"]

    async def test_a_failing_batch_write_leaves_the_store_unchanged(self) -> None:
        class BrokenBatches(MemoryStore):
            async def append_notes(self, namespace: str, texts: Any, **kw: Any) -> list[Note]:
                raise OSError("disk full")

        store = BrokenBatches()
        layer = memory(store)
        async with Session(Agent(model=ScriptedModel(["a"]), middleware=[layer])) as s:
            await s.run("I prefer tea.")
            await settle(s)
            counters = layer.counters(s.ctx)
            assert (counters.failures, counters.deltas().turns) == (1, 1)
        assert await notes_of(store, s.ctx.thread_id) == []

    async def test_notes_already_stored_are_not_written_again(self) -> None:
        store = MemoryStore()
        await store.append_note("session_memory:thread:t", "Known fact.")
        gate = Gate(["known FACT", "New fact", "new fact!"])
        gate.release.set()
        layer = memory(store, extractor=gate)
        with capture_events() as events:
            async with Session(
                Agent(model=ScriptedModel(["a"]), middleware=[layer]), thread_id="t"
            ) as s:
                await s.run("x")
        (completed,) = of_kind(events, "session_memory.completed")
        assert (completed.proposed, completed.duplicates, completed.notes_written) == (3, 2, 1)
        assert gate.jobs[0].existing_texts == ("Known fact.",)
        assert await notes_of(store, "t") == ["Known fact.", "New fact"]

    async def test_an_extractor_returning_non_strings_fails_cleanly(self) -> None:
        class Wrong:
            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> Any:
                return ["ok", 42]

        store = MemoryStore()
        layer = memory(store, extractor=Wrong())
        with capture_events() as events:
            async with Session(Agent(model=ScriptedModel(["a"]), middleware=[layer])) as s:
                await s.run("x")
        (failed,) = of_kind(events, "session_memory.failed")
        assert failed.error.startswith(
            "TypeError: Wrong.extract must return a list or tuple of str, but item 1 is int"
        )
        assert await notes_of(store, s.ctx.thread_id) == []

    async def test_no_room_for_a_child_context_starts_nothing_and_says_why(self) -> None:
        layer = memory()
        agent = Agent(model=ScriptedModel(["a"]), middleware=[layer])
        with capture_events() as events:
            async with Session(agent, config=RunConfig(max_depth=1)) as s:
                result = await s.run("I prefer tea.")
                counters = layer.counters(s.ctx)
        assert result.final_text == "a"
        assert (counters.in_progress, counters.started, counters.deltas().turns) == (False, 0, 1)
        (failed,) = of_kind(events, "session_memory.failed")
        assert failed.error.startswith("DepthLimitExceeded: nesting depth 2 exceeds max_depth=1")

    async def test_cancelling_the_session_cancels_a_model_extraction(self) -> None:
        entered = anyio.Event()

        async def hang(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            entered.set()
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        extractor_model = ScriptedModel([hang])
        layer = memory(extractor=ModelExtractor(extractor_model))
        with capture_events() as events, anyio.fail_after(10):
            async with Session(Agent(model=ScriptedModel(["a"]), middleware=[layer])) as s:
                await s.run("I prefer tea.")
                await entered.wait()
                s.cancel("user left")
                await settle(s)
        (failed,) = of_kind(events, "session_memory.failed")
        assert failed.cancelled is True
        assert failed.error.startswith("RunCancelled")
        assert layer.counters(s.ctx).failures == 1

    async def test_a_subscriber_raising_on_completion_does_not_poison_the_state(self) -> None:
        store = MemoryStore()
        raised: list[str] = []

        def explode_once(event: Event) -> None:
            if event.kind == "session_memory.completed" and not raised:
                raised.append(event.kind)
                raise RuntimeError("subscriber bug")

        sink = EventSink(logger=None, subscribers=[explode_once], raise_errors=True)
        layer = memory(store)
        model = ScriptedModel(["a", "b"])
        async with Session(Agent(model=model, middleware=[layer]), events=sink) as s:
            await s.run("I prefer tea.")
            await settle(s)
            counters = layer.counters(s.ctx)
            # the completion was recorded before the event went out
            assert (counters.in_progress, counters.extractions) == (False, 1)
            await s.run("I prefer green tea.")
            await settle(s)
            assert counters.extractions == 2
        assert raised == ["session_memory.completed"]
        assert await notes_of(store, s.ctx.thread_id) == [
            "User preference: I prefer tea.",
            "User preference: I prefer green tea.",
        ]


# ---------------------------------------------------------------------------------------
# the extraction's context


class TestExtractionContext:
    """The extractor runs in a child of the run: linked, tagged, with its own conversation."""

    async def test_extraction_runs_under_the_runs_filtered_context_view(self) -> None:
        """A field the run's view excluded never reaches the extractor's RunConfig."""
        from tinyctx.middleware import ContextPolicy, Inherit
        from tinyctx.middleware.context_view import VIEW_GLOBAL_KEY, ContextView

        secret = "sk-very-secret"
        seen: list[ModelRequest] = []

        async def extractor_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            seen.append(request)
            return ModelResponse(AssistantMessage("- a note"))

        # an extractor built as an agent onion with a pass-all Inherit()
        onion = Agent(model=extractor_model, middleware=[Inherit()]).model_onion
        gate = Gate()
        gate.release.set()

        class Both:
            name = "both"

            async def extract(self, job: ExtractionJob, ctx: RunContext[Any]) -> list[str]:
                await gate.extract(job, ctx)
                return await ModelExtractor(onion).extract(job, ctx)

        layer = memory(extractor=Both())
        view = Inherit(view=ContextPolicy(exclude=("extra.api_key",)))
        config = RunConfig(configurable={VIEW_GLOBAL_KEY: {"api_key": secret, "team": "core"}})
        agent = Agent(model=ScriptedModel(["a"]), middleware=[view, layer])
        async with Session(agent, config=config) as s:
            await s.run("I prefer tea.")
            await settle(s)
        (ctx,) = gate.contexts
        assert secret not in repr(ctx.config)
        extracted_view = ContextView.of(ctx)
        assert extracted_view is not None and extracted_view.extra == {"team": "core"}
        (request,) = seen
        assert secret not in (request.system_prompt or "") and "core" in (
            request.system_prompt or ""
        )

    async def test_extractor_gets_a_derived_child_of_the_run(self) -> None:
        gate = Gate()
        gate.release.set()
        layer = memory(extractor=gate)
        async with Session(Agent(model=ScriptedModel(["a"]), middleware=[layer])) as s:
            result = await s.run("hi")
            await settle(s)
        (ctx,) = gate.contexts
        assert ctx.parent_run_id == result.run_id
        assert EXTRACTION_TAG in ctx.tags
        assert ctx.conversation is not s.ctx.conversation
        assert ctx.conversation.messages == ()
        assert ctx.thread_id == s.ctx.thread_id

    async def test_model_calls_of_the_extraction_are_neither_counted_nor_injected(self) -> None:
        store = MemoryStore()
        await store.append_note("session_memory:thread:t", "old note")
        answers = ScriptedModel(
            [reply("main", usage=(100, 0)), reply("- Fresh fact", usage=(9000, 50))]
        )
        holder: dict[str, Agent] = {}

        async def through_the_onion(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            return await holder["agent"].model_onion(request, ctx)

        layer = memory(store, extractor=ModelExtractor(through_the_onion))
        holder["agent"] = Agent(model=answers, middleware=[layer], system_prompt="sys")
        async with Session(holder["agent"], thread_id="t") as s:
            await s.run("hello")
            await settle(s)
            assert layer.counters(s.ctx).totals.tokens == 100
            usage_total = s.ctx.usage.total()
        main_request, extraction_request = answers.requests
        assert "old note" in (main_request.system_prompt or "")
        assert SECTION_HEADER not in (extraction_request.system_prompt or "")
        # the extraction's usage is accounted to the tree
        assert usage_total == Usage(9100, 50)
        assert await notes_of(store, "t") == ["old note", "Fresh fact"]


# ---------------------------------------------------------------------------------------
# injection and later sessions


class TestInjection:
    """Stored notes are offered to later calls, newest first, within the size cap."""

    async def test_notes_from_session_1_reach_a_request_of_session_2_within_the_cap(
        self, tmp_path: Path
    ) -> None:
        counter = HeuristicCounter()
        expected = "\n".join(
            [
                SECTION_HEADER,
                "- Decision: We decided to use Postgres because it has JSONB.",
                "- User preference: I prefer short answers.",
            ]
        )
        cap = counter.count_text(expected)  # room for exactly these two notes
        async with SqliteStore(tmp_path / "memory.db") as store:
            layer = memory(store, inject_max_tokens=cap, counter=counter)
            first = ScriptedModel(
                [
                    reply("Noted.", usage=(50, 5)),
                    reply("We decided to use Postgres because it has JSONB.", usage=(90, 15)),
                ]
            )
            async with Session(Agent(model=first, middleware=[layer]), thread_id="t1") as s1:
                await s1.run("I prefer short answers.")
                await settle(s1)  # else the second run's extraction is skipped: in progress
                await s1.run("Which database?")
            second = ScriptedModel(["Short answer."])
            agent2 = Agent(model=second, middleware=[layer], system_prompt="You are helpful.")
            async with Session(agent2, thread_id="t1") as s2:
                await s2.run("Hi again")
            other = ScriptedModel(["Hello."])
            agent3 = Agent(model=other, middleware=[layer], system_prompt="You are helpful.")
            async with Session(agent3, thread_id="someone-else") as s3:
                await s3.run("Hi")
        prompt = second.requests[0].system_prompt
        assert prompt is not None and prompt.startswith("You are helpful.\n\n")
        section = prompt.removeprefix("You are helpful.\n\n")
        assert section == expected
        assert counter.count_text(section) <= cap
        # the injection is for the call only
        assert all(SECTION_HEADER not in m.text for m in s2.conversation_messages)
        assert second.requests[0].messages == (UserMessage("Hi again"),)
        # another thread sees nothing
        assert other.requests[0].system_prompt == "You are helpful."
        assert s3.ctx.thread_id == "someone-else"

    async def test_the_cap_keeps_the_newest_notes(self) -> None:
        store = MemoryStore()
        namespace = "session_memory:thread:t"
        await store.append_notes(namespace, [f"note number {i} " + "x" * 40 for i in range(50)])
        counter = HeuristicCounter()
        layer = memory(store, inject_max_tokens=80, counter=counter, enabled=False)
        model = ScriptedModel(["ok"])
        with capture_events() as events:
            async with Session(Agent(model=model, middleware=[layer]), thread_id="t") as s:
                await s.run("hi")
        prompt = model.requests[0].system_prompt or ""
        assert counter.count_text(prompt) <= 80
        assert "note number 49 " in prompt and "note number 0 " not in prompt
        (loaded,) = of_kind(events, "session_memory.loaded")
        assert loaded.notes == 50
        assert 0 < loaded.injected < 50
        assert loaded.tokens == counter.count_text(prompt)

    async def test_user_scope_reaches_new_threads_of_the_same_user_only(self) -> None:
        store = MemoryStore()
        layer = memory(store, scope="user")
        first = ScriptedModel(["ok"])
        async with Session(
            Agent(model=first, middleware=[layer]), thread_id="a", user_id="u1"
        ) as s:
            await s.run("Please always answer in French.")
        later = ScriptedModel(["oui", "hello"])
        agent = Agent(model=later, middleware=[layer])
        async with Session(agent, thread_id="b", user_id="u1") as same_user:
            await same_user.run("salut")
        async with Session(agent, thread_id="c", user_id="u2") as other_user:
            await other_user.run("hi")
        assert "Please always answer in French." in (later.requests[0].system_prompt or "")
        assert later.requests[1].system_prompt is None
        assert [n.text for n in await store.notes("session_memory:user:u1")] == [
            "User preference: Please always answer in French."
        ]
        # without a user id, user scope falls back to the thread
        assert layer.namespace_for(RunConfig(thread_id="z")) == "session_memory:thread:z"

    async def test_custom_namespace_and_none_to_skip(self) -> None:
        store = MemoryStore()

        def by_tag(config: RunConfig) -> str | None:
            return "team:alpha" if "alpha" in config.tags else None

        layer = memory(store, namespace=by_tag)
        with capture_events() as events:
            async with Session(
                Agent(model=ScriptedModel(["a"]), middleware=[layer]),
                config=RunConfig(tags=("alpha",)),
            ) as s:
                await s.run("I prefer tabs.")
            async with Session(Agent(model=ScriptedModel(["b"]), middleware=[layer])) as s2:
                await s2.run("I prefer spaces.")
        assert [n.text for n in await store.notes("team:alpha")] == [
            "User preference: I prefer tabs."
        ]
        assert [e.reason for e in of_kind(events, "session_memory.skipped")] == ["no_namespace"]

    async def test_store_by_name_from_the_context(self) -> None:
        store = MemoryStore()
        layer = SessionMemory(store="notes", min_tokens=0, min_tool_calls=0, min_turns=1)
        agent = Agent(model=ScriptedModel(["a", "b"]), middleware=[layer])
        async with Session(agent, thread_id="t", stores={"notes": store}) as s:
            await s.run("I prefer tea.")
        assert await notes_of(store, "t") == ["User preference: I prefer tea."]
        for inject in (True, False):
            named = SessionMemory(store="notes", inject=inject)
            failing = Agent(model=ScriptedModel(["a"]), middleware=[named])
            async with Session(failing, stores={"other": store}) as s2:
                with pytest.raises(KeyError, match=r"no store named 'notes'.*known: other"):
                    await s2.run("x")
            assert failing.model.calls == 0  # type: ignore[attr-defined]  # failed at the start

    async def test_a_failing_load_is_reported_and_the_run_goes_on(self) -> None:
        class Unreadable(MemoryStore):
            async def notes(self, namespace: str, *, limit: int | None = None) -> list[Note]:
                raise OSError("unreadable")

        layer = memory(Unreadable(), enabled=False)
        model = ScriptedModel(["fine"])
        with capture_events() as events:
            async with Session(Agent(model=model, middleware=[layer], system_prompt="s")) as s:
                result = await s.run("hi")
        assert result.final_text == "fine"
        assert model.requests[0].system_prompt == "s"
        (failed,) = of_kind(events, "session_memory.load_failed")
        assert (failed.error, failed.level) == ("OSError: unreadable", "warning")

    async def test_new_notes_are_offered_from_the_next_run_on(self) -> None:
        layer = memory()
        tool = FakeTool("noop")
        model = ScriptedModel([reply("", call("noop")), "a", "b"])
        async with Session(Agent(model=model, tools=[tool.tool], middleware=[layer])) as s:
            await s.run("I prefer tea.")
            await settle(s)
            assert layer.section(s.ctx) is None  # unchanged within the session until a run starts
            await s.run("next")
            section = layer.section(s.ctx)
        first_run = [r.system_prompt for r in model.requests[:2]]
        assert first_run == [None, None]  # stable within the run
        assert section is not None and "I prefer tea." in section.text
        assert model.requests[2].system_prompt == section.text

    async def test_inject_false_offers_nothing(self) -> None:
        store = MemoryStore()
        await store.append_note("session_memory:thread:t", "hidden")
        model = ScriptedModel(["a"])
        layer = memory(store, inject=False, min_turns=99)
        async with Session(Agent(model=model, middleware=[layer]), thread_id="t") as s:
            await s.run("x")
        assert model.requests[0].system_prompt is None

    @given(
        texts=st.lists(st.text(min_size=1, max_size=60), max_size=25),
        cap=st.integers(1, 120),
    )
    def test_render_is_newest_first_and_within_the_cap(self, texts: list[str], cap: int) -> None:
        counter = HeuristicCounter()
        layer = SessionMemory(store=MemoryStore(), inject_max_tokens=cap, counter=counter)
        notes = [Note("ns", i + 1, text, 0.0) for i, text in enumerate(texts)]
        section = layer.render(notes)
        if section is None:
            return
        assert section.tokens == counter.count_text(section.text) <= cap
        seqs = [n.seq for n in section.notes]
        assert seqs == sorted(seqs, reverse=True)
        assert section.text == SECTION_HEADER + "".join(f"\n- {n.text}" for n in section.notes)
        # greedy from the newest: a newest note that fits on its own is always offered
        if (
            notes
            and counter.count_text(SECTION_HEADER) + counter.count_text(f"\n- {notes[-1].text}")
            <= cap
        ):
            assert section.notes[0] is notes[-1]


# ---------------------------------------------------------------------------------------
# extractors


def _job(*messages: Message, existing: Sequence[str] = (), since: int = 0) -> ExtractionJob:
    notes = [Note("ns", i + 1, text, 0.0) for i, text in enumerate(existing)]
    return ExtractionJob(messages, since=since, existing=notes, namespace="ns")


CONVERSATION: tuple[Message, ...] = (
    UserMessage("I prefer concise answers. Can you check the weather? Please use Celsius."),
    AssistantMessage(
        "We decided to use the metric API because it is free. I'll check it now.",
        (call("weather", id="w1", city="Oslo"), call("weather", id="w2", city="Rome")),
    ),
    ToolResult("w1", "Oslo: 4°C, rain\nwind 10 km/h", "weather"),
    ToolResult("w2", "service unavailable", "weather", is_error=True),
    AssistantMessage("Oslo is 4°C. TODO: retry Rome later.", ()),
    UserMessage("My name is Ana.\nNext step: book the flight"),
)


PATTERNED_TEXT = st.lists(
    st.sampled_from(
        [
            "I prefer tea.",
            "i PREFER tea",
            "Please be brief.",
            "We decided to ship because it is ready.",
            "I'll do it.",
            "TODO: tests",
            "Next step: deploy.",
            "Do I prefer tea?",
            "\n",
        ]
    )
    | st.text(max_size=12),
    max_size=4,
).map(" ".join)


class TestRuleExtractor:
    """Offline, deterministic bullets from patterns, capped and de-duplicated."""

    async def test_categories_in_priority_order(self) -> None:
        bullets = await RuleExtractor().extract(_job(*CONVERSATION), None)  # type: ignore[arg-type]
        assert bullets == [
            "User preference: I prefer concise answers.",
            "User preference: Please use Celsius.",
            "User preference: My name is Ana.",
            "Decision: We decided to use the metric API because it is free.",
            "Commitment: I'll check it now.",
            "Open task: TODO: retry Rome later.",
            "Open task: Next step: book the flight",
            "From weather: Oslo: 4°C, rain",
        ]

    async def test_cap_existing_and_new_messages_only(self) -> None:
        extractor = RuleExtractor(max_bullets=2)
        existing = ["user preference: i prefer CONCISE answers"]
        bullets = await extractor.extract(_job(*CONVERSATION, existing=existing), None)  # type: ignore[arg-type]
        assert bullets == [
            "User preference: Please use Celsius.",
            "User preference: My name is Ana.",
        ]
        later = await RuleExtractor().extract(_job(*CONVERSATION, since=4), None)  # type: ignore[arg-type]
        assert later == [
            "User preference: My name is Ana.",
            "Open task: TODO: retry Rome later.",
            "Open task: Next step: book the flight",
        ]

    async def test_synthetic_results_and_questions_are_skipped(self) -> None:
        synthetic = ToolResult(
            "x1", "[skipped: stopped]", "search", metadata={"tinyctx": {"synthetic": "stopped"}}
        )
        job = _job(
            AssistantMessage("", (call("search", id="x1"),)),
            synthetic,
            UserMessage("Do I prefer tea?"),
        )
        assert await RuleExtractor().extract(job, None) == []  # type: ignore[arg-type]

    async def test_cleared_truncated_summaries_and_synthetic_are_never_notes(self) -> None:
        """Placeholders, cut results, summaries and synthetic answers are no source of facts."""
        from tinyctx.middleware.microcompact import microcompact_history
        from tinyctx.middleware.summarize import ExtractiveSummarizer, summarize_history
        from tinyctx.middleware.tool_result_budget import budget_history

        turns: list[Message] = [UserMessage("Look things up.")]
        for index in range(3):
            turns.append(AssistantMessage("", (call("read", id=f"r{index}", path="a"),)))
            body = f"line {index}: the sky is green\n" + "detail " * 60
            turns.append(ToolResult(f"r{index}", body, "read"))
        turns.append(AssistantMessage("Done."))
        cleared, _ = microcompact_history(tuple(turns), keep_recent=1)
        texts = [m.text for m in cleared if isinstance(m, ToolResult)]
        assert "[Old tool result content cleared]" in texts
        truncated, _ = budget_history(
            [
                AssistantMessage("", (call("read", id="t1"),)),
                ToolResult("t1", "line x: huge output " + "x" * 500, "read"),
            ],
            64,
        )
        ctx = RunContext.new()
        long_history = (*turns, *(UserMessage(f"I prefer option {i}.") for i in range(12)))
        summarized, stats = await summarize_history(
            long_history, ExtractiveSummarizer(max_tokens=200), ctx, keep_recent=2
        )
        assert stats.changed
        (summary,) = [m for m in summarized if "summary" in m.metadata.get("tinyctx", {})]
        synthetic = ToolResult("s1", "[not run]", "read", metadata={"tinyctx": {"synthetic": "x"}})
        extractor = RuleExtractor(max_bullets=50)
        bullets = extractor.candidates((*cleared, *truncated, summary, synthetic))
        assert "From read: line 2: the sky is green" in bullets  # the one kept verbatim
        assert not [b for b in bullets if "cleared" in b or "truncated" in b or "huge" in b]
        assert not [b for b in bullets if "line 0" in b or "line 1" in b or "[not run]" in b]
        assert not [b for b in bullets if "option" in b]  # only in the summary

    async def test_long_sentences_are_clipped(self) -> None:
        job = _job(UserMessage("I prefer " + "very " * 100 + "long answers."))
        (bullet,) = await RuleExtractor(max_chars=50).extract(job, None)  # type: ignore[arg-type]
        assert len(bullet) == 50 and bullet.endswith("\u2026")

    @given(
        history=histories(
            max_turns=5, tool_turn_probability=0.3, max_results_per_turn=2, text=PATTERNED_TEXT
        ),
        existing_count=st.integers(0, 4),
        cap=st.integers(1, 6),
        data=st.data(),
    )
    def test_output_is_capped_new_unique_and_deterministic(
        self, history: tuple[Message, ...], existing_count: int, cap: int, data: st.DataObject
    ) -> None:
        extractor = RuleExtractor(max_bullets=cap)
        everything = extractor.candidates(history)
        existing = (
            data.draw(st.lists(st.sampled_from(everything), max_size=existing_count))
            if everything
            else []
        )
        first = extractor.propose(history, existing)
        second = extractor.propose(history, existing)
        assert first == second
        assert len(first) <= cap
        keys = [bullet_key(b) for b in first]
        assert len(set(keys)) == len(keys)
        assert not set(keys) & {bullet_key(e) for e in existing}
        # nothing new is left behind while there is room
        if len(first) < cap:
            assert {bullet_key(c) for c in everything} <= set(keys) | {
                bullet_key(e) for e in existing
            }


class TestModelExtractor:
    """A model proposes bullets from a prompt that lists what is already stored."""

    async def test_request_and_parsed_bullets(self) -> None:
        model = ScriptedModel(
            [
                reply(
                    "Here you go:\n- User prefers Celsius.\n* Decided: metric API (free)\n"
                    "- user prefers celsius\n1. Open task: retry Rome\n- Already known fact",
                    usage=(500, 40),
                )
            ]
        )
        extractor = ModelExtractor(model, max_bullets=3, model_name="small")
        ctx = RunContext.new()
        job = _job(*CONVERSATION, existing=["Already known fact"], since=1)
        bullets = await extractor.extract(job, ctx)
        assert bullets == [
            "User prefers Celsius.",
            "Decided: metric API (free)",
            "Open task: retry Rome",
        ]
        (request,) = model.requests
        assert model.contexts == [ctx]
        assert request.model == "small"
        assert "at most 3 bullets" in (request.system_prompt or "")
        content = request.messages[0].text
        assert content.startswith("Already stored:\n- Already known fact\n\nConversation:\n")
        assert "[user] I prefer concise" not in content  # messages before `since` are done
        assert '(calls weather {"city": "Oslo"})' in content
        assert "[tool weather] Oslo: 4°C, rain wind 10 km/h" in content
        assert "[tool weather error] service unavailable" in content
        assert ctx.usage.total() == Usage(500, 40)

    async def test_none_means_no_bullets_and_no_new_messages_means_no_call(self) -> None:
        model = ScriptedModel(["NONE"])
        extractor = ModelExtractor(model)
        assert await extractor.extract(_job(UserMessage("hi")), RunContext.new()) == []
        assert await extractor.extract(_job(UserMessage("hi"), since=1), RunContext.new()) == []
        assert model.calls == 1

    async def test_the_call_is_raced_against_cancellation(self) -> None:
        extractor = ModelExtractor(ScriptedModel([HANG]))
        ctx = RunContext.new()

        async def cancel_soon() -> None:
            await anyio.sleep(0.01)
            ctx.cancellation.cancel("stop")

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(cancel_soon)
                with pytest.raises(RunCancelled, match="stop"):
                    await extractor.extract(_job(UserMessage("x")), ctx)

    def test_parse_bullets(self) -> None:
        assert parse_bullets("NONE") == []
        assert parse_bullets("none.") == []
        assert parse_bullets("") == []
        assert parse_bullets("- a\n  • b\n3) c\nnot a bullet") == ["a", "b", "c"]
        assert parse_bullets("Notes:\nplain line\nanother") == ["plain line", "another"]

    def test_dedupe_bullets_ignores_case_punctuation_and_marks(self) -> None:
        assert dedupe_bullets(
            ["- Likes tea!", "likes TEA", "  ", "New  one"], ["Old"], limit=5
        ) == ["- Likes tea!", "New one"]
        assert dedupe_bullets(["a", "b", "c"], limit=2) == ["a", "b"]

    def test_transcript_leaves_out_the_oldest_beyond_the_budget(self) -> None:
        messages = [UserMessage(f"message {i} " + "z" * 50) for i in range(10)]
        text = render_transcript(messages, max_chars=200)
        assert text.startswith("[... 8 earlier messages left out]\n[user] message 8 ")
        assert "message 9" in text and "message 7 " not in text
        clipped = render_transcript([UserMessage("y" * 100)], max_message_chars=10)
        assert clipped == "[user] " + "y" * 9 + "\u2026"


# ---------------------------------------------------------------------------------------
# events


class TestEvents:
    """Every state change is an event in the session's run tree."""

    async def test_lifecycle_events_form_one_tree(self) -> None:
        layer = memory(extractor=Failing(RuntimeError("first try fails")))
        model = ScriptedModel(["a", "b"])
        with capture_events() as events:
            async with Session(Agent(model=model, middleware=[layer])) as s:
                first = await s.run("I prefer tea.")
                await settle(s)
                await s.run("ok")
                await settle(s)
        memory_events = [e for e in events if e.kind.startswith("session_memory.")]
        assert [e.kind for e in memory_events] == [
            "session_memory.loaded",
            "session_memory.started",
            "session_memory.failed",
            "session_memory.loaded",
            "session_memory.started",
            "session_memory.completed",
        ]
        started = memory_events[1]
        assert isinstance(started, MemoryExtractionStarted)
        assert started.parent_run_id == first.run_id
        assert EXTRACTION_TAG in started.tags
        completed = memory_events[-1]
        assert isinstance(completed, MemoryExtractionCompleted)
        assert (completed.notes_written, completed.seqs) == (1, (1,))
        assert_events_form_tree(events)


# ---------------------------------------------------------------------------------------
# many sessions, one file


class TestConcurrentSessions:
    """200 concurrent sessions on one SqliteStore file: nothing lost, nothing leaks."""

    async def test_200_sessions_each_extracting_several_times(self, tmp_path: Path) -> None:
        path = tmp_path / "shared.db"
        stores = [SqliteStore(path), SqliteStore(path)]
        layers = [memory(store) for store in stores]
        rounds = 3

        async def one_session(index: int) -> None:
            layer = layers[index % len(layers)]
            model = ScriptedModel([f"ok {index}-{r}" for r in range(rounds)])
            agent = Agent(model=model, middleware=[layer])
            async with Session(agent, thread_id=f"thread-{index}") as session:
                for round_ in range(rounds):
                    await session.run(f"I prefer option {index}-{round_}.")
                    await settle(session)
                assert layer.counters(session.ctx).extractions == rounds

        with capture_events() as events:
            async with anyio.create_task_group() as group:
                for index in range(200):
                    group.start_soon(one_session, index)
        written: dict[str, set[int]] = {}
        for event in of_kind(events, "session_memory.completed"):
            written.setdefault(event.namespace, set()).update(event.seqs)
        assert len(written) == 200
        reader = stores[0]
        for index in range(200):
            namespace = f"session_memory:thread:thread-{index}"
            notes = await reader.notes(namespace)
            assert {n.seq for n in notes} == written[namespace] == {1, 2, 3}
            assert [n.text for n in notes] == [
                f"User preference: I prefer option {index}-{r}." for r in range(rounds)
            ]
            assert all(n.metadata["thread_id"] == f"thread-{index}" for n in notes)
        for store in stores:
            await store.aclose()


class TestLayerShape:
    """The layer is a normal Layer with all four hooks, shareable across sessions."""

    def test_hooks(self) -> None:
        layer = SessionMemory(store=MemoryStore())
        assert isinstance(layer, Layer)
        assert all(has_hook(layer, h) for h in ("model", "tool", "run_start", "run_end"))
        assert SessionMemory(store=MemoryStore(), name="mem2").name == "mem2"

    def test_counters_are_a_narrow_mutable_object(self) -> None:
        counters = MemoryCounters()
        assert not hasattr(counters, "__dict__")
        assert repr(counters).startswith("<MemoryCounters idle")


class TestNotesApartFromTheThread:
    """Notes kept in another store than the thread's are written, unfenced: only the store
    that holds the thread's lease can check a fence against it."""

    async def test_threads_on_sqlite_notes_in_memory(self, tmp_path: Path) -> None:
        """A durable session whose SessionMemory keeps its notes in a MemoryStore extracts
        them (before, every extraction failed with FencedOut)."""
        notes = MemoryStore()
        layer = memory(notes)
        model = ScriptedModel(["Noted."])
        async with SqliteStore(tmp_path / "threads.db") as threads:
            agent = Agent(model=model, middleware=[layer])
            with capture_events() as events:
                async with Session(agent, thread_id="t1", store=threads) as session:
                    await session.run("I prefer short answers.")
                    await settle(session)
        assert of_kind(events, "session_memory.failed") == []
        assert await notes_of(notes, "t1") == ["User preference: I prefer short answers."]

    async def test_the_lease_is_offered_only_to_its_own_store(self, tmp_path: Path) -> None:
        """ctx.thread_lease(store) is the session's lease for the thread's store, None for
        any other store."""
        async with SqliteStore(tmp_path / "threads.db") as threads:
            agent = Agent(model=ScriptedModel(["ok"]))
            async with Session(agent, thread_id="t1", store=threads) as session:
                lease = session.ctx.thread_lease()
                assert lease is not None and lease.thread_id == "t1"
                assert session.ctx.thread_lease(threads) == lease
                assert session.ctx.thread_lease(MemoryStore()) is None

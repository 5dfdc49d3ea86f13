"""Stateful tests: the session-memory counters against a simple reference model, and a real
Session with SessionMemory on both stores under runs, resumes, cancellations and failing
hooks."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from tinyctx import ConfigError, EventSink, Layer, MemoryStore, RunContext, RunResult, SqliteStore
from tinyctx.chain import LayerLike
from tinyctx.messages import check_pairing, pending_tool_calls
from tinyctx.middleware import SessionMemory
from tinyctx.middleware.session_memory import (
    Counts,
    ExtractionStateError,
    ExtractionTicket,
    MemoryCounters,
    MemoryThresholds,
)
from tinyctx.stores import Store
from tinyctx.testing import reply
from tinyctx.testing.stateful import SessionMachine


class Reference:
    """The documented semantics, written as plainly as possible."""

    def __init__(self, thresholds: MemoryThresholds) -> None:
        self.thresholds = thresholds
        self.enabled = True
        self.tokens = self.tool_calls = self.turns = 0
        self.baseline: int | None = 0
        self.marks = (0, 0, 0)
        self.at_start: tuple[int, int, int] | None = None
        self.started = self.completed = self.failed = 0

    @property
    def totals(self) -> tuple[int, int, int]:
        return (self.tokens, self.tool_calls, self.turns)

    @property
    def deltas(self) -> tuple[int, int, int]:
        return tuple(t - m for t, m in zip(self.totals, self.marks, strict=True))  # type: ignore[return-value]

    def unmet(self) -> tuple[str, ...]:
        t = self.thresholds
        need = (t.min_tokens, t.min_tool_calls, t.min_turns)
        names = ("tokens", "tool_calls", "turns")
        return tuple(n for n, d, k in zip(names, self.deltas, need, strict=True) if d < k)

    def should_extract(self) -> bool:
        return self.enabled and self.at_start is None and not self.unmet()


class CountersMachine(RuleBasedStateMachine):
    """Any interleaving of usage, tool calls, turns, start, success, failure and
    disable/enable keeps the counters equal to the reference and the invariants true."""

    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.sut: MemoryCounters | None = None
        self.ref: Reference | None = None
        self.previous_totals = Counts()
        self.stale: list[ExtractionTicket] = []

    @initialize(
        tokens=st.integers(0, 400),
        tool_calls=st.integers(0, 6),
        turns=st.integers(0, 4),
    )
    def setup(self, tokens: int, tool_calls: int, turns: int) -> None:
        thresholds = MemoryThresholds(tokens, tool_calls, turns)
        self.sut = MemoryCounters(thresholds)
        self.ref = Reference(thresholds)

    # -- bookkeeping --------------------------------------------------------------------

    @rule(size=st.integers(0, 1000))
    def usage(self, size: int) -> None:
        assert self.sut is not None and self.ref is not None
        self.sut.record_usage(size)
        ref = self.ref
        if ref.enabled:
            if ref.baseline is not None and size > ref.baseline:
                ref.tokens += size - ref.baseline
            ref.baseline = size

    @rule(count=st.integers(0, 4))
    def tool_calls(self, count: int) -> None:
        assert self.sut is not None and self.ref is not None
        self.sut.record_tool_calls(count)
        if self.ref.enabled:
            self.ref.tool_calls += count

    @rule()
    def turn(self) -> None:
        assert self.sut is not None and self.ref is not None
        self.sut.tick_turn()
        if self.ref.enabled:
            self.ref.turns += 1

    @rule(value=st.sampled_from([-1, -100, True, 1.5, "3", None]))
    def bad_values_change_nothing(self, value: object) -> None:
        assert self.sut is not None
        before = (self.sut.totals, self.sut.marks, self.sut.ticket)
        with pytest.raises(ValueError):
            self.sut.record_usage(value)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            self.sut.record_tool_calls(value)  # type: ignore[arg-type]
        assert (self.sut.totals, self.sut.marks, self.sut.ticket) == before

    # -- the state machine --------------------------------------------------------------

    @precondition(lambda self: self.ref is not None and self.ref.should_extract())
    @rule(target=tickets)
    def start_when_due(self) -> ExtractionTicket:
        return self._start()

    @precondition(
        lambda self: self.ref is not None and self.ref.enabled and self.ref.at_start is None
    )
    @rule(target=tickets)
    def start_early(self) -> ExtractionTicket:
        """Starting without the thresholds (a forced flush) is allowed too."""
        return self._start()

    def _start(self) -> ExtractionTicket:
        assert self.sut is not None and self.ref is not None
        ticket = self.sut.begin()
        self.ref.at_start = self.ref.totals
        self.ref.started += 1
        assert ticket.at == Counts(*self.ref.totals)
        return ticket

    @precondition(lambda self: self.ref is not None and (not self.ref.enabled or self.ref.at_start))
    @rule()
    def start_refused_when_disabled_or_in_progress(self) -> None:
        assert self.sut is not None
        before = (self.sut.ticket, self.sut.started)
        with pytest.raises(ExtractionStateError):
            self.sut.begin()
        assert (self.sut.ticket, self.sut.started) == before

    @rule(ticket=consumes(tickets), succeeded=st.booleans())
    def finish(self, ticket: ExtractionTicket, succeeded: bool) -> None:
        assert self.sut is not None and self.ref is not None
        if ticket is not self.sut.ticket:
            # stale: finished already (or never current); refused, nothing changes
            before = (self.sut.ticket, self.sut.marks, self.sut.extractions, self.sut.failures)
            with pytest.raises(ExtractionStateError):
                (self.sut.complete if succeeded else self.sut.fail)(ticket)
            assert (
                self.sut.ticket,
                self.sut.marks,
                self.sut.extractions,
                self.sut.failures,
            ) == before
            return
        assert self.ref.at_start is not None
        if succeeded:
            self.sut.complete(ticket)
            self.ref.marks = self.ref.at_start
            self.ref.completed += 1
        else:
            self.sut.fail(ticket)
            self.ref.failed += 1
        self.ref.at_start = None
        self.stale.append(ticket)

    @precondition(lambda self: bool(self.stale))
    @rule(succeeded=st.booleans(), data=st.data())
    def finishing_a_stale_ticket_is_refused(self, succeeded: bool, data: st.DataObject) -> None:
        assert self.sut is not None
        ticket = data.draw(st.sampled_from(self.stale))
        before = (self.sut.ticket, self.sut.marks, self.sut.extractions, self.sut.failures)
        with pytest.raises(ExtractionStateError):
            (self.sut.complete if succeeded else self.sut.fail)(ticket)
        assert (self.sut.ticket, self.sut.marks, self.sut.extractions, self.sut.failures) == before

    @rule()
    def disable(self) -> None:
        assert self.sut is not None and self.ref is not None
        self.sut.disable()
        self.ref.enabled = False

    @rule()
    def enable(self) -> None:
        assert self.sut is not None and self.ref is not None
        self.sut.enable()
        if not self.ref.enabled:
            self.ref.enabled = True
            self.ref.baseline = None

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def matches_the_reference(self) -> None:
        sut, ref = self.sut, self.ref
        if sut is None or ref is None:
            return
        assert sut.totals == Counts(*ref.totals)
        assert sut.marks == Counts(*ref.marks)
        assert sut.deltas() == Counts(*ref.deltas)
        assert sut.enabled is ref.enabled
        assert sut.in_progress is (ref.at_start is not None)
        assert sut.unmet() == ref.unmet()
        assert sut.should_extract() is ref.should_extract()
        assert (sut.started, sut.extractions, sut.failures) == (
            ref.started,
            ref.completed,
            ref.failed,
        )

    @invariant()
    def documented_invariants_hold(self) -> None:
        sut = self.sut
        if sut is None:
            return
        totals, marks = sut.totals, sut.marks
        # counters never go down; marks never pass the counters; deltas are never negative
        previous = self.previous_totals
        assert totals.tokens >= previous.tokens
        assert totals.tool_calls >= previous.tool_calls
        assert totals.turns >= previous.turns
        self.previous_totals = totals
        deltas = sut.deltas()
        assert min(deltas.tokens, deltas.tool_calls, deltas.turns) >= 0
        ticket = sut.ticket
        if ticket is not None:
            # a running extraction remembers a point between the marks and now
            assert marks.tokens <= ticket.at.tokens <= totals.tokens
            assert marks.tool_calls <= ticket.at.tool_calls <= totals.tool_calls
            assert marks.turns <= ticket.at.turns <= totals.turns
        # never due while running or disabled
        if sut.in_progress or not sut.enabled:
            assert not sut.should_extract()
        assert sut.started == sut.extractions + sut.failures + int(sut.in_progress)


TestCountersStateMachine = CountersMachine.TestCase


class TestThresholdValidation:
    """Thresholds are validated at construction and name the bad field."""

    @given(
        field=st.sampled_from(["min_tokens", "min_tool_calls", "min_turns"]),
        value=st.one_of(st.integers(max_value=-1), st.booleans(), st.floats(), st.text(max_size=3)),
    )
    def test_invalid_threshold_is_a_config_error_naming_the_field(
        self, field: str, value: object
    ) -> None:
        with pytest.raises(ConfigError) as info:
            MemoryThresholds(**{field: value})  # type: ignore[arg-type]
        assert info.value.field == field
        assert f"MemoryThresholds.{field}" in str(info.value)
        assert "integer >= 0" in str(info.value)

    def test_defaults_are_4000_8_4(self) -> None:
        assert MemoryThresholds() == MemoryThresholds(4000, 8, 4)
        assert MemoryCounters().thresholds == MemoryThresholds()

    def test_evolve_revalidates(self) -> None:
        with pytest.raises(ConfigError, match="min_turns"):
            MemoryThresholds().evolve(min_turns=-1)


# ---------------------------------------------------------------------------------------
# a real session with SessionMemory: runs, resumes, cancellations and failing hooks


class HookFailed(RuntimeError):
    """What the flaky hook raises when the machine asks it to."""


class FlakyHook(Layer):
    """Awaits in ``on_run_start`` (as SessionMemory does) and raises when told to."""

    name = "flaky_hook"

    def __init__(self) -> None:
        self.fail_next = False

    async def on_run_start(self, ctx: RunContext[Any]) -> None:
        await anyio.lowlevel.checkpoint()
        if self.fail_next:
            self.fail_next = False
            raise HookFailed("on_run_start failed")


class MemorySessionMachine(SessionMachine):
    """The session template (runs, tool turns, cancellations at every checkpoint, control
    outcomes, resumes, provider failures) plus failing run hooks and facts told, with
    SessionMemory extracting after every run into a real store. After every step: pairing
    intact, ``paused`` is the checkpoint or None with every call answered, no run or
    extraction left running; at the end every fact told before the last completed run is
    stored (never-extracted facts = 0)."""

    store_kind: ClassVar[str] = "memory"
    allowed_errors = (HookFailed,)

    def __init__(self) -> None:
        self.hook = FlakyHook()
        self.tmp = tempfile.TemporaryDirectory()
        self.store: Store = (
            MemoryStore()
            if self.store_kind == "memory"
            else SqliteStore(Path(self.tmp.name) / "memory.db")
        )
        self.layer = SessionMemory(store=self.store, min_tokens=0, min_tool_calls=0, min_turns=1)
        self.facts: list[str] = []
        self.told: list[str] = []
        super().__init__()

    def middleware(self) -> Sequence[LayerLike]:
        return [self.hook, self.layer]

    def session_options(self) -> dict[str, Any]:
        return {"thread_id": "machine", "events": EventSink(logger=None)}

    def _run(self, text: str) -> Any:
        outcome = super()._run(text)
        self._after_run(outcome)
        return outcome

    def _after_run(self, outcome: Any) -> None:
        if isinstance(outcome, RunResult):
            self.facts += self.told  # everything told so far is now in a completed run
            self.told = []

    @rule(n=st.integers(0, 10_000))
    def tell_fact(self, n: int) -> None:
        """The user states a preference; the run completes."""
        self.plan.clear()
        self.plan.append(reply(f"noted {n}"))
        fact = f"I prefer option {n}."
        self.told.append(fact)
        self._expect(self._run(fact), "completed")

    @rule()
    def failing_hook_on_run(self) -> None:
        """An on_run_start hook raises: the run fails, nothing is left half done."""
        self.plan.clear()
        self.hook.fail_next = True
        outcome = self._run("a run whose hook fails")
        _check_that(isinstance(outcome, HookFailed), f"expected HookFailed, got {outcome!r}")
        self.hook.fail_next = False

    @precondition(lambda self: self.checkpoint is not None)
    @rule()
    def failing_hook_on_resume(self) -> None:
        """A resume whose hook raises leaves the session paused on the same checkpoint,
        or answers every pending call (issue #15 D1)."""
        self.plan.clear()
        checkpoint = self.checkpoint
        assert checkpoint is not None
        self.hook.fail_next = True
        self.checkpoint = None
        outcome = self._settle(self._outcome(self.session.resume, checkpoint))
        self.hook.fail_next = False
        _check_that(isinstance(outcome, HookFailed), f"expected HookFailed, got {outcome!r}")
        paused = self.session.paused
        _check_that(paused in (None, checkpoint), "a failed resume paused somewhere else")
        self.checkpoint = paused

    def _settle_background(self) -> None:
        background = self.session.ctx.background
        assert background is not None
        self.portal.call(background.wait_idle)

    @invariant()
    def paused_is_the_checkpoint_or_nothing_is_pending(self) -> None:
        paused = self.session.paused
        if paused is not None:
            _check_that(paused is self.checkpoint, "paused on a checkpoint nobody was given")
        else:
            pending = pending_tool_calls(self.conversation)
            _check_that(not pending, f"not paused, yet calls wait for results: {pending}")
            check_pairing(self.conversation, allow_pending=False)

    @invariant()
    def no_task_left(self) -> None:
        _check_that(not self.session.cancel_run(), "a run is still in progress")
        self._settle_background()
        counters = self.layer.counters(self.session.ctx)
        _check_that(not counters.in_progress, "an extraction is still in progress")
        _check_that(not self.layer.pending(self.session.ctx), "an extraction is still queued")

    def teardown(self) -> None:
        try:
            super().teardown()  # leaves the session: the queue is flushed
            stored = anyio.run(self._stored, backend="trio")
            missing = [f for f in self.facts if f"User preference: {f}" not in stored]
            _check_that(not missing, f"facts never extracted: {missing}")
        finally:
            anyio.run(self.store.aclose, backend="trio")
            self.tmp.cleanup()

    async def _stored(self) -> set[str]:
        return {note.text for note in await self.store.notes("session_memory:thread:machine")}


def _check_that(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


class SqliteMemorySessionMachine(MemorySessionMachine):
    store_kind = "sqlite"


class AsyncioSqliteMemorySessionMachine(SqliteMemorySessionMachine):
    backend = "asyncio"


# the profile's examples on trio with both stores; the asyncio run is a smaller second look
_MACHINE_SETTINGS = settings(stateful_step_count=25, deadline=None)
# stateful soaks: deselected by default, run with `pytest -m slow`
TestMemorySessionOnMemoryStore = pytest.mark.slow(MemorySessionMachine.TestCase)
TestMemorySessionOnMemoryStore.settings = _MACHINE_SETTINGS
TestMemorySessionOnSqliteStore = pytest.mark.slow(SqliteMemorySessionMachine.TestCase)
TestMemorySessionOnSqliteStore.settings = _MACHINE_SETTINGS
TestMemorySessionOnSqliteAsyncio = pytest.mark.slow(AsyncioSqliteMemorySessionMachine.TestCase)
TestMemorySessionOnSqliteAsyncio.settings = settings(
    _MACHINE_SETTINGS, max_examples=min(_MACHINE_SETTINGS.max_examples, 50)
)

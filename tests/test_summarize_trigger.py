"""Summarize's trigger reads the calibrated count: the usage the provider reported plus
what was added since, never a report of a history that was rewritten since."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tinyctx import Agent, Message, Session, UserMessage
from tinyctx.middleware import ExtractiveSummarizer, Summarize
from tinyctx.middleware.summarize import SummaryApplied, SummaryFailed
from tinyctx.testing import ScriptedModel, capture_events, reply
from tinyctx.tokens import Calibration, HeuristicCounter

COUNTER = HeuristicCounter()


async def _summaries(reports: list[int], runs: int, trigger: int) -> tuple[int, list[int]]:
    """How often the layer fired (a summary applied or refused) over ``runs`` runs of one
    session whose model reports ``reports`` input tokens call after call, and the local
    estimate of each request."""
    model = ScriptedModel([reply(f"answer {i}", usage=(r, 5)) for i, r in enumerate(reports)])
    layer = Summarize(ExtractiveSummarizer(), trigger_tokens=trigger, keep_recent=1)
    agent = Agent(model=model, middleware=[layer])
    with capture_events(SummaryApplied, SummaryFailed) as fired:
        async with Session(agent) as session:
            for i in range(runs):
                await session.run(f"question {i} " + "about the failing build step " * 40)
    return len(fired), [COUNTER.count_request(r) for r in model.requests]


class TestTriggerOnReportedUsage:
    """The trigger fires on what the provider counted, not only on the local estimate."""

    async def test_fires_on_reported_usage_above_the_threshold_when_the_estimate_is_below(
        self,
    ) -> None:
        """A provider that counts 9,000 tokens (its own system prompt, tool formatting)
        where the estimate sees a few hundred: the second request is over the trigger."""
        applied, estimates = await _summaries([9_000, 9_100, 9_200], runs=3, trigger=5_000)
        assert max(estimates) < 5_000  # the local estimate alone never fires
        assert applied >= 1
        unreported, _ = await _summaries([0, 0, 0], runs=3, trigger=5_000)
        assert unreported == 0  # no report: the estimate, below the trigger

    async def test_stays_quiet_when_the_provider_reports_less_than_the_estimate(self) -> None:
        """The estimate is over the trigger, the provider counts far less: no summary."""
        applied, estimates = await _summaries([20, 30, 40], runs=3, trigger=450)
        assert min(estimates[1:]) >= 450  # the local estimate alone would fire
        assert applied == 0
        unreported, _ = await _summaries([0, 0, 0], runs=3, trigger=450)
        assert unreported >= 1


_TEXTS = st.text(alphabet="abc de\n(1", min_size=1, max_size=60)


class TestCalibratedCountIsNeverStale:
    """Once the history was rewritten, the report of the old one stops counting."""

    @given(
        texts=st.lists(_TEXTS, min_size=2, max_size=12),
        reported=st.integers(1, 10_000_000),
        cut=st.integers(1, 11),
        added=st.lists(_TEXTS, max_size=4),
    )
    def test_a_rewritten_history_is_counted_by_its_own_estimate(
        self, texts: list[str], reported: int, cut: int, added: list[str]
    ) -> None:
        """Any report, however far off: a history that dropped or replaced messages is
        counted within the ratio bounds of its own raw count."""
        history: tuple[Message, ...] = tuple(UserMessage(t) for t in texts)
        calibration = Calibration()
        calibration.observe(COUNTER.count_messages(history), reported, history)
        cut = min(cut, len(history) - 1)
        summary = UserMessage("[auto-compacted] summary")
        rewritten = (summary, *history[cut:], *(UserMessage(t) for t in added))
        raw = COUNTER.count_messages(rewritten)
        estimate = calibration.estimate(raw, rewritten)
        assert calibration.min_ratio * raw - 1 <= estimate <= calibration.max_ratio * raw + 1

    @given(
        texts=st.lists(_TEXTS, min_size=1, max_size=12),
        reported=st.integers(1, 100_000),
        added=st.lists(_TEXTS, max_size=4),
    )
    def test_a_grown_history_is_the_report_plus_what_was_added(
        self, texts: list[str], reported: int, added: list[str]
    ) -> None:
        """The same messages then new ones: the report stands, plus the ratio times the
        estimate of the new messages."""
        history: tuple[Message, ...] = tuple(UserMessage(t) for t in texts)
        calibration = Calibration()
        before = COUNTER.count_messages(history)
        calibration.observe(before, reported, history)
        grown = (*history, *(UserMessage(t) for t in added))
        raw = COUNTER.count_messages(grown)
        assert calibration.estimate(raw, grown) == max(
            0, round(reported + calibration.ratio * (raw - before))
        )

    async def test_after_a_summary_the_old_report_does_not_fire_again(self) -> None:
        """The report of the history before the summary is far over the trigger and no
        later call reports anything: the summarized history is judged by its own count
        (scaled), not by the old report moved by the estimate's difference; one summary."""
        applied, estimates = await _summaries([9_000, 0, 0, 0], runs=4, trigger=5_000)
        assert max(estimates) < 5_000
        assert applied == 1


class TestCalibrationIsThreadState:
    """What the trigger learned from reported usage is kept with the thread."""

    async def test_the_calibration_round_trips_through_the_layer_state(self) -> None:
        from tinyctx.middleware.summarize import _Breaker

        breaker = _Breaker()
        assert breaker.to_json() == {"failures": 0}  # nothing reported: nothing kept
        breaker.calibration.observe(400, 900)
        breaker.calibration.observe(800, 1_700)
        restored = _Breaker.from_json(breaker.to_json())
        assert restored.calibration.to_json() == breaker.calibration.to_json()
        assert restored.calibration.estimate(1_000) == breaker.calibration.estimate(1_000)
        assert _Breaker.from_json({"failures": 1}).calibration.observations == 0

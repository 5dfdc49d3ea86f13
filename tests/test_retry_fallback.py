"""Retry and Fallback: cancellable, never repeating control outcomes, one event per attempt."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    ConfigError,
    Event,
    Interrupt,
    Interrupted,
    LimitExceeded,
    ModelRequest,
    ModelResponse,
    ProviderError,
    RetryableProviderError,
    RunCancelled,
    RunConfig,
    RunContext,
    Session,
    StopWithFinal,
    UserMessage,
)
from tinyctx.agent import Checkpoint
from tinyctx.chain import compose
from tinyctx.events import ControlApplied
from tinyctx.middleware import Alternative, Backoff, ControlOutcomes, Fallback, Retry
from tinyctx.middleware.fallback import FallbackAttempt
from tinyctx.middleware.retry import RetryAttempt
from tinyctx.testing import ScriptedModel, capture_events, reply

REQUEST = ModelRequest(messages=(UserMessage("hi"),), model="primary-model")


def interrupted(node: str = "review") -> Interrupted:
    checkpoint = Checkpoint(
        run_config=RunConfig(),
        phase="before_model",
        pending=(),
        node=node,
        message="hold",
        messages=(),
        added=(),
    )
    return Interrupted(node, "hold", checkpoint)


def retry_events(events: list[Event]) -> list[tuple[int, str]]:
    return [(e.attempt, e.outcome) for e in events if isinstance(e, RetryAttempt)]


def fallback_events(events: list[Event]) -> list[tuple[int, str, str]]:
    return [(e.index, e.model, e.outcome) for e in events if isinstance(e, FallbackAttempt)]


class TestConfiguration:
    """Bad settings fail at construction, naming the field."""

    @pytest.mark.parametrize(
        ("build", "field"),
        [
            (lambda: Retry(attempts=0), "attempts"),
            (lambda: Retry(backoff=-1), "backoff"),
            (lambda: Retry(backoff="fast"), "backoff"),
            (lambda: Retry(retry_on=("x",)), "retry_on"),
            (lambda: Retry(retry_on=()), "retry_on"),
            (lambda: Retry(max_delay=-1), "max_delay"),
            (lambda: Backoff(initial=-1), "initial"),
            (lambda: Backoff(multiplier=0.5), "multiplier"),
            (lambda: Backoff(initial=2, maximum=1), "maximum"),
            (lambda: Backoff(jitter=2), "jitter"),
            (lambda: Fallback(), "models"),
            (lambda: Fallback("model"), "models[0]"),
            (lambda: Fallback(ScriptedModel(), on=3), "on"),
            (lambda: Alternative("handler"), "handler"),
        ],
    )
    def test_bad_values(self, build: Any, field: str) -> None:
        with pytest.raises(ConfigError) as info:
            build()
        assert info.value.field == field


class TestBackoff:
    """Exponential, capped, with bounded jitter."""

    def test_deterministic_without_jitter(self) -> None:
        backoff = Backoff(initial=0.5, multiplier=2, maximum=3, jitter=0)
        assert [backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]

    @given(
        retry=st.integers(1, 20),
        jitter=st.floats(0, 1),
        initial=st.floats(0, 5),
        multiplier=st.floats(1, 4),
    )
    def test_jitter_stays_within_its_fraction(
        self, retry: int, jitter: float, initial: float, multiplier: float
    ) -> None:
        backoff = Backoff(initial=initial, multiplier=multiplier, maximum=30, jitter=jitter)
        base = min(30, initial * multiplier ** (retry - 1))
        assert base * (1 - jitter) - 1e-9 <= backoff(retry) <= base * (1 + jitter) + 1e-9


class TestRetry:
    """Transient errors are retried; everything else reaches the caller unchanged."""

    async def test_transient_errors_are_retried(self) -> None:
        model = ScriptedModel([RetryableProviderError("busy"), ConnectionError("reset"), "ok"])
        with capture_events() as events:
            response = await compose([Retry(backoff=0)], model)(REQUEST, RunContext.new())
        assert response.text == "ok"
        assert model.calls == 3
        assert retry_events(events) == [(1, "retry"), (2, "retry"), (3, "ok")]
        failed = [e for e in events if e.kind == "retry.failed"]
        assert [e.level for e in failed] == ["warning", "warning"]
        assert [e.error_type for e in failed] == [  # type: ignore[attr-defined]
            "RetryableProviderError",
            "ConnectionError",
        ]

    async def test_exhausted_attempts_raise_the_last_error(self) -> None:
        last = RetryableProviderError("still busy")
        model = ScriptedModel([RetryableProviderError("busy"), last])
        with capture_events() as events:
            with pytest.raises(RetryableProviderError) as info:
                await compose([Retry(attempts=2, backoff=0)], model)(REQUEST, RunContext.new())
        assert info.value is last
        assert retry_events(events) == [(1, "retry"), (2, "raise")]
        assert [e.reason for e in events if isinstance(e, RetryAttempt)][-1] == (
            "all 2 attempts failed"
        )

    async def test_errors_not_accepted_propagate_at_once(self) -> None:
        model = ScriptedModel([ValueError("bug"), "never"])
        with pytest.raises(ValueError, match="bug"):
            await compose([Retry(backoff=0)], model)(REQUEST, RunContext.new())
        assert model.calls == 1
        picky = Retry(backoff=0, retry_on=lambda exc: "flaky" in str(exc))
        model = ScriptedModel([RuntimeError("flaky"), RuntimeError("solid"), "never"])
        with pytest.raises(RuntimeError, match="solid"):
            await compose([picky], model)(REQUEST, RunContext.new())
        assert model.calls == 2

    @pytest.mark.parametrize(
        "error",
        [RunCancelled("somewhere"), interrupted(), LimitExceeded("model_calls", 3)],
        ids=["cancelled", "interrupted", "limit"],
    )
    async def test_control_errors_are_never_retried(self, error: Exception) -> None:
        model = ScriptedModel([error, "never"])
        with capture_events() as events:
            with pytest.raises(type(error)) as info:
                await compose([Retry(backoff=0, retry_on=Exception)], model)(
                    REQUEST, RunContext.new()
                )
        assert info.value is error
        assert model.calls == 1
        assert [e.reason for e in events if isinstance(e, RetryAttempt)] == [
            "never repeated (control, cancellation, limit or configuration error)"
        ]

    async def test_retry_after_is_honoured(self) -> None:
        model = ScriptedModel([RetryableProviderError("slow down", retry_after=0.02), "ok"])
        with capture_events() as events:
            await compose([Retry(backoff=0)], model)(REQUEST, RunContext.new())
        (failed,) = [e for e in events if e.kind == "retry.failed"]
        assert failed.delay == 0.02  # type: ignore[attr-defined]
        too_long = ScriptedModel([RetryableProviderError("come back in an hour", retry_after=3600)])
        with capture_events() as events:
            with pytest.raises(RetryableProviderError):
                await compose([Retry(backoff=0, max_delay=60)], too_long)(REQUEST, RunContext.new())
        assert [e.reason for e in events if isinstance(e, RetryAttempt)] == [
            "retry_after exceeds max_delay=60.0"
        ]

    async def test_a_control_pending_when_a_call_fails_wins_over_the_retry(self) -> None:
        def pause_then_fail(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            ctx.request_control(Interrupt("review", "a human asked to pause"))
            raise RetryableProviderError("busy")

        model = ScriptedModel([pause_then_fail, "never"])
        agent = Agent(model=model, middleware=[Retry(backoff=0)])
        async with Session(agent) as session:
            with capture_events() as events:
                with pytest.raises(Interrupted) as info:
                    await session.run("go")
        assert info.value.node == "review"
        assert model.calls == 1
        assert retry_events(events) == [(1, "control")]
        assert [e.control for e in events if isinstance(e, ControlApplied)] == ["interrupt"]

    async def test_a_cancelled_token_stops_before_the_first_attempt(self) -> None:
        model = ScriptedModel(["never"])
        ctx = RunContext.new()
        ctx.cancellation.cancel("stop")
        with capture_events() as events:
            with pytest.raises(RunCancelled, match="retry.before_attempt"):
                await compose([Retry()], model)(REQUEST, ctx)
        assert model.calls == 0
        # no run around this onion: a run's cancellation is reported by the agent loop, once
        assert [e for e in events if e.kind == "run.cancelled"] == []

    async def test_cancel_during_backoff_stops_before_the_next_attempt(self) -> None:
        model = ScriptedModel([RetryableProviderError("busy", retry_after=30), "never"])
        agent = Agent(model=model, middleware=[Retry(attempts=5, max_delay=60)])
        waiting = anyio.Event()

        def on_event(event: Event) -> None:
            if isinstance(event, RetryAttempt) and event.outcome == "retry":
                waiting.set()

        async with Session(agent) as session:
            unsubscribe = session.ctx.events.subscribe(on_event)

            async def cancel_while_sleeping() -> None:
                await waiting.wait()
                await anyio.wait_all_tasks_blocked()
                session.cancel("user pressed stop")

            with anyio.fail_after(10), capture_events() as events:  # a guard, not a timing
                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_while_sleeping)
                    with pytest.raises(RunCancelled) as info:
                        await session.run("go")
            unsubscribe()
        assert info.value.checkpoint == "retry.backoff"
        assert info.value.reason == "user pressed stop"
        assert model.calls == 1
        assert retry_events(events) == [(1, "retry")]
        assert [e.checkpoint for e in events if e.kind == "run.cancelled"] == [  # type: ignore[attr-defined]
            "retry.backoff"
        ]

    @given(
        outcomes=st.lists(
            st.sampled_from(["ok", "transient", "bug", "interrupt", "cancel", "control"]),
            min_size=1,
            max_size=6,
        ),
        attempts=st.integers(1, 4),
    )
    async def test_attempts_stop_where_they_must(self, outcomes: list[str], attempts: int) -> None:
        def item(kind: str) -> Any:
            return {
                "ok": reply("ok"),
                "transient": RetryableProviderError("busy"),
                "bug": ValueError("bug"),
                "interrupt": interrupted(),
                "cancel": RunCancelled("inner"),
                "control": reply("x", control=StopWithFinal("stop")),
            }[kind]

        model = ScriptedModel([item(k) for k in outcomes])
        onion = compose([Retry(attempts=attempts, backoff=0)], model)
        # the first attempt that is not transient ends the chain; attempts bound the rest
        stop = next((i for i, k in enumerate(outcomes) if k != "transient"), len(outcomes))
        expected_calls = min(stop + 1, attempts, len(outcomes))
        try:
            response = await onion(REQUEST, RunContext.new())
        except (ValueError, Interrupted, RunCancelled, RetryableProviderError):
            pass
        except AssertionError:  # the script ran out: the test's own bound
            assert len(outcomes) < attempts
            return
        else:
            assert outcomes[expected_calls - 1] in ("ok", "control")
            if outcomes[expected_calls - 1] == "control":
                assert response.control == StopWithFinal("stop")
        assert model.calls == expected_calls


class TestFallback:
    """Alternative models answer when the primary fails; control never advances the chain."""

    async def test_the_next_model_answers_with_its_name(self) -> None:
        backup = ScriptedModel(["from backup"])
        layer = Fallback(Alternative(backup, model="backup-model"))
        primary = ScriptedModel([ProviderError("down", status=503)])
        with capture_events() as events:
            response = await compose([layer], primary)(REQUEST, RunContext.new())
        assert response.text == "from backup"
        assert response.model == "backup-model"
        assert backup.requests[0].model == "backup-model"
        assert fallback_events(events) == [
            (0, "primary-model", "next"),
            (1, "backup-model", "ok"),
        ]

    async def test_all_failing_raises_the_last_error_with_notes(self) -> None:
        last = TimeoutError("second backup timed out")
        first = ScriptedModel([ConnectionError("first backup down")], name="first")
        second = ScriptedModel([last], name="second")
        primary = ScriptedModel([ProviderError("primary down")])
        with pytest.raises(TimeoutError) as info:
            await compose([Fallback(first, second)], primary)(REQUEST, RunContext.new())
        assert info.value is last
        notes = "\n".join(info.value.__notes__)
        assert "primary down" in notes and "first backup down" in notes

    async def test_errors_not_accepted_do_not_advance_the_chain(self) -> None:
        backup = ScriptedModel(["never"])
        primary = ScriptedModel([KeyError("bug")])
        with pytest.raises(KeyError):
            await compose([Fallback(backup)], primary)(REQUEST, RunContext.new())
        assert backup.calls == 0

    async def test_a_cancel_between_models_stops_the_chain(self) -> None:
        def cancel_then_fail(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            ctx.cancellation.cancel("enough")
            raise ProviderError("down")

        backup = ScriptedModel(["never"])
        with pytest.raises(RunCancelled, match="fallback.before_attempt"):
            await compose([Fallback(backup)], ScriptedModel([cancel_then_fail]))(
                REQUEST, RunContext.new()
            )
        assert backup.calls == 0

    async def test_a_control_pending_after_a_failure_is_returned_not_passed_on(self) -> None:
        def stop_then_fail(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            ctx.request_control(StopWithFinal("wrap it up"))
            raise ProviderError("down")

        backup = ScriptedModel(["never"])
        agent = Agent(model=ScriptedModel([stop_then_fail]), middleware=[Fallback(backup)])
        with capture_events() as events:
            result = await agent.run("go")
        assert result.status == "stopped" and result.final_text == "wrap it up"
        assert backup.calls == 0
        assert [o for _, _, o in fallback_events(events)] == ["next", "control"]
        assert len([e for e in events if isinstance(e, ControlApplied)]) == 1

    async def test_a_response_carrying_control_is_returned_as_is(self) -> None:
        backup = ScriptedModel(["never"])
        stop = reply("x", control=StopWithFinal("s"))
        response = await compose([Fallback(backup)], ScriptedModel([stop]))(
            REQUEST, RunContext.new()
        )
        assert response is stop
        assert backup.calls == 0


class TestInterruptsReachTheCaller:
    """An Interrupt raised while Retry and Fallback wrap the call reaches the caller unchanged."""

    @pytest.mark.parametrize("retry_outside", [True, False])
    async def test_interrupted_raised_inside_is_the_same_object_outside(
        self, retry_outside: bool
    ) -> None:
        error = interrupted("deploy-gate")
        primary = ScriptedModel([error, "never"])
        backup = ScriptedModel(["never"])
        retry = Retry(attempts=5, backoff=0, retry_on=Exception)
        fallback = Fallback(backup, on=Exception)
        layers = [retry, fallback] if retry_outside else [fallback, retry]
        with pytest.raises(Interrupted) as info:
            await compose(layers, primary)(REQUEST, RunContext.new())
        assert info.value is error
        assert info.value.node == "deploy-gate"
        assert not getattr(info.value, "__notes__", None)
        assert (primary.calls, backup.calls) == (1, 0)

    async def test_an_interrupt_requested_during_the_call_pauses_the_run_once(self) -> None:
        def pause(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
            ctx.request_control(Interrupt("approve", "ship it?"))
            return reply("partial")

        primary = ScriptedModel([pause, "after resume"])
        backup = ScriptedModel(["never"])
        retry, fallback = Retry(backoff=0), Fallback(backup)
        # the only order an Agent accepts (Fallback declares it sits outside Retry)
        agent = Agent(model=primary, middleware=[fallback, retry, ControlOutcomes()])
        async with Session(agent) as session:
            with capture_events() as events:
                with pytest.raises(Interrupted) as info:
                    await session.run("go")
            assert (info.value.node, info.value.message) == ("approve", "ship it?")
            result = await session.resume(info.value.checkpoint)
        assert result.final_text == "after resume"
        assert (primary.calls, backup.calls) == (2, 0)
        assert [e.control for e in events if isinstance(e, ControlApplied)] == ["interrupt"]
        assert retry_events(events) == [(1, "control")]
        assert [o for _, _, o in fallback_events(events)] == ["control"]

"""Tool failures through the tool onion: ToolRetry, and Retry(on_failure=...) for models."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    Agent,
    ConfigError,
    Interrupt,
    Interrupted,
    RunCancelled,
    Session,
    ToolCall,
    ToolError,
    ToolResult,
    tool,
    tool_layer,
)
from tinyctx.events import ControlApplied, ToolFailed
from tinyctx.messages import check_pairing
from tinyctx.middleware import Retry, ToolResultBudget, ToolRetry
from tinyctx.middleware.retry import RetryFailed
from tinyctx.middleware.tool_retry import ToolRetryAttempt, ToolRetryFailed
from tinyctx.ordering import OrderingError
from tinyctx.testing import FakeTool, ScriptedModel, call, capture_events, reply


def tool_results(messages: Any) -> list[ToolResult]:
    return [m for m in messages if isinstance(m, ToolResult)]


async def run_once(
    tools: list[Any], middleware: list[Any], *calls: ToolCall, after: str = "done"
) -> tuple[Any, tuple[Any, ...], list[Any], ScriptedModel]:
    model = ScriptedModel([reply("", *calls), after])
    with capture_events() as events:
        async with Session(Agent(model=model, tools=tools, middleware=middleware)) as session:
            result = await session.run("go")
            history = session.conversation_messages
    check_pairing(history, allow_pending=False)
    return result, history, events, model


class TestToolFailuresReachLayers:
    """A tool's exception travels the tool onion as a ToolError; the loop answers it."""

    async def test_a_tool_layer_sees_the_tools_exception(self) -> None:
        """An outer tool layer catches ToolError with the original exception attached."""
        seen: list[BaseException | None] = []

        @tool_layer
        async def watch(call: ToolCall, ctx: Any, call_next: Any) -> ToolResult:
            try:
                return await call_next(call, ctx)
            except ToolError as failure:
                seen.append(failure.error)
                return ToolResult.for_call(call, "handled by the layer", is_error=True)

        broken = FakeTool("broken", returns=KeyError("k"))
        _, history, events, _ = await run_once([broken.tool], [watch], call("broken"))
        assert [type(e) for e in seen] == [KeyError]
        assert tool_results(history)[0].content == "handled by the layer"
        assert not [e for e in events if isinstance(e, ToolFailed)]

    async def test_without_layers_the_model_reads_the_same_error_as_before(self) -> None:
        """No layer: the failure becomes 'Error (Type): text' and one ToolFailed event."""
        broken = FakeTool("broken", returns=OSError("disk on fire"))
        _, history, events, model = await run_once([broken.tool], [], call("broken"))
        (result,) = tool_results(history)
        assert (result.content, result.is_error) == ("Error (OSError): disk on fire", True)
        assert result in model.requests[-1].messages
        failed = [(e.error_type, e.error) for e in events if isinstance(e, ToolFailed)]
        assert failed == [("OSError", "disk on fire")]

    async def test_budget_cuts_the_error_text_and_keeps_the_exception(self) -> None:
        """ToolResultBudget shortens a huge error; layers outside still see a ToolError."""
        seen: list[str] = []

        @tool_layer
        async def outer(call: ToolCall, ctx: Any, call_next: Any) -> ToolResult:
            try:
                return await call_next(call, ctx)
            except ToolError as failure:
                seen.append(failure.error_type)
                raise

        broken = FakeTool("broken", returns=ValueError("x" * 5000))
        budget = ToolResultBudget(budget_bytes=200)
        _, history, _, _ = await run_once([broken.tool], [outer, budget], call("broken"))
        (result,) = tool_results(history)
        assert seen == ["ValueError"]
        assert result.is_error
        assert result.content.startswith("Error (ValueError): xxx")
        assert len(result.content.encode()) <= 200


class TestToolRetryInsideTheBudget:
    """An exhausted retry's error text stays within an outer ToolResultBudget."""

    async def test_the_final_failure_text_is_within_the_budget(self) -> None:
        """Budget outside the retry: the note 'failed after N attempts' is budgeted too."""
        broken = FakeTool("broken", returns=ValueError("x" * 5000))
        budget = ToolResultBudget(budget_bytes=200)
        retry = ToolRetry(attempts=2, backoff=0)
        _, history, _, _ = await run_once([broken.tool], [budget, retry], call("broken"))
        (result,) = tool_results(history)
        assert result.is_error
        assert len(result.content.encode()) <= 200
        assert len(broken.calls) == 2

    def test_a_retry_outside_the_budget_is_refused_naming_both(self) -> None:
        """ToolRetry outside ToolResultBudget is an ordering error with a working order."""
        with pytest.raises(OrderingError, match="ToolRetry") as info:
            Agent(
                model=ScriptedModel(["x"]),
                middleware=[ToolRetry(), ToolResultBudget(budget_bytes=200)],
            )
        assert "ToolResultBudget" in str(info.value)


class TestToolRetry:
    """Retries of failing tools: attempts, exhaustion, and what is never retried."""

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"attempts": 0}, "attempts"),
            ({"backoff": -1}, "backoff"),
            ({"retry_on": 3}, "retry_on"),
            ({"tools": []}, "tools"),
            ({"tools": 5}, "tools"),
            ({"on_failure": "continue"}, "on_failure"),
        ],
    )
    def test_bad_configuration(self, kwargs: dict[str, Any], field: str) -> None:
        """Bad options fail at construction naming the field."""
        with pytest.raises(ConfigError) as info:
            ToolRetry(**kwargs)
        assert info.value.field == field

    async def test_fails_twice_then_succeeds(self) -> None:
        """A flaky tool is called three times; the model sees only the success."""
        flaky = FakeTool("flaky", returns=[ConnectionError("reset"), TimeoutError(), "fetched"])
        result, history, events, _ = await run_once(
            [flaky.tool], [ToolRetry(attempts=3, backoff=0)], call("flaky", id="f1")
        )
        assert len(flaky.calls) == 3
        assert [r.content for r in tool_results(history)] == ["fetched"]
        failed = [
            (e.attempt, e.outcome, e.error_type) for e in events if isinstance(e, ToolRetryFailed)
        ]
        assert failed == [(1, "retry", "ConnectionError"), (2, "retry", "TimeoutError")]
        succeeded = [(e.attempt, e.tool_call_id) for e in events if isinstance(e, ToolRetryAttempt)]
        assert succeeded == [(3, "f1")]
        assert not [e for e in events if isinstance(e, ToolFailed)]
        assert result.final_text == "done"

    async def test_exhausted_retries_answer_the_model_and_the_run_goes_on(self) -> None:
        """After the last attempt the model reads the error and how often it was tried."""
        down = FakeTool("down", returns=ConnectionError("refused"))
        result, history, events, model = await run_once(
            [down.tool], [ToolRetry(attempts=2, backoff=0)], call("down")
        )
        assert len(down.calls) == 2
        (answer,) = tool_results(history)
        assert answer.is_error
        assert answer.content == "Error (ConnectionError): refused (failed after 2 attempts)"
        assert answer in model.requests[-1].messages
        assert result.final_text == "done"
        assert [e.outcome for e in events if isinstance(e, ToolRetryFailed)] == [
            "retry",
            "exhausted",
        ]
        assert len([e for e in events if isinstance(e, ToolFailed)]) == 1

    async def test_exhausted_retries_with_a_formatter(self) -> None:
        """A formatter's text is the error result when attempts run out."""
        down = FakeTool("down", returns=ConnectionError("refused"))
        retry = ToolRetry(
            attempts=2,
            backoff=0,
            on_failure=lambda failure, n: f"{failure.call.name} is down ({n} tries)",
        )
        _, history, _, _ = await run_once([down.tool], [retry], call("down"))
        assert tool_results(history)[0].content == "down is down (2 tries)"

    async def test_exhausted_retries_raise_the_tools_exception(self) -> None:
        """on_failure='raise' ends the run with the tool's own exception; pairing holds."""
        down = FakeTool("down", returns=ConnectionError("refused"))
        other = FakeTool("other")
        model = ScriptedModel([reply("", call("down"), call("other")), "never"])
        agent = Agent(
            model=model,
            tools=[down.tool, other.tool],
            middleware=[ToolRetry(attempts=3, backoff=0, on_failure="raise")],
        )
        async with Session(agent) as session:
            with pytest.raises(ConnectionError, match="refused"):
                await session.run("go")
            check_pairing(session.conversation_messages, allow_pending=False)
        assert len(down.calls) == 3
        assert other.calls == []

    async def test_errors_retry_on_does_not_accept_pass_through(self) -> None:
        """A failure retry_on refuses is answered at once, as without the layer."""
        broken = FakeTool("broken", returns=ValueError("bad input"))
        _, history, events, _ = await run_once(
            [broken.tool], [ToolRetry(backoff=0, retry_on=(ConnectionError,))], call("broken")
        )
        assert len(broken.calls) == 1
        assert tool_results(history)[0].content == "Error (ValueError): bad input"
        (failed,) = [e for e in events if isinstance(e, ToolRetryFailed)]
        assert (failed.outcome, failed.reason) == ("raise", "not accepted by retry_on")

    async def test_wrong_calls_are_never_retried(self) -> None:
        """An unknown tool or arguments that fail the schema are not worth another try."""

        @tool
        async def add(a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

        _, history, _, _ = await run_once(
            [add],
            [ToolRetry(attempts=5, backoff=0)],
            call("nope", id="u"),
            call("add", id="v", a="one", b=2),
        )
        contents = [r.content for r in tool_results(history)]
        assert contents[0].startswith("Error (UnknownTool): unknown tool 'nope'")
        assert contents[1].startswith("Error (InvalidArguments): invalid arguments for tool 'add'")

    async def test_only_the_chosen_tools_are_retried(self) -> None:
        """tools=[...] limits retrying to those names."""
        flaky = FakeTool("flaky", returns=[OSError("a"), "ok"])
        fragile = FakeTool("fragile", returns=[OSError("b"), "ok"])
        _, history, _, _ = await run_once(
            [flaky.tool, fragile.tool],
            [ToolRetry(backoff=0, tools=["flaky"])],
            call("flaky"),
            call("fragile"),
        )
        assert (len(flaky.calls), len(fragile.calls)) == (2, 1)
        assert [r.content for r in tool_results(history)] == ["ok", "Error (OSError): b"]

    async def test_cancellation_is_checked_before_every_attempt(self) -> None:
        """A run cancelled while a tool fails gets no further attempt."""

        def fail_and_cancel(arguments: Any, ctx: Any) -> Any:
            ctx.cancellation.cancel("user left")
            return ConnectionError("reset")

        flaky = FakeTool("flaky", returns=fail_and_cancel)
        model = ScriptedModel([reply("", call("flaky")), "never"])
        agent = Agent(model=model, tools=[flaky.tool], middleware=[ToolRetry(backoff=0)])
        async with Session(agent) as session:
            with pytest.raises(RunCancelled) as info:
                await session.run("go")
            check_pairing(session.conversation_messages, allow_pending=False)
        assert info.value.checkpoint == "tool_retry.before_attempt"
        assert len(flaky.calls) == 1

    async def test_a_pending_pause_is_never_retried_over(self) -> None:
        """A tool that asked to pause and then failed is answered, and the run pauses."""
        pausing = FakeTool("pausing", returns=OSError("half done"), control=Interrupt("ask"))
        model = ScriptedModel([reply("", call("pausing")), "after"])
        agent = Agent(model=model, tools=[pausing.tool], middleware=[ToolRetry(backoff=0)])
        async with Session(agent) as session:
            with pytest.raises(Interrupted):
                await session.run("go")
            assert len(pausing.calls) == 1
            (answer,) = tool_results(session.conversation_messages)
            assert answer.content == "Error (OSError): half done"


class TestRetryOnFailure:
    """Retry(on_failure=...): raise when attempts run out, or end the run with a message."""

    def test_bad_on_failure(self) -> None:
        """Only 'raise', 'continue' or a function are accepted."""
        with pytest.raises(ConfigError) as info:
            Retry(on_failure="ignore")  # type: ignore[arg-type]
        assert info.value.field == "on_failure"

    @pytest.mark.parametrize(
        "formatter",
        [
            lambda exc: "one argument",
            lambda: "none",
            lambda exc, attempts, extra: "three",
            lambda exc, attempts, *, must: "a required keyword",
        ],
        ids=["one", "none", "three", "keyword"],
    )
    @pytest.mark.parametrize("layer", ["Retry", "ToolRetry"])
    def test_a_formatter_that_cannot_take_error_and_attempts_is_refused(
        self, layer: str, formatter: Any
    ) -> None:
        """Checked when built (ConfigError naming on_failure), not when retries run out."""
        build = Retry if layer == "Retry" else ToolRetry
        with pytest.raises(
            ConfigError, match=r"\(error, attempts\) -> str \(its signature"
        ) as info:
            build(on_failure=formatter)
        assert (info.value.field, info.value.owner) == ("on_failure", layer)

    @pytest.mark.parametrize(
        "formatter",
        [
            lambda exc, attempts: "two",
            lambda *args: "any",
            lambda exc, attempts=1, more=2: "x",
            str,
        ],
        ids=["two", "varargs", "defaults", "builtin"],
    )
    def test_a_formatter_that_takes_both_is_accepted(self, formatter: Any) -> None:
        """Two positional parameters (or *args, or defaults after them) are fine."""
        Retry(on_failure=formatter)
        ToolRetry(on_failure=formatter)

    async def test_exhausted_with_raise_is_todays_behaviour(self) -> None:
        """The last error reaches the caller."""
        model = ScriptedModel([ConnectionError("one"), ConnectionError("two")])
        agent = Agent(model=model, middleware=[Retry(attempts=2, backoff=0)])
        async with Session(agent) as session:
            with pytest.raises(ConnectionError, match="two"):
                await session.run("go")
        assert model.calls == 2

    async def test_exhausted_with_continue_ends_the_run_naming_the_error(self) -> None:
        """'continue' ends the run (stopped) with an assistant message about the error."""
        model = ScriptedModel([ConnectionError("one"), ConnectionError("two")])
        agent = Agent(model=model, middleware=[Retry(attempts=2, backoff=0, on_failure="continue")])
        with capture_events() as events:
            async with Session(agent) as session:
                result = await session.run("go")
                history = session.conversation_messages
        assert result.status == "stopped"
        assert result.final_text == (
            "I could not get an answer: the model call failed after 2 attempts "
            "(ConnectionError: two)."
        )
        assert history[-1].text == result.final_text
        assert [e.outcome for e in events if isinstance(e, RetryFailed)] == ["retry", "continue"]
        assert [e.control for e in events if isinstance(e, ControlApplied)] == ["stop_with_final"]

    async def test_exhausted_with_a_formatter(self) -> None:
        """A formatter's text is the run's final answer."""
        model = ScriptedModel([TimeoutError()])
        retry = Retry(
            attempts=1, backoff=0, on_failure=lambda exc, n: f"sorry ({type(exc).__name__})"
        )
        async with Session(Agent(model=model, middleware=[retry])) as session:
            result = await session.run("go")
        assert (result.status, result.final_text) == ("stopped", "sorry (TimeoutError)")

    async def test_errors_not_retried_still_raise_under_continue(self) -> None:
        """'continue' covers exhausted retries only; an error retry_on refuses raises."""
        model = ScriptedModel([ValueError("bug")])
        agent = Agent(model=model, middleware=[Retry(backoff=0, on_failure="continue")])
        async with Session(agent) as session:
            with pytest.raises(ValueError, match="bug"):
                await session.run("go")


class TestToolRetryProperty:
    """Whatever the failures and the attempts, each call is tried as often as it should be."""

    @given(
        plan=st.lists(st.integers(0, 4), min_size=1, max_size=4),
        attempts=st.integers(1, 4),
    )
    async def test_calls_are_tried_until_success_or_attempts_run_out(
        self, plan: list[int], attempts: int
    ) -> None:
        """Call i fails plan[i] times: it runs min(plan[i] + 1, attempts) times, one result."""
        fakes = [
            FakeTool(f"t{i}", returns=[ConnectionError(f"e{i}")] * failures + [f"ok {i}"])
            for i, failures in enumerate(plan)
        ]
        calls = [call(f"t{i}", id=f"c{i}") for i in range(len(plan))]
        _, history, events, _ = await run_once(
            [f.tool for f in fakes], [ToolRetry(attempts=attempts, backoff=0)], *calls
        )
        results = tool_results(history)
        assert [r.tool_call_id for r in results] == [c.id for c in calls]
        for i, (failures, fake, result) in enumerate(zip(plan, fakes, results, strict=True)):
            assert len(fake.calls) == min(failures + 1, attempts)
            if failures < attempts:
                assert (result.content, result.is_error) == (f"ok {i}", False)
            else:
                assert result.is_error
                assert f"(failed after {attempts} attempt" in result.content
        failed = [e for e in events if isinstance(e, ToolRetryFailed)]
        assert len(failed) == sum(min(f, attempts) for f in plan)

"""The conformance kit: check_layer catches each broken rule and passes every built-in layer."""

from __future__ import annotations

import time
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from tinyctx import (
    AssistantMessage,
    ConfigError,
    Interrupted,
    Layer,
    ModelRequest,
    ModelResponse,
    RunConfig,
    RunContext,
    Suspend,
    ToolResult,
)
from tinyctx.middleware import (
    Approvals,
    BudgetGuard,
    CallLimits,
    ClearOldImages,
    ControlOutcomes,
    ExtractiveSummarizer,
    Fallback,
    Inherit,
    Microcompact,
    Retry,
    SessionMemory,
    Summarize,
    ToolResultBudget,
    ToolRetry,
)
from tinyctx.ordering import Outside
from tinyctx.otel import OtelExporter
from tinyctx.testing.conformance import RULES, LayerContractError, check_layer

SMALL_WINDOW = RunConfig(model="kit", max_tokens=1200, reserved_output_tokens=200)
# generated histories hold screenshots and PDFs (up to ~18K tokens in one tool turn): the
# guard's window must fit the newest turn, or refusing the prompt is the right answer
MEDIA_WINDOW = RunConfig(model="kit", max_tokens=32_000, reserved_output_tokens=200)


async def spare_model(request: ModelRequest, ctx: RunContext[Any]) -> ModelResponse:
    return ModelResponse(AssistantMessage("from the spare"))


class DropsToolResults(Layer):
    async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
        kept = tuple(m for m in request.messages if not isinstance(m, ToolResult))
        return await call_next(request.evolve(messages=kept), ctx)


class SwallowsInterrupted(Layer):
    async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
        try:
            return await call_next(request, ctx)
        except Interrupted:
            return ModelResponse(AssistantMessage("never mind the human"))


class SwallowsSuspend(Layer):
    async def wrap_tool(self, call: Any, ctx: Any, call_next: Any) -> Any:
        try:
            return await call_next(call, ctx)
        except Suspend as exc:  # answers a suspended call: its sub-agent's review is lost
            return ToolResult.for_call(call, f"paused: {exc.node}", is_error=True)


class CountsOnSelf(Layer):
    def __init__(self) -> None:
        self.count = 0

    async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
        self.count += 1
        return await call_next(request, ctx)


class SleepsSync(Layer):
    async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
        time.sleep(0.2)  # noqa: ASYNC251 - the broken layer under test
        return await call_next(request, ctx)


class EditsRequestInPlace(Layer):
    async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
        messages = list(request.messages)  # the list it was handed...
        messages.append(AssistantMessage("(note)"))
        object.__setattr__(request, "messages", tuple(messages))  # ...written back in place
        return await call_next(request, ctx)


class DropsSecondToolTurn(Layer):
    """Breaks pairing only when a request holds two tool results: needs a generated case."""

    async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
        results = [m for m in request.messages if isinstance(m, ToolResult)]
        if len(results) >= 3:
            kept = tuple(m for m in request.messages if m is not results[-1])
            request = request.evolve(messages=kept)
        return await call_next(request, ctx)


class RetriesAfterCancel(Layer):
    async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
        for _ in range(3):
            try:
                return await call_next(request, ctx)
            except Exception:
                continue
        return ModelResponse(AssistantMessage("gave up"))


class TestBrokenLayersAreCaught:
    """Each deliberately broken layer fails with the rule it breaks named."""

    @pytest.mark.parametrize(
        ("layer", "rule"),
        [
            (DropsToolResults(), "pairing"),
            (SwallowsInterrupted(), "control-passthrough"),
            (CountsOnSelf(), "state-leak"),
            (SleepsSync(), "blocking"),
            (EditsRequestInPlace(), "no-mutation"),
            (RetriesAfterCancel(), "control-passthrough"),
            (SwallowsSuspend(), "control-passthrough"),
        ],
        ids=lambda v: v if isinstance(v, str) else type(v).__name__,
    )
    def test_named_rule(self, layer: Layer, rule: str) -> None:
        """The error names the layer, the rule, why, an example and the doc section."""
        with pytest.raises(LayerContractError) as info:
            check_layer(layer, max_examples=10)
        error = info.value
        assert error.rule == rule
        text = str(error)
        assert f"layer {layer.name!r} breaks rule {rule!r}" in text
        assert "why: " in text
        assert "example: history=" in text
        # a page pip users have, by title and section: no repository path
        assert f'see: the tinyctx docs, page "Testing your layer", section "Rule: {rule}"' in text
        assert "docs/" not in text

    def test_generated_failure_is_shrunk(self) -> None:
        """A failure that needs a generated conversation is reported on the shrunk one."""
        with pytest.raises(LayerContractError) as info:
            check_layer(DropsSecondToolTurn(), max_examples=60)
        assert info.value.rule == "pairing"
        # shrunk: no more tool results than the failure needs, and no long texts
        assert info.value.example.count("ToolResult(") <= 3
        assert len(info.value.example) < 2000

    def test_the_shrunk_example_pastes_into_a_test(self) -> None:
        """The example is root-API Python: it evaluates to paired messages, no defaults."""
        import tinyctx
        from tinyctx.messages import check_pairing

        with pytest.raises(LayerContractError) as info:
            check_layer(DropsSecondToolTurn(), max_examples=60)
        names = {name: getattr(tinyctx, name) for name in tinyctx.__all__}
        values = eval(f"dict({info.value.example})", names)  # noqa: S307 - our own text
        assert values["history"] and all(isinstance(m, tinyctx.Message) for m in values["history"])
        check_pairing(values["history"])
        assert all(isinstance(c, tinyctx.ToolCall) for c in values["tool_calls"])
        assert "FrozenDict(" not in info.value.example
        assert "invalid_arguments=None" not in info.value.example

    def test_swallowed_cancellation_token_is_caught(self) -> None:
        """A layer calling on after the run's token is cancelled breaks 'cancellation'."""

        class IgnoresToken(Layer):
            async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
                try:
                    return await call_next(request, ctx)
                except BaseException:
                    return await call_next(request, ctx)

        with pytest.raises(LayerContractError) as info:
            check_layer(IgnoresToken(), max_examples=5)
        assert info.value.rule in ("control-passthrough", "cancellation")

    def test_inconsistent_ordering_is_caught(self) -> None:
        """A layer whose own ordering rules contradict breaks 'ordering'."""

        class Torn(Layer):
            constraints = (Outside("Torn"),)

            async def wrap_model(self, request: Any, ctx: Any, call_next: Any) -> Any:
                return await call_next(request, ctx)

        with pytest.raises(LayerContractError, match="breaks rule 'ordering'"):
            check_layer(Torn(), max_examples=5)


def builtin_layers() -> list[tuple[Layer, RunConfig | None]]:
    return [
        (BudgetGuard(), MEDIA_WINDOW),
        (Microcompact(), None),
        (Microcompact(keep_recent=1), SMALL_WINDOW),
        (Microcompact(keep_recent=1, keep_images=1), None),
        (ClearOldImages(1), None),
        (Summarize(ExtractiveSummarizer(), keep_recent=2), SMALL_WINDOW),
        (ToolResultBudget(64), None),
        (ControlOutcomes(), None),
        (CallLimits(model_calls=50, tool_calls=50), None),
        (Retry(attempts=3, backoff=0), None),
        (Fallback(spare_model), None),
        (SessionMemory(), None),
        (Inherit(), None),
        (Approvals(["lookup"]), None),
        (Approvals(lambda call: call.arguments.get("n") == 2, name="ApprovalsByCall"), None),
        (ToolRetry(attempts=2, backoff=0), None),
        (CallLimits(per_tool={"lookup": 1}, exit="continue", name="ContinueLimits"), None),
        (OtelExporter(TracerProvider(), capture_content=True).content_layer(), None),
    ]


class TestBuiltinsPass:
    """Every built-in layer keeps every rule: this is how they are held to the rules."""

    @pytest.mark.parametrize(
        ("layer", "config"),
        builtin_layers(),
        ids=lambda v: type(v).__name__ if isinstance(v, Layer) else "",
    )
    def test_builtin(self, layer: Layer, config: RunConfig | None) -> None:
        """check_layer passes and reports every rule checked on the layer's hooks."""
        report = check_layer(layer, max_examples=15, config=config)
        assert report.skipped == {}
        expected = set(RULES) - ({"idempotence"} if not layer.idempotent else set())
        assert set(report.checked) == expected
        assert report.examples >= 1


class TestOptions:
    """Skipping is explicit and checked; bad options fail at once."""

    def test_skip_needs_a_known_rule_and_a_reason(self) -> None:
        """An unknown rule or an empty reason is a ConfigError naming the allowed values."""
        with pytest.raises(ConfigError, match="one of pairing"):
            check_layer(Retry(), skip={"speed": "slow"})
        with pytest.raises(ConfigError, match="non-empty reason"):
            check_layer(Retry(), skip={"blocking": " "})

    def test_skipped_rule_is_not_enforced_and_is_reported(self) -> None:
        """A skipped rule's failure is ignored, and the report says why it was skipped."""
        report = check_layer(SleepsSync(), skip={"blocking": "wraps a sync SDK"}, max_examples=3)
        assert "blocking" not in report.checked
        assert report.skipped == {"blocking": "wraps a sync SDK"}

    def test_bad_options(self) -> None:
        """hooks, backends and max_examples are validated."""
        with pytest.raises(ConfigError, match="hooks"):
            check_layer(Retry(), hooks=("stream",))
        with pytest.raises(ConfigError, match="backends"):
            check_layer(Retry(), backends=("curio",))
        with pytest.raises(ConfigError, match="max_examples"):
            check_layer(Retry(), max_examples=0)

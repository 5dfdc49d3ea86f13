"""What a policy costs: prices, prompt-cache accounting, sweeps, and the cache-aware layers."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyctx import (
    AssistantMessage,
    ConfigError,
    Message,
    ModelRequest,
    RunConfig,
    RunContext,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.chain import LayerLike
from tinyctx.cli import main
from tinyctx.conversation import Conversation
from tinyctx.cost import (
    PRICES,
    ModelPrice,
    PromptShape,
    SweepPoint,
    compare_curves,
    cost_at,
    frontier,
    load_price_table,
    parse_price,
    price_calls,
    price_for,
    price_replay,
    sweep,
)
from tinyctx.formats import load_transcript
from tinyctx.messages import check_pairing
from tinyctx.middleware import (
    BudgetGuard,
    ClearOldImages,
    ExtractiveSummarizer,
    Microcompact,
    Summarize,
    ToolResultBudget,
)
from tinyctx.middleware.microcompact import CLEARED_ARGUMENTS, microcompact_history
from tinyctx.middleware.stacks import default_stack, seed_order_stack
from tinyctx.middleware.triggers import keep, trigger
from tinyctx.replay import replay_sync
from tinyctx.testing import ScriptedModel, run_layer
from tinyctx.testing.strategies import histories, requests
from tinyctx.tokens import TokenCounter, default_counter

SONNET = PRICES["claude-sonnet-4-5"]


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def shapes(*histories_: tuple[Message, ...], tokens: int = 600) -> list[PromptShape]:
    return [PromptShape(h, (tokens,) * len(h), 10, 5, None) for h in histories_]


def history(n: int) -> tuple[Message, ...]:
    return tuple(UserMessage(f"message {i}") for i in range(n))


def real(shared: Path) -> list[tuple[str, tuple[Message, ...]]]:
    folder = shared / "transcripts"
    files = [
        *sorted((folder / "openai").glob("*.jsonl")),
        *sorted((folder / "multimodal" / "openai").glob("*.jsonl")),
        *sorted((folder / "raw").glob("*.traj")),
    ]
    return [(p.name, tuple(load_transcript(p))) for p in files]


CAPTCHA = "multimodal/openai/bytedance__UI-TARS-desktop__responses-api-captcha-doubao-1.6.jsonl"


def contenders(counter: TokenCounter) -> dict[str, Callable[[], list[LayerLike]]]:
    """The named stacks and each context layer at its defaults."""
    return {
        "default_stack": lambda: default_stack(counter=counter),
        "seed_order_stack": lambda: seed_order_stack(counter=counter),
        "BudgetGuard": lambda: [BudgetGuard(counter=counter)],
        "Microcompact": lambda: [Microcompact(counter=counter)],
        "Summarize": lambda: [Summarize(ExtractiveSummarizer(), counter=counter)],
        "ToolResultBudget": lambda: [ToolResultBudget()],
        "ClearOldImages": lambda: [ClearOldImages(counter=counter)],
    }


class TestPriceTable:
    """Built-in prices, custom TOML tables, and errors naming the field."""

    def test_known_models_by_exact_name_and_by_dated_name(self) -> None:
        """A dated model id resolves to its family's prices."""
        assert price_for("claude-sonnet-4-5") is SONNET
        assert price_for("claude-sonnet-4-5-20250929") is SONNET
        assert price_for("gpt-4o-mini-2024-07-18").name == "gpt-4o-mini"
        assert SONNET.cache_read == pytest.approx(0.1 * SONNET.input)
        assert SONNET.cache_write == pytest.approx(1.25 * SONNET.input)
        assert price_for("gpt-4o").caching == "automatic"

    def test_unknown_model_names_the_field_and_the_known_ones(self) -> None:
        """An unknown model is a ConfigError listing what is known."""
        with pytest.raises(ConfigError, match=r"model='nope'.*claude-sonnet-4-5"):
            price_for("nope")

    @pytest.mark.parametrize(
        ("values", "field"),
        [
            ({"output": 1}, "input"),
            ({"input": -1, "output": 1}, "input"),
            ({"input": 1, "output": 1, "caching": "sometimes"}, "caching"),
            ({"input": 1, "output": 1, "min_cacheable": 1.5}, "min_cacheable"),
            ({"input": 1, "output": 1, "colour": "red"}, "colour"),
            ({"input": True, "output": 1}, "input"),
        ],
    )
    def test_bad_price_values_name_the_field(self, values: dict[str, Any], field: str) -> None:
        """Each bad key of a price table is a ConfigError naming that key."""
        with pytest.raises(ConfigError) as info:
            parse_price("mine", values)
        assert info.value.field == field
        assert "price.mine" in str(info.value)

    def test_toml_table_loads_with_defaults(self, tmp_path: Path) -> None:
        """A TOML table gives prices; cache prices default from the caching rule."""
        path = tmp_path / "prices.toml"
        path.write_text('[models.house]\ninput = 2.0\noutput = 8.0\ncaching = "automatic"\n')
        table = load_price_table(path)
        assert table["house"] == ModelPrice("house", 2.0, 8.0, 2.0, 2.0, "automatic")

    def test_toml_errors_name_the_file_and_the_field(self, tmp_path: Path) -> None:
        """A bad TOML price names the file and models.<name>.<field>."""
        path = tmp_path / "prices.toml"
        path.write_text("[models.house]\ninput = 2.0\noutput = 'cheap'\n")
        with pytest.raises(ConfigError, match=r"prices.toml: models.house.output='cheap'"):
            load_price_table(path)
        path.write_text("[other]\nx = 1\n")
        with pytest.raises(ConfigError, match=r"\[models.<name>\]"):
            load_price_table(path)


class TestPrefixAccounting:
    """The cached prefix is the longest prefix shared with the previous call's prompt."""

    def test_a_growing_history_reads_what_the_previous_call_sent(self) -> None:
        """Appending keeps the prefix: each call reads the previous prompt from the cache."""
        report = price_calls(shapes(history(3), history(5), history(6)), SONNET)
        first, second, third = report.calls
        assert (first.cache_read, first.cache_write) == (0, first.prompt_tokens)
        assert second.cache_read == first.prompt_tokens and not second.broke
        assert second.cache_write == second.prompt_tokens - first.prompt_tokens
        assert report.breaks == 0

    def test_a_rewrite_breaks_the_prefix_where_it_differs(self) -> None:
        """Changing message 2 breaks the prefix at index 2: only messages 0-1 are read."""
        before = history(5)
        after = (*before[:2], UserMessage("summary"), *before[4:])
        report = price_calls(shapes(before, after), SONNET)
        call = report.calls[1]
        assert call.broke and call.break_at == 2
        assert call.cache_read == 10 + 2 * 600
        assert call.cache_write == call.prompt_tokens - call.cache_read
        expected = (call.cache_read * 0.3 + call.cache_write * 3.75 + 5 * 15.0) / 1e6
        assert call.cost == pytest.approx(expected)

    def test_short_prompts_are_not_cached_and_openai_rounds_to_128(self) -> None:
        """Under the minimum nothing is cached; automatic caching reads in 128-token steps."""
        small = price_calls(shapes(history(1), history(2), tokens=100), SONNET)
        assert all(c.uncached == c.prompt_tokens for c in small.calls)
        gpt = price_calls(shapes(history(3), history(4)), PRICES["gpt-4o"])
        call = gpt.calls[1]
        assert call.cache_read == (10 + 3 * 600) // 128 * 128
        assert call.cache_write == 0 and call.uncached == call.prompt_tokens - call.cache_read

    @given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=12))
    def test_tokens_add_up_and_appends_never_break(self, lengths: list[int]) -> None:
        """read + written + uncached is the prompt, and append-only calls never break."""
        full = history(max(lengths))
        grown = [full[:n] for n in sorted(lengths)]
        report = price_calls(shapes(*grown), SONNET)
        for call in report.calls:
            assert call.cache_read + call.cache_write + call.uncached == call.prompt_tokens
            assert call.cost > 0
        assert report.breaks == 0

    def test_frontier_drops_dominated_and_failed_points(self) -> None:
        """A setting that keeps less context for more money, or overflows, is no choice."""
        points = [
            SweepPoint(0.1, 1000, 1.0, 0, 5),
            SweepPoint(0.2, 900, 1.5, 0, 5),  # less context, more money
            SweepPoint(0.3, 3000, 3.0, 0, 5),
            SweepPoint(0.4, 5000, 0.5, 0, 5, error="2 calls over"),
        ]
        assert [p.value for p in frontier(points)] == [0.1, 0.3]

    @given(
        points=st.lists(
            st.builds(
                SweepPoint,
                value=st.floats(0, 1),
                average_prompt_tokens=st.floats(100, 100_000),
                cost=st.floats(0.01, 100),
                breaks=st.integers(0, 50),
                calls=st.integers(1, 200),
                error=st.sampled_from([None, None, None, "over"]),
            ),
            max_size=12,
        ),
        factor=st.floats(0.5, 1.0),
    )
    def test_curve_comparison_properties(self, points: list[SweepPoint], factor: float) -> None:
        """The frontier rises strictly in both coordinates; a curve is below itself and below
        itself made dearer, and the comparison stays within the range both cover."""
        front = frontier(points)
        for a, b in zip(front, front[1:], strict=False):
            assert a.average_prompt_tokens < b.average_prompt_tokens and a.cost < b.cost
        for p in points:  # every good point is on the frontier or dominated by a point on it
            if p.error is None:
                assert any(
                    q.average_prompt_tokens >= p.average_prompt_tokens and q.cost <= p.cost
                    for q in front
                )
        cheaper = [attrs.evolve(p, cost=p.cost * factor) for p in points]
        same = compare_curves(points, points)
        assert same.below is bool(front)
        comparison = compare_curves(cheaper, points)
        assert comparison.below is bool(front)
        for x, ours, theirs in comparison.samples:
            assert comparison.low <= x <= comparison.high
            assert ours <= theirs * (1 + 1e-9)
            assert cost_at(cheaper, x) == pytest.approx(ours)

    def test_compare_curves_only_where_both_exist(self) -> None:
        """Curves that share no range of average prompt tokens are not compared at all."""
        ours = [SweepPoint(0.1, 1000, 1.0, 0, 5), SweepPoint(0.2, 2000, 2.0, 0, 5)]
        theirs = [SweepPoint(0.1, 3000, 0.5, 0, 5), SweepPoint(0.2, 4000, 0.6, 0, 5)]
        assert compare_curves(ours, theirs).samples == () and not compare_curves(ours, theirs).below
        overlap = [SweepPoint(0.1, 1500, 1.4, 0, 5), SweepPoint(0.2, 5000, 9.0, 0, 5)]
        comparison = compare_curves(ours, overlap)
        assert (comparison.low, comparison.high) == (1500, 2000)
        assert [x for x, _, _ in comparison.samples] == [1500, 2000]
        assert comparison.worst == pytest.approx((1500, 1.5, 1.4))  # dearer at 1500 tokens
        assert not comparison.below
        assert comparison.samples[1][1] < comparison.samples[1][2]  # cheaper at 2000

    def test_cost_at_interpolates_within_the_curve_only(self) -> None:
        """A curve answers between its points and not outside them."""
        points = [SweepPoint(0.2, 1000, 1.0, 0, 5), SweepPoint(0.4, 3000, 3.0, 0, 5)]
        assert cost_at(points, 2000) == pytest.approx(2.0)
        assert cost_at(points, 500) is None and cost_at(points, 3500) is None


class TestReplayCost:
    """The same numbers from the Python API, the table and --json."""

    def test_python_api_and_json_agree(self, shared_data: Path) -> None:
        """replay(...).cost() and `tinyctx replay --json --price` report the same totals."""
        path = (
            shared_data
            / "transcripts/openai/SWE-agent__mini-swe-agent__astropy-12907-deepseek-v4-flash.jsonl"
        )
        counter = default_counter()
        report = replay_sync(
            load_transcript(path),
            default_stack(counter=counter),
            window=32_000,
            reserved=4_000,
            counter=counter,
        )
        cost = report.cost("claude-sonnet-4-5")
        assert cost == price_replay(report, SONNET)
        code, out, _ = run_cli("replay", str(path), "--json", "--price", "claude-sonnet-4-5")
        assert code == 0
        payload = json.loads(out)
        assert payload["summary"]["total_cost_usd"] == pytest.approx(cost.total)
        assert payload["summary"]["prefix_breaks"] == cost.breaks
        calls = payload["calls"]
        assert [c["prefix_broke"] for c in calls] == [c.broke for c in cost.calls]
        assert sum(c["cache_read_tokens"] for c in calls) == cost.cache_read
        assert cost.cache_read > cost.cache_write  # an agent loop mostly reads its prefix

    def test_table_shows_cost_and_breaks(self) -> None:
        """The text output prints cost columns and the totals when a price is given."""
        code, out, _ = run_cli("replay", "--price", "gpt-4o")
        assert code == 0
        assert "total cost in USD" in out and "calls that broke the cached prefix" in out
        assert "written" in out and "read" in out

    def test_bad_price_flags_exit_2_naming_the_problem(self, tmp_path: Path) -> None:
        """An unknown model or a bad table is a usage error naming it."""
        code, _, err = run_cli("replay", "--price", "nope")
        assert code == 2 and "--price nope" in err
        bad = tmp_path / "p.toml"
        bad.write_text("[models.x]\ninput = 1\n")
        code, _, err = run_cli("replay", "--prices", str(bad))
        assert code == 3 and "models.x.output" in err


@pytest.mark.slow  # sweeps replay a transcript many times: CI's slow group runs it
class TestSweep:
    """The curve a user picks a low-water mark from."""

    def test_python_sweep_returns_one_point_per_value(self, shared_data: Path) -> None:
        """sweep() replays per value, in order, and a lower mark sends fewer tokens."""
        path = shared_data / "transcripts/openai/marot__spotter__cc-subagent-a2898e3.jsonl"
        counter = default_counter()
        points = sweep(
            load_transcript(path),
            lambda v: default_stack(counter=counter, low_water=v),
            [0.2, 0.6],
            window=32_000,
            reserved=4_000,
            counter=counter,
        )
        assert [p.value for p in points] == [0.2, 0.6]
        assert all(p.error is None and p.calls == 12 for p in points)
        assert points[0].average_prompt_tokens <= points[1].average_prompt_tokens

    def test_cli_sweep_prints_the_curve_json_and_chart(self, tmp_path: Path) -> None:
        """--sweep prints a table, puts the points in --json, and a panel in the chart."""
        code, out, _ = run_cli("replay", "--sweep", "0.3,0.6")
        assert code == 0 and "sweep of low_water" in out
        svg = tmp_path / "c.svg"
        code, out, _ = run_cli("replay", "--json", "--sweep", "0.3,0.6", "--plot", str(svg))
        points = json.loads(out)["sweep"]["points"]
        assert [p["value"] for p in points] == [0.3, 0.6] * 2  # with the relief run, without
        assert "sweep of low_water: cost against average prompt tokens" in svg.read_text()

    def test_python_sweep_labels_its_series(self, shared_data: Path) -> None:
        """sweep(series=...) labels every point, and only a labelled point says so in JSON."""
        path = shared_data / "transcripts/openai/marot__spotter__cc-subagent-a2898e3.jsonl"
        counter = default_counter()
        messages = load_transcript(path)
        for series in ("relief_run=0", None):
            (point,) = sweep(
                messages,
                lambda v: default_stack(counter=counter, low_water=v, relief_run=0),
                [0.4],
                window=32_000,
                reserved=4_000,
                counter=counter,
                series=series,
            )
            assert point.series == series
            assert point.to_json().get("series") == series
            assert ("series" in point.to_json()) is (series is not None)

    def test_cli_sweep_reaches_the_context_a_relief_run_holds_back(
        self, shared_data: Path, tmp_path: Path
    ) -> None:
        """With a relief run, --sweep replays each mark with it and without it, so the curve
        reaches the context a fast-growing agent keeps only without the run, and marks the
        settings worth picking."""
        path = shared_data / "transcripts/openai/marot__spotter__cc-main-4d5611e5.jsonl"
        svg = tmp_path / "c.svg"
        code, out, _ = run_cli(
            "replay", str(path), "--window", "32000", "--json", "--sweep", "0.4,0.6,0.8",
            "--plot", str(svg),
        )  # fmt: skip
        assert code == 0
        points = json.loads(out)["sweep"]["points"]
        assert [(p["series"], p["value"]) for p in points] == [
            ("relief_run=20", 0.4),
            ("relief_run=20", 0.6),
            ("relief_run=20", 0.8),
            ("relief_run=0", 0.4),
            ("relief_run=0", 0.6),
            ("relief_run=0", 0.8),
        ]
        most = {
            series: max(p["average_prompt_tokens"] for p in points if p["series"] == series)
            for series in ("relief_run=20", "relief_run=0")
        }
        assert most["relief_run=0"] > 1.15 * most["relief_run=20"]
        picked = sorted((p["average_prompt_tokens"], p["cost"]) for p in points if p["frontier"])
        assert picked and all(a[1] < b[1] for a, b in zip(picked, picked[1:], strict=False))
        for p in points:  # a point off the curve: another keeps as much for less
            if not p["frontier"]:
                assert any(
                    q["average_prompt_tokens"] >= p["average_prompt_tokens"]
                    and q["cost"] <= p["cost"]
                    for q in points
                    if q is not p
                )
        chart = svg.read_text()
        assert "relief_run=20" in chart and "relief_run=0" in chart
        code, out, _ = run_cli(
            "replay", str(path), "--window", "32000", "--sweep", "0.4,0.8"
        )  # fmt: skip
        assert code == 0 and "relief_run=0" in out and "pick" in out

    def test_cli_sweep_of_a_guard_without_relief_run_is_one_series(
        self, shared_data: Path, tmp_path: Path
    ) -> None:
        """A stack file whose guard has no relief run sweeps the mark alone; one that sets
        one gets the second series with the run off."""
        path = shared_data / "transcripts/openai/marot__spotter__cc-main-4d5611e5.jsonl"

        def swept(guard: str) -> list[dict[str, Any]]:
            stack = tmp_path / "stack.toml"
            stack.write_text(f'[[layers]]\nuse = "budget_guard"\n{guard}')
            code, out, _ = run_cli(
                "replay", str(path), "--window", "32000", "--json", "--stack", str(stack),
                "--sweep", "0.4,0.8",
            )  # fmt: skip
            assert code == 0
            points: list[dict[str, Any]] = json.loads(out)["sweep"]["points"]
            return points

        points = swept("")
        assert [p["value"] for p in points] == [0.4, 0.8]
        assert all("series" not in p for p in points)
        points = swept("relief_run = 10\n")
        assert [p["series"] for p in points] == ["relief_run=10"] * 2 + ["relief_run=0"] * 2

    def test_bad_sweep_values_exit_2(self) -> None:
        """A value that is no fraction is a usage error naming it."""
        code, _, err = run_cli("replay", "--sweep", "0.3,abc")
        assert code == 2 and "'abc'" in err
        code, _, err = run_cli("replay", "--sweep", "1.5")
        assert code == 2 and "1.5" in err


class TestRealTranscripts:
    """The cost claims on every real transcript, at 32K and 128K."""

    @pytest.mark.parametrize("window", [32_000, 128_000])
    @pytest.mark.slow  # whole-transcript replays at every window: CI's slow group runs it
    def test_never_worse_than_nothing_where_nothing_fits(
        self, shared_data: Path, window: int
    ) -> None:
        """Where no management fits, no named stack and no layer at its defaults costs more."""
        counter = default_counter()
        checked = 0
        for name, messages in real(shared_data):
            none = replay_sync(messages, [], window=window, reserved=4_000, counter=counter)
            if none.overflows_remaining:
                continue
            checked += 1
            baseline = none.cost().total
            for label, build in contenders(counter).items():
                report = replay_sync(
                    messages, build(), window=window, reserved=4_000, counter=counter
                )
                assert report.cost().total <= baseline * (1 + 1e-9), (name, label)
        assert checked >= 2

    def test_a_run_that_nearly_fills_the_window_costs_nothing_extra(
        self, shared_data: Path
    ) -> None:
        """A screenshot run whose last call fills 97% (then 100%) of the usable window: no
        named stack and no layer at its defaults rewrites it, so none costs more than
        sending it as it is."""
        counter = default_counter()
        messages = tuple(load_transcript(shared_data / "transcripts" / CAPTCHA))
        none = replay_sync(messages, [], window=32_000, reserved=4_000, counter=counter)
        peak = max(row.tokens for row in none.rows)
        assert none.overflows_remaining == 0 and none.peak_utilisation > 0.95
        for window in (32_000, peak + 4_000):
            baseline = replay_sync(messages, [], window=window, reserved=4_000, counter=counter)
            for label, build in contenders(counter).items():
                report = replay_sync(
                    messages, build(), window=window, reserved=4_000, counter=counter
                )
                assert report.cost().total <= baseline.cost().total * (1 + 1e-9), (window, label)
                assert report.cost().breaks == 0, (window, label)

    def test_default_stack_breaks_the_prefix_at_most_once_per_20_calls(
        self, shared_data: Path
    ) -> None:
        """At 32K, default_stack rewrites the cached prefix at most once per 20 calls."""
        counter = default_counter()
        for name, messages in real(shared_data):
            report = replay_sync(
                messages,
                default_stack(counter=counter),
                window=32_000,
                reserved=4_000,
                counter=counter,
            )
            assert report.error is None, name
            cost = report.cost()
            assert cost.breaks * 20 <= max(len(cost.calls), 20), (name, cost.breaks)


class TestLowWater:
    """The guard relieves in one batch down to a validated low-water mark."""

    def test_low_water_is_validated_and_has_no_other_name(self) -> None:
        """low_water above the trigger names the field; the pre-release ``target`` is gone."""
        with pytest.raises(ConfigError, match="low_water"):
            BudgetGuard(trigger=0.8, low_water=0.9)
        removed: dict[str, Any] = {"target": 0.5}
        with pytest.raises(TypeError, match="target"):
            BudgetGuard(**removed)
        with pytest.raises(ConfigError, match="TINYCTX_CONTEXT_TARGET"):
            BudgetGuard.from_env(environ={"TINYCTX_CONTEXT_TARGET": "0.5"})
        guard = BudgetGuard(low_water=0.4)
        assert guard.low_water == 0.4
        env = BudgetGuard.from_env(environ={"TINYCTX_CONTEXT_LOW_WATER": "35%"})
        assert env.low_water == pytest.approx(0.35)

    async def test_relief_goes_down_to_the_low_water_mark(self, anyio_backend: str) -> None:
        """After a relief the request is at or under the low-water mark."""
        turns: list[Message] = []
        for i in range(16):
            call = ToolCall(f"c{i}", "read", {"i": i})
            turns += [AssistantMessage("", (call,)), ToolResult(call.id, "x " * 900)]
        ctx = RunContext.new(
            config=RunConfig(max_tokens=10_000),
            conversation=Conversation([UserMessage("go"), *turns]),
        )
        counter = default_counter()
        guard = BudgetGuard(trigger=0.9, low_water=0.3, counter=counter, calibrate=False)
        model = ScriptedModel(["ok"])
        request = ModelRequest(messages=ctx.conversation.messages)
        assert counter.count_request(request) >= 0.9 * 10_000  # over the trigger
        await run_layer(guard, request, ctx, model)
        assert counter.count_request(model.requests[0]) <= 0.3 * 10_000


def tool_history(turns: int, size: int = 3000) -> tuple[Message, ...]:
    out: list[Message] = [UserMessage("start")]
    for i in range(turns):
        call = ToolCall(f"c{i}", "grep", {"pattern": f"needle {i}", "path": "src/"})
        out += [AssistantMessage("", (call,)), ToolResult(call.id, "line\n" * size)]
    return tuple(out)


class TestMicrocompactCacheAware:
    """Microcompact on its own acts only when worth a broken prefix."""

    async def test_default_trigger_leaves_a_fitting_request_alone(self, anyio_backend: str) -> None:
        """Under the usable window nothing is cleared; over it, old results are."""
        history_ = tool_history(8, size=300)
        counter = default_counter()
        tokens = counter.count_messages(history_)
        for window, expect_same in ((tokens + 1000, True), (tokens // 2, False)):
            ctx = RunContext.new(
                config=RunConfig(max_tokens=window), conversation=Conversation(history_)
            )
            model = ScriptedModel(["ok"])
            request = ModelRequest(messages=ctx.conversation.messages)
            await run_layer(Microcompact(keep_recent=2), request, ctx, model)
            assert (model.requests[0].messages == history_) is expect_same

    async def test_clear_at_least_keeps_the_prefix_for_small_savings(
        self, anyio_backend: str
    ) -> None:
        """Clearing that would free less than clear_at_least leaves the history as it is."""
        history_ = tool_history(4, size=50)
        for at_least, expect_same in ((10**6, True), (1, False)):
            ctx = RunContext.new(conversation=Conversation(history_))
            model = ScriptedModel(["ok"])
            layer = Microcompact(keep_recent=1, trigger=1, clear_at_least=at_least)
            await run_layer(layer, ModelRequest(messages=history_), ctx, model)
            assert (model.requests[0].messages == history_) is expect_same

    def test_clear_tool_inputs_clears_the_arguments_of_cleared_calls(self) -> None:
        """The calls of cleared results get {} arguments; ids and pairing survive."""
        history_ = tool_history(4)
        new, stats = microcompact_history(history_, keep_recent=1, clear_inputs=True)
        calls = [c for m in new if isinstance(m, AssistantMessage) for c in m.tool_calls]
        assert [c.arguments for c in calls[:3]] == [CLEARED_ARGUMENTS] * 3
        assert calls[3].arguments["pattern"] == "needle 3"
        assert stats.inputs_cleared == 3 and [c.id for c in calls] == ["c0", "c1", "c2", "c3"]
        check_pairing(new)

    @given(history_=histories(), keep_recent=st.integers(0, 3))
    def test_clearing_inputs_keeps_pairing_and_is_idempotent(
        self, history_: Sequence[Message], keep_recent: int
    ) -> None:
        """On any history: pairing kept, a second pass changes nothing, tokens never grow."""
        counter = default_counter()
        once, _ = microcompact_history(history_, keep_recent, clear_inputs=True, counter=counter)
        check_pairing(once)
        twice, _ = microcompact_history(once, keep_recent, clear_inputs=True, counter=counter)
        assert twice == once
        assert counter.count_messages(once) <= counter.count_messages(tuple(history_))

    def test_bad_options_name_the_field(self) -> None:
        """A bad trigger, clear_at_least or clear_tool_inputs is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="clear_at_least"):
            Microcompact(clear_at_least=-1)
        with pytest.raises(ConfigError, match="clear_tool_inputs"):
            Microcompact(clear_tool_inputs="yes")  # type: ignore[arg-type]
        removed: dict[str, Any] = {"min_tokens": 5}
        with pytest.raises(TypeError, match="min_tokens"):
            Microcompact(**removed)  # the pre-release spelling of trigger= is gone


class TestNeverActsOnWhatFits:
    """At their defaults the context layers leave a request that fits the window alone."""

    @given(
        request=requests(histories(max_turns=10)),
        slack=st.integers(0, 400),
        layer=st.sampled_from(["Microcompact", "Summarize", "ClearOldImages", "BudgetGuard"]),
    )
    async def test_a_request_that_fits_passes_untouched(
        self, request: ModelRequest, slack: int, layer: str
    ) -> None:
        """Any request within the usable window reaches the model as it is, and the
        conversation is not rewritten (no cached prefix broken)."""
        counter = default_counter()
        built = {
            "Microcompact": lambda: Microcompact(counter=counter),
            "Summarize": lambda: Summarize(ExtractiveSummarizer(), counter=counter),
            "ClearOldImages": lambda: ClearOldImages(counter=counter),
            "BudgetGuard": lambda: BudgetGuard(counter=counter, calibrate=False),
        }[layer]()
        window = counter.count_request(request) + slack + 1
        ctx = RunContext.new(
            config=RunConfig(max_tokens=window, reserved_output_tokens=1),
            conversation=Conversation(request.messages),
        )
        model = ScriptedModel(["ok"])
        await run_layer(built, request, ctx, model)
        assert model.requests[0].messages is request.messages
        assert ctx.conversation.messages == request.messages


class TestTriggersAndKeep:
    """Summarize's triggers (fraction, messages, AND/OR) and keep by tokens."""

    def test_spellings_and_combinations(self) -> None:
        """Ints are tokens, floats fractions; a mapping is AND, a list OR, & and | combine."""
        t = trigger([{"tokens": 100, "messages": 5}, ("fraction", 0.5)])
        assert t.fires(100, 5, None) and not t.fires(100, 4, 1000)
        assert t.fires(500, 1, 1000)
        both = trigger(100) & trigger(("messages", 3))
        assert not both.fires(100, 2, None) and both.fires(100, 3, None)
        assert (trigger(100) | trigger(("messages", 3))).fires(1, 3, None)
        assert trigger(0.8).fires(800, 1, 1000) and not trigger(0.8).fires(799, 1, 1000)

    @pytest.mark.parametrize(
        "value", [0, 1.5, ("lines", 3), {}, [], "a lot", ("messages", 0), True]
    )
    def test_bad_triggers_name_the_field(self, value: Any) -> None:
        """Every malformed trigger is a ConfigError naming trigger."""
        with pytest.raises(ConfigError, match="trigger"):
            trigger(value)

    def test_a_fraction_without_a_window_is_an_error(self) -> None:
        """A fraction trigger needs RunConfig.max_tokens."""
        with pytest.raises(ConfigError, match="RunConfig.max_tokens"):
            trigger(0.5).fires(10, 1, None)

    async def test_summarize_on_message_count(self, anyio_backend: str) -> None:
        """trigger=("messages", n) summarizes once the history has n messages."""
        history_ = tool_history(6, size=5)
        for n, expect_summary in ((len(history_), True), (len(history_) + 1, False)):
            ctx = RunContext.new(conversation=Conversation(history_))
            model = ScriptedModel(["ok"])
            layer = Summarize(ExtractiveSummarizer(), trigger=("messages", n), keep_recent=2)
            await run_layer(layer, ModelRequest(messages=history_), ctx, model)
            assert (len(model.requests[0].messages) < len(history_)) is expect_summary

    async def test_keep_by_tokens_keeps_the_newest_messages_that_fit(
        self, anyio_backend: str
    ) -> None:
        """keep=("tokens", n) keeps a verbatim tail within n tokens (pairs never split)."""
        history_ = tool_history(6, size=100)
        counter = default_counter()
        per_turn = counter.count_messages(history_[-2:])
        ctx = RunContext.new(conversation=Conversation(history_))
        model = ScriptedModel(["ok"])
        layer = Summarize(
            ExtractiveSummarizer(), trigger=1, keep=("tokens", 2 * per_turn + 1), counter=counter
        )
        await run_layer(layer, ModelRequest(messages=history_), ctx, model)
        sent = model.requests[0].messages
        assert sent[-4:] == history_[-4:] and len(sent) == 5
        check_pairing(sent)

    async def test_as_a_policy_it_summarizes_only_what_the_guard_needs(
        self, anyio_backend: str
    ) -> None:
        """relieve(need=n) keeps the newest messages that leave the history n smaller."""
        history_ = tool_history(10, size=400)  # about 6,700 tokens
        counter = default_counter()
        layer = Summarize(ExtractiveSummarizer(max_tokens=200), counter=counter)
        ctx = RunContext.new(conversation=Conversation(history_))
        small = await layer.relieve(history_, ctx, counter, need=1_000)
        large = await layer.relieve(history_, ctx, counter, need=3_000)
        assert small.freed_tokens >= 1_000 and large.freed_tokens >= 3_000
        assert len(small.messages) > len(large.messages)  # a smaller need keeps more
        assert small.messages[-4:] == history_[-4:]
        check_pairing(small.messages)
        check_pairing(large.messages)

    def test_keep_spellings_and_conflicts(self) -> None:
        """keep takes messages or (kind, n); keep with a non-default keep_recent is refused."""
        assert keep(5).kind == "messages" and keep(("tokens", 10)).value == 10
        with pytest.raises(ConfigError, match="keep"):
            keep(("tokens", 0))
        with pytest.raises(ConfigError, match="keep_recent"):
            Summarize(ExtractiveSummarizer(), keep_recent=3, keep=("tokens", 10))
        with pytest.raises(ConfigError, match="trigger_tokens"):
            Summarize(ExtractiveSummarizer(), trigger_tokens=10, trigger=20)

"""The replay engine and the `tinyctx` command on real transcripts."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tinyctx import (
    AssistantMessage,
    Layer,
    Message,
    ModelCall,
    ModelRequest,
    ModelResponse,
    RunContext,
    SystemMessage,
    ToolCall,
    ToolResult,
    UserMessage,
)
from tinyctx.cli import StackError, bundled_transcript, load_stack, main
from tinyctx.formats import load_transcript
from tinyctx.messages import check_pairing
from tinyctx.middleware.stacks import default_stack
from tinyctx.replay import replay
from tinyctx.testing import capture_events
from tinyctx.tokens import default_counter


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def transcripts(shared: Path) -> list[Path]:
    folder = shared / "transcripts"
    return sorted((folder / "openai").glob("*.jsonl")) + sorted((folder / "raw").glob("*"))


class SentRecorder(Layer):
    """Innermost model layer of a test: keeps every request the model was sent."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def wrap_model(
        self, request: ModelRequest, ctx: RunContext[Any], call_next: ModelCall
    ) -> ModelResponse:
        self.requests.append(request)
        return await call_next(request, ctx)


def _strip_names(messages: tuple[Message, ...]) -> list[Message]:
    # a replayed result carries its call's tool name; recordings may leave it empty
    return [
        ToolResult(m.tool_call_id, m.content, "", m.is_error) if isinstance(m, ToolResult) else m
        for m in messages
    ]


class TestReplayEngine:
    """A replay goes through a real Session and reproduces the recording exactly."""

    async def test_without_a_stack_the_conversation_equals_the_recording(self) -> None:
        recording = (
            SystemMessage("be brief"),
            UserMessage("look at two files"),
            AssistantMessage("", (ToolCall("a", "read"), ToolCall("b", "read"))),
            ToolResult("a", "file a"),
            ToolResult("b", "file b"),
            UserMessage("the user speaks before the model does"),
            AssistantMessage("first thought"),
            AssistantMessage("second thought, no user in between"),
            UserMessage("thanks"),
            AssistantMessage("done"),
        )
        report = await replay(recording, [], window=1000)
        assert _strip_names(report.final_messages) == list(recording)
        assert len(report.rows) == 4
        assert all(r.raw_tokens == r.tokens for r in report.rows)
        assert report.total_saved == 0
        # what each call saw: system + user; + call, 2 results, user; + thought; + thought, user
        assert [r.messages for r in report.rows] == [2, 6, 7, 9]

    async def test_a_trailing_unanswered_call_gets_a_synthetic_result_and_no_extra_call(
        self,
    ) -> None:
        recording = (
            UserMessage("fix it"),
            AssistantMessage("", (ToolCall("s", "submit"),)),
        )
        report = await replay(recording, [], window=1000)
        assert len(report.rows) == 1
        last = report.final_messages[-1]
        assert isinstance(last, ToolResult) and last.is_error
        check_pairing(report.final_messages, allow_pending=False)

    def test_real_transcripts_replay_exactly_without_a_stack(self, shared_data: Path) -> None:
        import anyio

        for path in transcripts(shared_data):
            recording = load_transcript(path)
            report = anyio.run(lambda: replay(recording, [], window=500_000), backend="trio")
            final = _strip_names(report.final_messages)
            assert final[: len(recording)] == _strip_names(recording), path.name
            assert report.rows and report.error is None

    def test_small_window_keeps_pairing_and_never_exceeds_it(self, shared_data: Path) -> None:
        import anyio

        counter = default_counter()
        compacted = 0
        for path in transcripts(shared_data):
            recording = load_transcript(path)
            sent = SentRecorder()
            report = anyio.run(
                lambda: replay(recording, [*default_stack(), sent], window=32_000, reserved=4_000),
                backend="trio",
            )
            usable = 28_000
            for request in sent.requests:
                check_pairing(request.messages, allow_pending=False)
                assert counter.count_request(request) <= usable, path.name
            for row in report.rows:
                assert row.tokens <= usable
            if report.error is not None:
                # only a single batch of tool results larger than the window itself may stop it
                assert "does not fit" in report.error, path.name
            compacted += report.overflows_avoided
        assert compacted > 100  # the window was small enough to force compaction

    async def test_numbers_agree_with_the_layers_own_events(self, shared_data: Path) -> None:
        path = shared_data / "transcripts" / "openai" / "marot__spotter__cc-main-4d5611e5.jsonl"
        recording = load_transcript(path)
        with capture_events() as events:
            report = await replay(recording, default_stack(), window=32_000, reserved=4_000)
        applied = [e for e in events if e.kind == "context.policy_applied"]
        in_rows = [e for r in report.rows for e in r.events if e.kind == "context.policy_applied"]
        assert applied and [e.freed_tokens for e in in_rows] == [e.freed_tokens for e in applied]  # type: ignore[attr-defined]
        truncated = [e for e in events if e.kind == "compaction.tool_result_budget"]
        assert sum(1 for r in report.rows for e in r.events if e in truncated) == len(truncated)
        # where the guard acted, what was sent is exactly what it estimated after its policies
        for row in report.rows:
            acted = [e for e in row.events if e.kind == "context.policy_applied"]
            if acted:
                assert row.tokens == acted[-1].estimate_after  # type: ignore[attr-defined]
                assert row.raw_tokens > row.tokens


class TestReplayCommand:
    """`tinyctx replay` prints one row per model call and a summary."""

    def test_no_arguments_replays_the_bundled_transcript(self) -> None:
        assert bundled_transcript().is_file()
        assert (bundled_transcript().parent / "marot__spotter.LICENSE").is_file()
        code, out, err = run_cli()
        assert code == 0, err
        assert "replay of marot__spotter__cc-main-4d5611e5.jsonl" in out
        assert "window 32,000 - reserved 4,000 = usable 28,000 tokens" in out
        assert "calls over the usable window without the stack" in out
        assert "pressure" in out and "Microcompact" in out

    def test_json_matches_the_table(self) -> None:
        code, out, _ = run_cli("replay", "--json")
        assert code == 0
        data = json.loads(out)
        summary = data["summary"]
        assert summary["model_calls"] == len(data["calls"]) == 139
        assert summary["would_overflow_without_stack"] > 100
        assert summary["overflows_remaining"] == 0
        assert all(c["tokens"] <= data["usable"] for c in data["calls"])
        assert summary["total_tokens_saved"] == sum(c["saved"] for c in data["calls"])
        code, text, _ = run_cli("replay")
        lines = {ln.rsplit("  ", 1)[0].strip(): ln.split()[-1] for ln in text.splitlines() if ln}
        assert lines["tokens saved over all calls"] == f"{summary['total_tokens_saved']:,}"
        assert "model calls replayed" in text and "139 of 139" in text

    def test_plot_writes_an_svg_chart(self, tmp_path: Path) -> None:
        chart = tmp_path / "chart.svg"
        code, _, err = run_cli("replay", "--plot", str(chart))
        assert code == 0
        svg = chart.read_text()
        assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
        assert svg.count("<polyline") == 2 and "<circle" in svg and "<rect x=" in svg
        assert "chart written" in err

    def test_named_stacks_differ_in_order(self) -> None:
        default = [type(layer).__name__ for layer in load_stack("default")]
        assert default == ["ToolResultBudget", "BudgetGuard"]
        guard = load_stack("seed-order")[1]
        assert [p.name for p in guard.policies] == [  # type: ignore[union-attr]
            "DropNonessential",
            "TrimOldest",
            "Summarize",
            "Microcompact",
            "ShrinkToolResults",  # the named stacks' last resort before giving up
        ]

    def test_stack_from_a_toml_file(self, tmp_path: Path, shared_data: Path) -> None:
        stack = tmp_path / "stack.toml"
        stack.write_text(
            """
[[layers]]
use = "tool_result_budget"
budget_bytes = 4096

[[layers]]
use = "budget_guard"
trigger = 0.8
policies = [
    { use = "drop_nonessential" },
    { use = "microcompact", keep_recent = 2 },
    { use = "summarize", keep_recent = 6 },
    { use = "trim_oldest", keep_recent = 4 },
]
"""
        )
        layers = load_stack(str(stack))
        assert [type(layer).__name__ for layer in layers] == ["ToolResultBudget", "BudgetGuard"]
        path = (
            shared_data
            / "transcripts"
            / "openai"
            / "SWE-agent__mini-swe-agent__astropy-12907-deepseek-v4-flash.jsonl"
        )
        code, out, err = run_cli(
            "replay", str(path), "--stack", str(stack), "--window", "16000", "--json"
        )
        assert code == 0, err
        assert json.loads(out)["summary"]["overflows_remaining"] == 0

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            ('[[layers]]\nuse = "nope"\n', "layers[0]: unknown layer 'nope'"),
            ('[[layers]]\nuse = "budget_guard"\ntrigger = 2.0\n', "layers[0] (budget_guard)"),
            ('[[layers]]\nuse = "budget_guard"\ntriger = 0.5\n', "layers[0] (budget_guard)"),
            ("[[layers]]\nbudget_bytes = 3\n", "layers[0]: each entry needs a string 'use'"),
            ('layers = "x"\n', "expected one or more [[layers]] tables"),
            ("[[layers]\n", "invalid TOML"),
            (
                '[[layers]]\nuse = "budget_guard"\npolicies = [{ use = "zzz" }]\n',
                "policies[0]: unknown layer 'zzz'",
            ),
        ],
    )
    def test_bad_stack_files_exit_2_naming_file_and_place(
        self, tmp_path: Path, content: str, message: str
    ) -> None:
        stack = tmp_path / "bad.toml"
        stack.write_text(content)
        code, _, err = run_cli("replay", "--stack", str(stack))
        assert code == 2
        assert str(stack) in err and message in err
        with pytest.raises(StackError):
            load_stack(str(stack))

    def test_bad_input_exits_with_its_code_and_the_place(self, tmp_path: Path) -> None:
        """Bad transcripts exit 3 naming file and line; bad flags 2; a bad tokenizer 4."""
        broken = tmp_path / "broken.jsonl"
        broken.write_text('{"role": "user", "content": "hi"}\n{not json\n')
        code, _, err = run_cli("replay", str(broken))
        assert code == 3
        assert f"{broken}:2: " in err and "bad JSON" in err
        assert err.count(str(broken)) == 1
        assert run_cli("replay", str(tmp_path / "missing.jsonl"))[0] == 3
        assert "no such file" in run_cli("replay", str(tmp_path / "missing.jsonl"))[2]
        assert run_cli("replay", "--window", "0")[0] == 2
        code, _, err = run_cli("replay", "--window", "1000", "--reserve", "1000")
        assert code == 2 and "--reserve" in err
        assert run_cli("replay", "--stack", "no-such-stack")[0] == 2
        assert run_cli("replay", "--tokenizer", str(tmp_path / "none.json"))[0] == 4

    def test_every_transcript_completes_at_the_default_window(self, shared_data: Path) -> None:
        # the raw files get the same checks through the installed command in
        # test_cli_command.py (TestFormats): each is replayed once, not in both files
        for path in sorted((shared_data / "transcripts" / "openai").glob("*.jsonl")):
            code, out, err = run_cli("replay", str(path), "--json")
            assert code == 0, (path.name, err)
            summary = json.loads(out)["summary"]
            assert summary["error"] is None and summary["overflows_remaining"] == 0, path.name

    def test_a_transcript_that_cannot_fit_stops_with_exit_1(self, shared_data: Path) -> None:
        # nine parallel reads, each cut to a tenth of the window as it arrives, then the
        # history summarized and trimmed, are still more than 500 tokens
        path = shared_data / "transcripts" / "openai" / "marot__spotter__cc-subagent-a2898e3.jsonl"
        code, out, err = run_cli("replay", str(path), "--window", "1000", "--reserve", "500")
        assert code == 1
        assert "stopped: prompt of ~" in err and "does not fit" in err
        assert "stopped" not in out.split("model calls replayed")[0]
        assert "1 of 12 (stopped)" in out and "1 of 12 model calls replayed" in err

    def test_a_real_tokenizer_counts_the_replay(self, shared_data: Path) -> None:
        tokenizer = shared_data / "tokenizers" / "claude-legacy" / "tokenizer.json"
        code, out, err = run_cli("replay", "--tokenizer", str(tokenizer), "--json")
        assert code == 0, err
        heuristic = json.loads(run_cli("replay", "--json")[1])
        real = json.loads(out)
        assert real["calls"][0]["tokens"] != heuristic["calls"][0]["tokens"]
        assert real["summary"]["overflows_remaining"] == 0


class TestStatsCommand:
    """`tinyctx stats` counts a transcript per role and tool."""

    def test_stats_of_a_transcript(self, shared_data: Path) -> None:
        path = shared_data / "transcripts" / "openai" / "marot__spotter__cc-subagent-a2898e3.jsonl"
        recording = load_transcript(path)
        code, out, _ = run_cli("stats", str(path), "--json")
        assert code == 0
        data = json.loads(out)
        assert data["messages"] == len(recording) == 46
        assert data["tool_calls"] == 33
        counter = default_counter()
        assert sum(data["tokens_by_role"].values()) == counter.count_messages(recording)
        assert (
            data["largest_tool_results"][0]["tokens"] >= data["largest_tool_results"][-1]["tokens"]
        )
        code, text, _ = run_cli("stats", str(path))
        assert code == 0 and "largest tool results" in text

    def test_stats_with_the_real_tokenizer(self, shared_data: Path) -> None:
        path = (
            shared_data
            / "transcripts"
            / "openai"
            / "OpenHands__software-agent-sdk__fncall-llm-message.jsonl"
        )
        tokenizer = shared_data / "tokenizers" / "claude-legacy" / "tokenizer.json"
        code, out, _ = run_cli("stats", str(path), "--tokenizer", str(tokenizer))
        assert code == 0
        assert "heuristic" in out and "tokenizer" in out and "total" in out


class TestProgress:
    """Long replays show a progress bar on a terminal, and nothing when piped."""

    def test_bar_on_a_tty_only_and_cleared_when_done(self) -> None:
        """The bar shows on a terminal only and erases itself before the table prints."""
        from tinyctx.cli._common import progress_bar as _progress

        class Terminal(io.StringIO):
            def isatty(self) -> bool:
                return True

        with _progress(io.StringIO()) as none:
            assert none is None
        terminal = Terminal()
        with _progress(terminal) as show:
            assert show is not None
            show(50, 100)
            show(100, 100)
        text = terminal.getvalue()
        assert "100/100" in text and "messages" in text
        assert text.endswith("\x1b[2K")  # the last thing written erases the bar's line


class TestLostReferences:
    """`tinyctx replay` reports uses and lost uses per call and in total, beside cost."""

    def test_json_counts_uses_and_losses_per_call_and_in_total(self) -> None:
        """Per-call uses and lost uses add up to the summary; each lost use names its span."""
        code, out, _ = run_cli("replay", "--json", "--price", "claude-sonnet-4-5")
        assert code == 0
        payload = json.loads(out)
        calls, summary = payload["calls"], payload["summary"]
        assert summary["uses"] == sum(c["uses"] for c in calls) > 0
        assert summary["lost_uses"] == sum(c["lost_uses"] for c in calls) > 0
        assert summary["lost_rate"] == summary["lost_uses"] / summary["uses"]
        assert summary["total_cost_usd"] > 0  # beside cost
        for call in calls:
            assert len(call["lost"]) == call["lost_uses"] <= call["uses"]
            assert all({"kind", "span", "source", "tool"} <= set(u) for u in call["lost"])
        by_source = summary["lost_by_source"]
        assert sum(v["lost"] for v in by_source.values()) == summary["lost_uses"]
        assert sum(v["uses"] for v in summary["lost_by_kind"].values()) == summary["uses"]

    def test_the_table_shows_lost_of_uses_and_the_rate(self) -> None:
        """The table has a lost/uses column and the summary the lost rate."""
        code, out, _ = run_cli("replay")
        assert code == 0
        payload = json.loads(run_cli("replay", "--json")[1])
        lost = next(c for c in payload["calls"] if c["lost_uses"])
        assert f"{lost['lost_uses']}/{lost['uses']}" in out
        assert f"{payload['summary']['lost_rate'] * 100:.1f}%" in out
        assert "lost rate (lost uses / uses)" in out

    def test_the_chart_marks_calls_with_losses(self, tmp_path: Path) -> None:
        """Each call with a lost use gets a red mark naming its losses, and a legend line."""
        chart = tmp_path / "chart.svg"
        assert run_cli("replay", "--plot", str(chart))[0] == 0
        payload = json.loads(run_cli("replay", "--json")[1])
        svg = chart.read_text()
        with_losses = [c for c in payload["calls"] if c["lost_uses"]]
        assert svg.count("uses lost") == len(with_losses)
        assert f"lost references ({len(with_losses)} calls" in svg

    def test_sweep_draws_the_cost_by_lost_rate_frontier(self, tmp_path: Path) -> None:
        """Each sweep point has its lost rate; the frontier points forget less as cost rises."""
        chart = tmp_path / "chart.svg"
        code, out, _ = run_cli("replay", "--json", "--sweep", "0.2,0.5", "--plot", str(chart))
        assert code == 0
        points = json.loads(out)["sweep"]["points"]
        assert all(p["lost_rate"] is not None and "lost_frontier" in p for p in points)
        best = sorted((p for p in points if p["lost_frontier"]), key=lambda p: p["cost"])
        assert best
        rates = [p["lost_rate"] for p in best]
        assert rates == sorted(rates, reverse=True) and len(set(rates)) == len(rates)
        for p in points:  # nothing off the frontier beats a frontier point on both axes
            if not p["lost_frontier"]:
                assert any(
                    b["cost"] <= p["cost"] and b["lost_rate"] <= p["lost_rate"] for b in best
                )
        assert "lost rate against cost" in chart.read_text()

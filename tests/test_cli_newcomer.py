"""The command as a new user first meets it: help, a too-small window, a sweep's price and
progress, events in --json, stats with no file, Agent TARS request snapshots."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tinyctx.cli import main
from tinyctx.formats import read_transcript
from tinyctx.messages import check_pairing

SNAPSHOT = "gui-agent-basic-doubao-1.5-vision.loop-8.llm-request.jsonl"


class Terminal(io.StringIO):
    """A stream that says it is a terminal (the progress bar shows only on one)."""

    def isatty(self) -> bool:
        return True


def run_cli(*argv: str, err: io.StringIO | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), err if err is not None else io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def bundled_json() -> dict[str, object]:
    code, out, err = run_cli("--json")
    assert code == 0, err
    payload: dict[str, object] = json.loads(out)
    return payload


class TestHelp:
    """--help shows a default only for options that have one."""

    @pytest.mark.parametrize("argv", [["--help"], ["replay", "--help"], ["stats", "--help"]])
    def test_no_suppressed_default_is_printed(self, argv: list[str]) -> None:
        """-h and --version carry no '(default: ==SUPPRESS==)'."""
        code, out, _ = run_cli(*argv)
        assert code == 0 and "usage:" in out
        assert "SUPPRESS" not in out


class TestTooSmallWindow:
    """A window too small for the first prompt is an error, not an empty table."""

    def test_window_10_says_why_and_prints_no_table(self) -> None:
        """--window 10: exit 1, no table, the error names --window and the default."""
        code, out, err = run_cli("--window", "10")
        assert code == 1
        assert "call" not in out and "model calls replayed" not in out
        assert "--window 10: no model call was replayed" in err
        assert "choose a larger --window (default: 32000)" in err


class TestSweep:
    """A sweep says which model it prices at and counts its replays on a terminal."""

    def test_sweep_without_price_announces_the_model(self) -> None:
        """Without --price the sweep names the model it prices at, on stderr."""
        code, out, err = run_cli("--sweep", "0.5", "--json")
        assert code == 0, err
        assert "--sweep: pricing at claude-sonnet-4-5 (choose the model with --price" in err
        assert json.loads(out)["sweep"]["points"]

    def test_sweep_replays_show_progress_with_a_known_total(self) -> None:
        """On a terminal: a 'sweeping N/N replays' bar, and the main bar never shows '?'."""
        terminal = Terminal()
        code, _, _ = run_cli("--sweep", "0.5", "--price", "gpt-4o", err=terminal)
        text = terminal.getvalue()
        assert code == 0, text
        assert "sweeping" in text and "2/2" in text and "replays" in text
        assert "/?" not in text


class TestJsonEvents:
    """--json events name the layer that acted and the tokens it freed."""

    def test_tool_result_budget_events_name_the_layer_and_the_tokens(
        self, bundled_json: dict[str, object]
    ) -> None:
        """A cut tool result: name ToolResultBudget, freed_tokens > 0 (not the kind, not null)."""
        calls = bundled_json["calls"]
        assert isinstance(calls, list)
        cuts = [
            e for c in calls for e in c["events"] if e["kind"] == "compaction.tool_result_budget"
        ]
        assert cuts
        assert {e["name"] for e in cuts} == {"ToolResultBudget"}
        assert all(isinstance(e["freed_tokens"], int) and e["freed_tokens"] > 0 for e in cuts)
        # the call's saving is at least what its cuts freed
        for call in calls:
            freed = sum(
                e["freed_tokens"]
                for e in call["events"]
                if e["kind"] == "compaction.tool_result_budget"
            )
            assert call["raw_tokens"] - call["tokens"] >= freed

    def test_no_event_is_named_by_its_kind_when_a_layer_acted(
        self, bundled_json: dict[str, object]
    ) -> None:
        """Every event of the default stack names a layer or policy, not a dotted kind."""
        calls = bundled_json["calls"]
        assert isinstance(calls, list)
        names = {e["name"] for c in calls for e in c["events"]}
        assert names and not any("." in name for name in names), names


class TestStats:
    """stats, like replay, reads the bundled session when given no transcript."""

    def test_stats_without_a_transcript_reads_the_bundled_one(self) -> None:
        """`tinyctx stats` alone works; its counts are one unbroken line."""
        code, out, err = run_cli("stats")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == "stats of marot__spotter__cc-main-4d5611e5.jsonl"
        assert lines[1] == "293 messages, 4 user turns, 139 model turns, 150 tool calls"


class TestAgentTarsSnapshot:
    """An Agent TARS llm-request.jsonl snapshot is recognised and replays."""

    def test_snapshot_is_detected_read_and_replayed(self, shared_data: Path) -> None:
        """Detected as agent_tars; system prompt, paired tool results, screenshots; replays."""
        path = (
            shared_data
            / "transcripts"
            / "multimodal"
            / "raw"
            / f"bytedance__UI-TARS-desktop__{SNAPSHOT}"
        )
        loaded = read_transcript(path)
        assert loaded.format == "agent_tars"
        messages = loaded.messages
        assert messages[0].role == "system" and "GUI Agent" in str(messages[0].content)
        assert sum(1 for m in messages if m.role == "assistant") == 7
        check_pairing(messages)
        code, out, err = run_cli(str(path), "--json")
        assert code == 0, err
        assert len(json.loads(out)["calls"]) == 7

    def test_the_formats_doc_names_agent_tars(self) -> None:
        """docs/cli.md lists the agent_tars format and its llm-request snapshots."""
        doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
        assert "| `agent_tars` |" in doc and "llm-request.jsonl" in doc

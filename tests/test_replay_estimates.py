"""``tinyctx replay --stack`` with provider-side stacks estimated by the providers' documented
rules (tinyctx.providers.estimates), compared with tinyctx's own on the bundled transcript."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tinyctx import ConfigError, ToolResult, UserMessage
from tinyctx.cli import bundled_transcript, main
from tinyctx.formats import load_transcript
from tinyctx.messages import check_pairing
from tinyctx.providers.clearing import CLEARED_PLACEHOLDER
from tinyctx.providers.estimates import (
    AnthropicCompactionEstimate,
    AnthropicContextEditingEstimate,
    ResponsesCompactEstimate,
    stand_in_summary,
)
from tinyctx.replay import replay
from tinyctx.tokens import HeuristicCounter

WINDOW = "200000"
STACK = """
[[layers]]
use = "anthropic_compaction_estimate"
trigger_tokens = 60000
summary_tokens = 1500

[[layers]]
use = "anthropic_context_editing_estimate"
trigger_tokens = 30000
keep_tool_uses = 3
"""


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def replay_json(stack: str) -> dict[str, Any]:
    code, out, err = run_cli("replay", "--window", WINDOW, "--stack", stack, "--json")
    assert code == 0, err
    payload: dict[str, Any] = json.loads(out)
    return payload


@pytest.fixture(scope="module")
def stack_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stacks") / "anthropic.toml"
    path.write_text(STACK, encoding="utf-8")
    return path


class TestProviderStackAgainstTinyctx:
    """The provider-side stack replays the same transcript, its figures marked estimates."""

    def test_both_stacks_replay_every_call_and_only_the_provider_one_is_an_estimate(
        self, stack_file: Path
    ) -> None:
        """Same calls for both; the provider stack names its estimating layers and every one
        of their actions says ``estimate:``; tinyctx's own stack names none."""
        provider = replay_json(str(stack_file))
        own = replay_json("default")
        assert provider["summary"]["model_calls"] == own["summary"]["model_calls"] > 100
        assert provider["summary"]["estimated_by"] == [
            "AnthropicCompactionEstimate",
            "AnthropicContextEditingEstimate",
        ]
        assert own["summary"]["estimated_by"] == []
        events = [e for call in provider["calls"] for e in call["events"]]
        kinds = {e["kind"] for e in events}
        assert {"compaction.provider", "compaction.provider_edit"} <= kinds
        assert all("(estimate: anthropic" in e["label"] for e in events if e["kind"] in kinds)

    def test_the_documented_rules_hold_call_by_call(self, stack_file: Path) -> None:
        """A compacted call is sent under the compaction trigger; an edit frees tokens and
        keeps the newest tool uses; no call of the replay passes the window."""
        provider = replay_json(str(stack_file))
        compacted = [c for c in provider["calls"] if "compaction.provider" in _kinds(c)]
        assert compacted
        assert all(c["tokens"] < 60_000 for c in compacted)
        edits = [e for c in provider["calls"] for e in c["events"]]
        edits = [e for e in edits if e["kind"] == "compaction.provider_edit"]
        assert edits and all(e["freed_tokens"] > 0 for e in edits)
        assert provider["summary"]["overflows_remaining"] == 0

    def test_the_table_labels_the_estimate(self) -> None:
        """The table (not only --json) says the provider's rules were applied locally."""
        code, out, err = run_cli("replay", "--window", WINDOW, "--stack", "anthropic-estimate")
        assert code == 0, err
        assert "estimate: AnthropicCompactionEstimate, AnthropicContextEditingEstimate" in out


class TestOpenAICompactEstimate:
    """responses.compact estimated: the head's user messages stay, the rest is one item."""

    def test_a_compacted_call_keeps_the_user_turns_and_is_labelled(self, tmp_path: Path) -> None:
        """Through the TOML layer: each compaction is an estimate, keeps every user message
        of the head and sends the call under the trigger plus the kept tail."""
        path = tmp_path / "openai.toml"
        path.write_text(
            '[[layers]]\nuse = "openai_compact_estimate"\ntrigger_tokens = 40000\n'
            "keep_recent = 4\n",
            encoding="utf-8",
        )
        payload = replay_json(str(path))
        assert payload["summary"]["estimated_by"] == ["ResponsesCompactEstimate"]
        events = [e for call in payload["calls"] for e in call["events"]]
        compactions = [e for e in events if e["kind"] == "compaction.provider"]
        assert compactions and all("(estimate: openai" in e["label"] for e in compactions)
        assert all(e["freed_tokens"] > 0 for e in compactions)

    async def test_the_thread_keeps_pairing_and_user_messages(self, anyio_backend: str) -> None:
        """The compacted thread is paired and keeps every user message it had."""
        transcript = load_transcript(bundled_transcript())
        users = sum(isinstance(m, UserMessage) for m in transcript)
        layer = ResponsesCompactEstimate(trigger_tokens=40_000, keep_recent=4)
        report = await replay(transcript, [layer], window=200_000)
        check_pairing(report.final_messages)
        assert sum(isinstance(m, UserMessage) for m in report.final_messages) == users
        assert len(report.final_messages) < len(transcript)


def _kinds(call: dict[str, Any]) -> set[str]:
    return {e["kind"] for e in call["events"]}


class TestEstimateLayers:
    """The estimate layers behave as the provider does with the thread."""

    async def test_context_editing_leaves_the_thread_whole(self, anyio_backend: str) -> None:
        """The server edits its copy of each request: the replayed thread keeps every
        result, while the calls were sent cleared ones."""
        transcript = load_transcript(bundled_transcript())
        layer = AnthropicContextEditingEstimate(trigger_tokens=20_000, keep_tool_uses=2)
        report = await replay(transcript, [layer], window=200_000)
        assert any(row.actions for row in report.rows)
        results = [m for m in report.final_messages if isinstance(m, ToolResult)]
        assert results and all(r.content != CLEARED_PLACEHOLDER for r in results)

    def test_the_stand_in_summary_is_about_its_size(self) -> None:
        """stand_in_summary(n) counts n tokens within 10%."""
        counter = HeuristicCounter()
        for tokens in (200, 2_000, 20_000):
            assert abs(counter.count_text(stand_in_summary(tokens, counter)) - tokens) <= (
                tokens // 10
            )

    def test_bad_arguments_are_the_layers_config_errors(self) -> None:
        """The estimate layers check their arguments as the real layers do."""
        with pytest.raises(ConfigError, match="trigger_tokens"):
            AnthropicCompactionEstimate(trigger_tokens=10)
        with pytest.raises(ConfigError, match="keep_tool_uses"):
            AnthropicContextEditingEstimate(keep_tool_uses=-1)
        with pytest.raises(ConfigError, match="keep_recent"):
            ResponsesCompactEstimate(trigger_tokens=10, keep_recent=-1)

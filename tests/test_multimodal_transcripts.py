"""The three real browser/GUI agent runs: loaded from raw logs and normalized JSONL, replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinyctx import ImagePart, Message
from tinyctx.cli import main
from tinyctx.formats import FormatError, from_agent_tars, load_transcript, read_transcript
from tinyctx.messages import check_pairing
from tinyctx.middleware.stacks import default_stack
from tinyctx.parts import media_parts
from tinyctx.replay import replay_sync
from tinyctx.tokens import HeuristicCounter

PREFIX = "bytedance__UI-TARS-desktop__"
RUNS = {
    # stem: (messages, model turns, images, image size)
    "responses-api-captcha-doubao-1.6": (36, 12, 11, (2560, 1600)),
    "gui-agent-basic-doubao-1.5-vision": (25, 8, 8, (2560, 1600)),
    "agent-tars-nvidia-claude-3.7-sonnet": (26, 12, 1, (1200, 800)),
}


def _dir(shared_data: Path) -> Path:
    return shared_data / "transcripts" / "multimodal"


def _normalized(shared_data: Path, stem: str) -> tuple[Message, ...]:
    return load_transcript(_dir(shared_data) / "openai" / f"{PREFIX}{stem}.jsonl")


def _raw(shared_data: Path, stem: str) -> tuple[Message, ...]:
    raw = _dir(shared_data) / "raw"
    if stem.startswith("gui-agent"):
        events = json.loads((raw / f"{PREFIX}{stem}.event-stream.jsonl").read_text("utf-8"))
        request = json.loads((raw / f"{PREFIX}{stem}.loop-8.llm-request.jsonl").read_text("utf-8"))
        return from_agent_tars(events, system=request["request"]["messages"][0]["content"])
    return load_transcript(raw / f"{PREFIX}{stem}.json")


def _images(messages: tuple[Message, ...]) -> list[ImagePart]:
    return [
        p
        for m in messages
        for p in media_parts(getattr(m, "content", ""))
        if isinstance(p, ImagePart)
    ]


class TestLoading:
    """Raw logs and their normalized JSONL read to the same messages, screenshots included."""

    @pytest.mark.parametrize("stem", sorted(RUNS))
    def test_raw_equals_normalized(self, shared_data: Path, stem: str) -> None:
        """Every message of the raw log equals the normalized file's, images by digest."""
        normalized = _normalized(shared_data, stem)
        assert _raw(shared_data, stem) == normalized
        messages, turns, images, size = RUNS[stem]
        assert len(normalized) == messages
        assert sum(1 for m in normalized if m.role == "assistant") == turns
        assert [p.size for p in _images(normalized)] == [size] * images
        check_pairing(normalized)

    def test_session_dumps_are_detected(self, shared_data: Path) -> None:
        """A session dump is recognised as Agent TARS, not as a SWE-agent trajectory."""
        path = _dir(shared_data) / "raw" / f"{PREFIX}responses-api-captcha-doubao-1.6.json"
        assert read_transcript(path).format == "agent_tars"

    def test_base64_is_counted_by_formula_not_as_text(self, shared_data: Path) -> None:
        """A 2560×1600 screenshot costs ~1,640 tokens, not its ~145,000 base64 characters."""
        counter = HeuristicCounter()
        history = _normalized(shared_data, "responses-api-captcha-doubao-1.6")
        screenshot = next(m for m in history if _images((m,)))
        assert 1600 < counter.count_message(screenshot) < 1800

    def test_unreadable_raw_names_the_entry(self) -> None:
        """An unknown part type in a log is an error naming the entry."""
        events = [
            {"type": "user_message", "timestamp": 1, "content": [{"type": "audio"}]},
        ]
        with pytest.raises(FormatError, match="agent_tars message 0: cannot read a 'audio'"):
            from_agent_tars(events)


class TestReplay:
    """Through the default stack, every call stays in the window; old screenshots go first."""

    @pytest.mark.parametrize("window", [32_000, 128_000])
    @pytest.mark.parametrize("stem", sorted(RUNS))
    def test_default_stack_keeps_the_window(
        self, shared_data: Path, stem: str, window: int
    ) -> None:
        """No call exceeds the usable window; pairing holds; images are counted per call."""
        history = _normalized(shared_data, stem)
        report = replay_sync(history, default_stack(), window=window, reserved=4_000)
        assert report.error is None
        assert all(row.tokens <= window - 4_000 for row in report.rows)
        assert len(report.rows) == RUNS[stem][1]
        check_pairing(report.final_messages)
        assert report.rows[-1].raw_images == RUNS[stem][2]  # every screenshot was sent
        assert all(row.images <= row.raw_images for row in report.rows)

    def test_24k_clears_old_screenshots_first(self, shared_data: Path) -> None:
        """The captcha run needs relief at 24K: old screenshots are the guard's first step."""
        history = _normalized(shared_data, "responses-api-captcha-doubao-1.6")
        report = replay_sync(history, default_stack(), window=24_000, reserved=4_000)
        relieved = [row for row in report.rows if row.images < row.raw_images]
        assert relieved and relieved[0].images <= 3
        steps = [a for a in relieved[0].actions if not a.startswith("pressure")]
        assert steps[0].startswith("ClearOldImages")

    def test_cli_reports_images_per_call(
        self, shared_data: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``tinyctx replay --json`` gives images per call; ``stats`` counts images."""
        path = _dir(shared_data) / "openai" / f"{PREFIX}gui-agent-basic-doubao-1.5-vision.jsonl"
        assert main(["replay", str(path), "--json"]) == 0
        payload = json.loads(capsys.readouterr().out)
        assert [c["images"] for c in payload["calls"]] == list(range(1, 9))
        assert payload["summary"]["max_images_per_call"] == 8
        assert main(["replay", str(path)]) == 0
        text = capsys.readouterr().out
        assert "imgs" in text and " 8/8 " in text
        assert main(["stats", str(path), "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["images"] == 8 and stats["documents"] == 0 and stats["media_tokens"] > 8 * 1600

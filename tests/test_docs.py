"""Every Python example in the README and docs/ runs as written.

A page is one program told in sections: its ```python blocks run in order in one namespace,
so a later block may use what an earlier one defined.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in FENCE.finditer(text)]


class TestDocs:
    """The documentation's code is real code."""

    def test_every_page_has_examples(self) -> None:
        assert [p.name for p in PAGES if not _blocks(p)] == []

    @pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
    def test_page_runs(
        self, path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        text = path.read_text(encoding="utf-8")
        # a page about PostgreSQL / Redis runs against the test servers (tests/servers.py)
        for variable, fixture in (("POSTGRES_URL", "postgres_url"), ("REDIS_URL", "redis_url")):
            if f'os.environ["{variable}"]' in text:
                monkeypatch.setenv(variable, request.getfixturevalue(fixture))
        namespace: dict[str, object] = {"__name__": f"docs_{path.stem.replace('-', '_')}"}
        for line, code in _blocks(path):
            # pad so tracebacks point at the right line of the page
            source = "\n" * (line - 1) + code
            exec(compile(source, str(path), "exec"), namespace)  # noqa: S102 - our own docs


class TestDocsCoverWhatUsersAsk:
    """The questions a new user asked have an answer in the docs, and the hint is real."""

    def test_writing_a_layer_shows_reading_and_changing_messages(self) -> None:
        """Message types, .role/.content/.text and building a changed request are shown."""
        page = (ROOT / "docs" / "writing-a-layer.md").read_text(encoding="utf-8")
        section = page.split("## Reading and changing messages", 1)[1].split("\n## ", 1)[0]
        for needle in ("UserMessage", "AssistantMessage", "ToolResult", "SystemMessage"):
            assert needle in section
        for needle in (
            "`role`",
            "`content`",
            "`.text`",
            "tool_call_id",
            "request.evolve(messages=",
        ):
            assert needle in section
        assert "message.evolve(content=" in section

    def test_otel_provider_name_is_documented(self) -> None:
        """Logging and tracing says what OtelExporter(provider_name=...) is for."""
        page = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
        assert 'OtelExporter(provider_name="my-llm")' in page

    def test_capture_events_by_class_is_documented(self) -> None:
        """Testing your layer shows capture_events with an event class."""
        page = (ROOT / "docs" / "testing-your-layer.md").read_text(encoding="utf-8")
        assert "capture_events(ModelCallFinished" in page

    @pytest.mark.parametrize(
        "module",
        ["tinyctx.testing.strategies", "tinyctx.testing.stateful", "tinyctx.testing.conformance"],
    )
    def test_hypothesis_missing_gives_the_install_hint(self, module: str) -> None:
        """Without hypothesis the import says: pip install 'tinyctx[testing]'."""
        code = f"import sys; sys.modules['hypothesis'] = None; import {module}"
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert result.returncode != 0
        assert "pip install 'tinyctx[testing]'" in result.stderr
        assert f"{module} needs hypothesis" in result.stderr

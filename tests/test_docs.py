"""Every Python example in the README and docs/ runs as written.

A page is one program told in sections: its ```python blocks run in order in one namespace,
so a later block may use what an earlier one defined.
"""

from __future__ import annotations

import re
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

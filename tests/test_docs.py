"""Every Python example in the README and docs/ runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _examples() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for number, match in enumerate(FENCE.finditer(text), start=1):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{path.relative_to(ROOT)}:{line} (example {number})", match.group(1)))
    return found


EXAMPLES = _examples()


class TestDocs:
    """The documentation's code is real code."""

    def test_there_are_examples(self) -> None:
        assert len(EXAMPLES) >= 2

    @pytest.mark.parametrize(("where", "code"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
    def test_example_runs(self, where: str, code: str, capsys: pytest.CaptureFixture[str]) -> None:
        namespace: dict[str, object] = {"__name__": f"docs_example_{abs(hash(where))}"}
        exec(compile(code, where, "exec"), namespace)  # noqa: S102 - our own documentation

"""The benchmark runner's summary: the table the README shows, and a crashed module reported."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def run_all(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module("run_all")
    yield module
    sys.modules.pop("run_all", None)


def rows(module: ModuleType) -> list[tuple[str, Any]]:
    row = sys.modules["_harness"].Row
    return [
        ("bench_x", row("step", "against a peer", 2e-6, "LangChain step", 4e-6, "<= 1x", True)),
        ("bench_x", row("step", "a | in the case", 3e-6, "raw insert", 1e-6, "<= 1.5x", False)),
        ("bench_y", row("load", "no verdict", 1e-3)),
    ]


class TestSummaryMarkdown:
    """The Markdown summary has one line per judged row, peers and floors apart."""

    def test_columns_and_verdicts(self, run_all: ModuleType) -> None:
        """A peer's ratio goes in the peer column, a floor's in the floor column, with the
        verdict; a capability without a verdict shows its first row."""
        lines = run_all.summary_markdown(rows(run_all)).splitlines()
        assert lines[0].startswith("| capability | case | tinyctx | best peer |")
        assert set(lines[1].replace("|", "").split()) == {"---"}
        peer, floor, bare = (line.split(" | ") for line in lines[2:])
        assert peer[3] == "LangChain step 4.00 µs" and peer[4] == "0.50x" and peer[5] == "-"
        assert peer[7] == "<= 1x MET |"
        assert floor[3] == "-" and floor[5] == "raw insert 1.00 µs" and floor[6] == "3.00x"
        assert floor[7] == "<= 1.5x NOT MET |"
        assert "a \\| in the case" in floor[1]  # a pipe in a cell does not split it
        assert bare[0] == "| y / load" and bare[2] == "1.00 ms"
        assert len(lines) == 5


class TestCrashedModule:
    """One benchmark that raises does not lose the others' results, and the run fails."""

    def test_crash_reported(
        self, run_all: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        good = ModuleType("bench_good")
        good.run = lambda quick: [sys.modules["_harness"].Row("g", "fine", 1e-6)]  # type: ignore[attr-defined]
        bad = ModuleType("bench_bad")

        def broken(quick: bool) -> list[Any]:
            raise TypeError("servers() missing 1 required positional argument")

        bad.run = broken  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "bench_good", good)
        monkeypatch.setitem(sys.modules, "bench_bad", bad)
        monkeypatch.setattr(run_all, "discover", lambda: ["bench_bad", "bench_good"])
        markdown = tmp_path / "summary.md"
        code = run_all.main(["--json", str(tmp_path / "r.json"), "--markdown", str(markdown)])
        assert code == 1
        assert "good / g" in markdown.read_text()
        assert '"case": "fine"' in (tmp_path / "r.json").read_text()

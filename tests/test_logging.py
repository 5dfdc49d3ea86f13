"""Logging: an application that configured nothing hears nothing from tinyctx below
WARNING; one that configured the standard library's logging or structlog hears every event,
with the run's ids, at the level the event declares. Each case runs in a fresh interpreter
(the test suite itself configures structlog)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a run with one tool call that fails (a WARNING event) and a final answer
RUN = """
import anyio
from tinyctx import Agent, Session, tool
from tinyctx.testing import ScriptedModel, call, reply


@tool
async def search(query: str) -> str:
    \"\"\"Search.

    Args:
        query: what to look for
    \"\"\"
    raise OSError("index offline")


async def main() -> None:
    model = ScriptedModel([reply("", call("search", query="x")), "done"])
    async with Session(Agent(model=model, tools=[search]), thread_id="t1") as session:
        result = await session.run("go")
    print("RESULT", result.final_text)


anyio.run(main, backend="trio")
"""


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


class TestUnconfigured:
    """Nothing below WARNING reaches an application that never configured logging."""

    def test_the_readme_example_prints_only_its_result(self) -> None:
        """The README's first example prints its one line and nothing else."""
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        example = re.search(r"^```python\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
        assert example is not None
        result = python(example[1])
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("\n") == 1 and "It is an onion." in result.stdout
        assert result.stderr == ""

    def test_warnings_still_reach_stderr_and_nothing_is_configured(self) -> None:
        """A failing tool (WARNING) is heard on stderr; debug/info never; no handler added."""
        result = python(
            RUN
            + "\nimport logging, structlog\n"
            + "assert logging.getLogger().handlers == []\n"
            + "assert logging.getLogger('tinyctx').handlers == []\n"
            + "assert not structlog.is_configured()\n"
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == "RESULT done\n"
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tool.failed ")
        assert "run.started" not in result.stderr and "model.call" not in result.stderr


class TestConfigured:
    """A configured application hears every event with the run's ids, at its level."""

    def test_stdlib_logging_hears_every_event_at_its_level(self) -> None:
        """basicConfig(DEBUG): run.started DEBUG, run.finished INFO, tool.failed WARNING."""
        result = python(
            "import logging, sys\n"
            "logging.basicConfig(level=logging.DEBUG, stream=sys.stdout,\n"
            "    format='%(levelname)s|%(name)s|%(run_id)s|%(message)s')\n" + RUN
        )
        assert result.returncode == 0, result.stderr
        records = [line.split("|", 3) for line in result.stdout.splitlines() if "|" in line]
        levels = {message.split()[0]: level for level, _, _, message in records}
        assert levels["run.started"] == "DEBUG"
        assert levels["model.call"] == "DEBUG"
        assert levels["run.finished"] == "INFO"
        assert levels["tool.failed"] == "WARNING"
        assert {name for _, name, _, _ in records} == {"tinyctx"}
        run_ids = {run_id for _, _, run_id, _ in records}
        assert len(run_ids) == 1 and run_ids != {""}
        started = next(m for _, _, _, m in records if m.startswith("run.started"))
        assert "thread_id='t1'" in started and f"run_id='{run_ids.pop()}'" in started

    def test_structlog_hears_every_event_with_ids_bound(self) -> None:
        """structlog configured (JSON, DEBUG): each event with run_id, root_run_id, level."""
        result = python(
            "import structlog\n"
            "structlog.configure(processors=[structlog.processors.add_log_level,\n"
            "    structlog.processors.JSONRenderer()])\n" + RUN
        )
        assert result.returncode == 0, result.stderr
        events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        by_kind = {e["event"]: e for e in events}
        assert by_kind["run.started"]["level"] == "debug"
        assert by_kind["run.finished"]["level"] == "info"
        assert by_kind["tool.failed"]["level"] == "warning"
        assert len({e["run_id"] for e in events}) == 1 and all(e["run_id"] for e in events)
        assert len({e["root_run_id"] for e in events}) == 1 and all(
            e["root_run_id"] for e in events
        )
        assert {e["thread_id"] for e in events} == {"t1"}

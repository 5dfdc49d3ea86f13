"""DBOS runs killed with SIGKILL at random points, in real worker processes
(``tests/engine_worker.py``): after a restart DBOS finishes every run by itself."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dbos import DBOS, DBOSConfig

from tests.engine_app import (
    LOOKUPS,
    TOOL_CALLS,
    delegation_counts,
    executions,
    kill_mid_work,
    line_count,
    work_agent,
)
from tests.engine_worker import TOOL_PAUSE, VERSION
from tinyctx import SqliteStore, ToolResult, UserMessage
from tinyctx.codec import decode_messages
from tinyctx.engines import workflow_id_for
from tinyctx.engines.dbos import DBOSEngine, sqlite_config
from tinyctx.events import ToolCallFinished
from tinyctx.messages import check_pairing
from tinyctx.testing import capture_events

# workers killed at random points: deselected by default, run with `pytest -m slow`
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("engine_worker.py")
ROOT = WORKER.parent.parent
KILLS = 20
LANES = 2
RUNS = 40  # enough work that the 20 kills always fall inside it


@pytest.fixture
def anyio_backend() -> str:
    """The checks read the SQLite store; one backend is enough (DBOS itself is asyncio)."""
    return "asyncio"


@pytest.fixture
def launch() -> Iterator[Callable[[DBOSConfig], None]]:
    """Launch DBOS in this process (after the test built its engine); destroyed after."""

    def start(config: DBOSConfig) -> None:
        DBOS(config=config)
        DBOS.launch()

    yield start
    DBOS.destroy(destroy_registry=True)


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DBOS__LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _wait_line(process: subprocess.Popen[str], prefix: str) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"worker exited ({process.wait()}) before printing {prefix!r}")


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


async def _threads(path: Path, thread_ids: list[str]) -> dict[str, Any]:
    store = SqliteStore(path)
    try:
        return {t: await store.load_thread(t) for t in thread_ids}
    finally:
        await store.aclose()


class TestKilledWorkers:
    """Runs killed at random points finish after restart, each tool run once or, in
    flight at a kill, at most twice; threads pair and no lease is left."""

    async def test_twenty_kills(self, tmp_path: Path) -> None:
        """20 SIGKILLs over 80 runs of 6 tool calls; a last worker finishes them all."""
        rng = random.Random(33)
        kills = 0
        while kills < KILLS:
            worker = _spawn("work", str(tmp_path), str(LANES), str(RUNS))
            _wait_line(worker, "ready")
            killed = await kill_mid_work(worker, tmp_path / "effects", rng)
            assert worker.stdout is not None
            worker.stdout.close()
            if not killed:
                assert worker.returncode == 0, f"a worker failed ({worker.returncode})"
                break  # everything finished before this kill: nothing left to interrupt
            kills += 1
        assert kills == KILLS, f"the work finished after {kills} kills; make it longer"
        last = _spawn("work", str(tmp_path), str(LANES), str(RUNS))
        assert last.wait(timeout=120) == 0
        assert last.stdout is not None
        last.stdout.close()
        assert (tmp_path / "done").exists()

        thread_ids = [f"lane{lane}-run{run}" for lane in range(LANES) for run in range(RUNS)]
        records = await _threads(tmp_path / "threads.db", thread_ids)
        now = time.time()
        for thread_id, record in records.items():
            messages = decode_messages(record.messages)
            check_pairing(messages, allow_pending=False)
            assert sum(isinstance(m, UserMessage) for m in messages) == 1, thread_id
            assert sum(isinstance(m, ToolResult) for m in messages) == TOOL_CALLS, thread_id
            assert messages[-1].content == f"did {TOOL_CALLS} steps", thread_id
            assert record.checkpoint is None
            assert record.lease is None or record.lease.expires_at <= now, thread_id

        ran = executions(tmp_path / "effects")
        expected = {f"{t}:{k}" for t in thread_ids for k in range(TOOL_CALLS)}
        assert set(ran) == expected
        assert all(1 <= n <= 2 for n in ran.values()), ran
        # only a call in flight at a kill may have run twice: at most one per kill and lane
        assert sum(n - 1 for n in ran.values()) <= kills * LANES


class TestApprovalAcrossAKill:
    """A run waiting for review survives a kill and resumes in its own workflow."""

    async def test_edit_and_reject_after_kill(self, tmp_path: Path) -> None:
        """Killed while paused; a new process sends edit and reject; the run finishes."""
        waiting = _spawn("approve", str(tmp_path))
        assert _wait_line(waiting, "paused") == "paused send1 delete1"
        _kill(waiting)
        assert executions(tmp_path / "effects") == {}

        deciding = _spawn("decide", str(tmp_path))
        line = _wait_line(deciding, "result")
        assert deciding.wait(timeout=60) == 0
        assert deciding.stdout is not None
        deciding.stdout.close()
        assert "send: sent to bob" in line
        assert "delete:" in line
        assert executions(tmp_path / "effects") == {"send:bob": 1}
        records = await _threads(tmp_path / "threads.db", ["review"])
        record = records["review"]
        check_pairing(decode_messages(record.messages), allow_pending=False)
        assert record.checkpoint is None
        now = time.time()
        assert record.lease is None or record.lease.expires_at <= now  # no live lease
        await anyio.lowlevel.checkpoint()


class TestReplayedEvents:
    """Events a recovering workflow re-emits for its recorded steps say replayed=True;
    those of the steps it really runs say False."""

    async def test_recovery_marks_the_replayed_prefix(
        self, tmp_path: Path, launch: Callable[[DBOSConfig], None]
    ) -> None:
        """A run killed after a few tool calls, recovered in this process: the calls it
        hands back from the record are the replayed events, the calls it runs are live."""
        effects = tmp_path / "effects"
        worker = _spawn("work", str(tmp_path), "1", "1")
        _wait_line(worker, "ready")
        for _ in range(12_000):  # a minute at most: the kill falls inside the run
            if line_count(effects) >= 3 or worker.poll() is not None:
                break
            await anyio.sleep(0.005)
        assert worker.poll() is None, "the run ended before the kill"
        _kill(worker)
        before = executions(effects)

        store = SqliteStore(tmp_path / "threads.db")
        agent = work_agent(effects, pause=TOOL_PAUSE)
        engine = DBOSEngine(agent, store, name="crash", lease_ttl=5.0)
        with capture_events(ToolCallFinished) as finished:
            launch(sqlite_config("crash-test", tmp_path / "dbos.sqlite", **VERSION))
            result = await engine.result(workflow_id_for("lane0-run0", "request"))
        await store.aclose()
        assert result.tool_calls == TOOL_CALLS
        after = executions(effects)
        ran_here = {key for key, n in after.items() if n > before.get(key, 0)}
        keys = {event.tool_call_id: f"lane0-run0:{event.tool_call_id[1:]}" for event in finished}
        replayed = {keys[e.tool_call_id] for e in finished if e.replayed}
        live = {keys[e.tool_call_id] for e in finished if not e.replayed}
        assert live == ran_here
        assert replayed == set(after) - ran_here
        assert len(replayed) >= 2  # three calls had run: the first two were recorded
        flags = [e.replayed for e in finished]
        assert flags == sorted(flags, reverse=True)  # a replayed prefix, then live


class TestFencingAStalledExecution:
    """A worker frozen mid-write while it holds the thread: a second execution of the
    workflow takes the thread over and finishes the run; the first, continued, is refused
    by the store (FencedOut on its old lease); nothing is lost or written twice."""

    async def test_stalled_original_is_fenced_out(self, tmp_path: Path) -> None:
        """SIGSTOP inside a write, takeover by a new process, SIGCONT: the old write is
        refused and the thread holds the takeover's run, each tool run once."""
        stalled = _spawn("stall", str(tmp_path))
        line = _wait_line(stalled, "stalled")
        stalled_token = int(line.split()[1])
        try:
            takeover = _spawn("takeover", str(tmp_path))
            result = _wait_line(takeover, "result")
            assert takeover.wait(timeout=120) == 0
            assert takeover.stdout is not None
            takeover.stdout.close()
            assert result == f"result did {TOOL_CALLS} steps"
            written = (await _threads(tmp_path / "threads.db", ["fence"]))["fence"]
        finally:
            stalled.send_signal(signal.SIGCONT)
        # the store refuses the stalled lease: its write or its renewal, whichever the
        # continued worker asks first (DBOS cancels the stalled step as well)
        fenced = _wait_line(stalled, "fenced")
        if fenced.startswith("fenced write"):
            assert fenced.split()[2:] == [str(stalled_token), "None"]
        else:
            assert f"lease token {stalled_token} was fenced out" in fenced, fenced
        _wait_line(stalled, "ended")
        assert stalled.wait(timeout=120) == 0
        assert stalled.stdout is not None
        stalled.stdout.close()

        record = (await _threads(tmp_path / "threads.db", ["fence"]))["fence"]
        assert record.version == written.version  # the refused write changed nothing
        messages = decode_messages(record.messages)
        check_pairing(messages, allow_pending=False)
        assert sum(isinstance(m, UserMessage) for m in messages) == 1
        assert [m.tool_call_id for m in messages if isinstance(m, ToolResult)] == [
            f"w{k}" for k in range(TOOL_CALLS)
        ]
        assert messages[-1].content == f"did {TOOL_CALLS} steps"
        assert executions(tmp_path / "effects") == {f"fence:{k}": 1 for k in range(TOOL_CALLS)}
        now = time.time()  # no live lease is left: any lease on record has expired
        assert record.lease is None or record.lease.expires_at <= now


class TestKilledInsideASubagent:
    """A worker killed inside a sub-agent's run: the restarted worker's DBOS recovers the
    parent's workflow and replays the sub-agent's finished calls from their steps."""

    def test_finished_subagent_calls_run_once(self, tmp_path: Path) -> None:
        """SIGKILL before the sub-agent's second tool call (its first tool call and two
        model calls done), restart: every call of the run ran exactly once."""
        first = _spawn("subagent", str(tmp_path))
        assert first.wait(timeout=120) == -signal.SIGKILL
        assert first.stdout is not None
        first.stdout.close()
        assert executions(tmp_path / "effects") == {
            "parent:model:0": 1,
            "sub:model:0": 1,
            "lookup:k0": 1,
            "sub:model:1": 1,
        }
        second = _spawn("subagent", str(tmp_path))
        assert _wait_line(second, "result") == f"result answer: found {LOOKUPS} facts"
        assert second.wait(timeout=120) == 0
        assert second.stdout is not None
        second.stdout.close()
        assert executions(tmp_path / "effects") == delegation_counts()
